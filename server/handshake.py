"""The server's side of the handshake: the client's hello read and checked (the protocol
version, the device index), the welcome a new or a resumed session gets, and the decoding of
the session's batches set up on its connection.

Below ``server/connection.py``, which sends what these build and makes the session.
"""

from __future__ import annotations

from functools import partial

from protocol import (
    CLIENT_ADAPTER,
    FEATURE_LIMITS,
    FEATURE_NN,
    FEATURE_OPTIM,
    FEATURE_RESUME,
    FEATURE_SEGMENTS,
    PROTOCOL_VERSION,
    Batch,
    ErrorCode,
    ErrorInfo,
    Hello,
    MessageDecoder,
    Welcome,
)

from .config import ServerConfig
from .header_memory import hold_header
from .receiving import STEPWISE_HEADER
from .session import Session
from .wire import WireConnection


async def read_hello(ws: WireConnection, max_header: int) -> tuple[Hello | None, ErrorInfo | None]:
    """The connection's first message: a hello, or the error that refuses it.

    Raises:
        ConnectionClosed: the client left before its hello.
    """
    ws.decode_one(lambda: MessageDecoder(CLIENT_ADAPTER, max_header, max_buffer_bytes=0))
    ws.max_header = max_header
    received = await ws.receive()
    assert received is not None  # no timeout given
    hello = received.message
    if received.error is not None:
        return None, received.error
    if not isinstance(hello, Hello):
        return None, ErrorInfo(
            code=ErrorCode.BAD_MESSAGE, message="the first message must be hello"
        )
    return hello, None


def check_hello(hello: Hello, device_count: int) -> ErrorInfo | None:
    """Why ``hello`` cannot open a session on a server of ``device_count`` devices, or None.
    The token was checked on the upgrade request (``server.guard``)."""
    if hello.protocol != PROTOCOL_VERSION:
        return version_error(hello.protocol)
    if hello.device_index >= device_count:
        return ErrorInfo(
            code=ErrorCode.BAD_DEVICE_INDEX,
            message=(
                f"device index {hello.device_index} does not exist: this server hosts "
                f"{device_count} device(s), indices 0..{device_count - 1}"
            ),
        )
    return None


def version_error(client_version: int) -> ErrorInfo:
    """The refusal of a client that speaks protocol ``client_version``: both versions, and
    which side to upgrade."""
    older = "client" if client_version < PROTOCOL_VERSION else "server"
    return ErrorInfo(
        code=ErrorCode.VERSION_MISMATCH,
        message=(
            f"the client speaks protocol v{client_version}, this server speaks "
            f"v{PROTOCOL_VERSION}: upgrade the {older}"
        ),
    )


def decode_for(ws: WireConnection, session: Session, config: ServerConfig) -> None:
    """Decode what ``ws`` receives from now on as ``session``'s batches: limits checked,
    uploads refused by its quota before they are allocated."""
    ws.max_waiting = config.max_queued  # first: setting decoders parses what waited
    ws.decoders = lambda: MessageDecoder(
        CLIENT_ADAPTER,
        config.max_header_size,
        max_buffer_bytes=config.max_message_size,
        check=lambda m: session.check_upload(m) if isinstance(m, Batch) else None,
        max_buffers=config.max_buffers,
        allocate=session.store.hold_upload,  # counted from allocation (server/budget.py)
        stepwise_over=STEPWISE_HEADER,  # a longer header: validated in slices of the loop
        hold_header=partial(hold_header, session.store),  # its objects counted while it lives
    )


def welcome(
    hello: Hello,
    *,
    device_count: int,
    server_id: str,
    session_id: str,
    secret: str | None,
    window: float,
    received: int = 0,
    max_message_size: int | None = None,
) -> Welcome:
    """The welcome of a session (``received``: a resumed session's client messages so far;
    ``max_message_size``: the server's limit, said to a client that speaks ``limits``)."""
    return Welcome(
        protocol=PROTOCOL_VERSION,
        device_index=hello.device_index,
        device_count=device_count,
        server_id=server_id,
        session_id=session_id,
        features=[
            FEATURE_NN,
            FEATURE_OPTIM,
            FEATURE_SEGMENTS,
            FEATURE_LIMITS,
            *([FEATURE_RESUME] if secret is not None else []),
        ],
        resume_secret=secret,
        resume_window=window if secret is not None else 0.0,
        resumed=hello.resume is not None,
        received=received,
        max_message_size=max_message_size if FEATURE_LIMITS in hello.features else None,
    )


__all__ = ["check_hello", "decode_for", "read_hello", "version_error", "welcome"]
