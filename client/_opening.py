"""Opening a session: the websocket upgrade (token, TLS) and the hello/welcome handshake, with
the server's refusals, and the reason in its close frame, as typed errors.

Below ``client._connection``, which calls it when a session opens and when one ends.
"""

from __future__ import annotations

import ssl
from collections.abc import Callable
from typing import Any

from pydantic import ValidationError
from websockets.exceptions import InvalidStatus

from protocol import (
    PROTOCOL_VERSION,
    DecodeError,
    ErrorCode,
    ErrorInfo,
    Hello,
    Refused,
    RemoteSpec,
    Welcome,
    encode,
    parse_device_spec,
)
from protocol.codec import Buffer, to_frames

from ._options import ConnectionOptions
from ._transport import Closed, InvalidHandshake, InvalidURI, Transport
from .errors import ConnectionLost, HandshakeError, handshake_error

MAX_MESSAGE = 2**31


def url_of(target: str) -> str:
    """A websocket URL from a URL or a device spec (``remote:ws://HOST:PORT``).

    Raises:
        ValueError: the spec names a device a client cannot connect to (ndarray, capture).
    """
    if target.startswith(("ws://", "wss://")):
        return target
    spec = parse_device_spec(target)
    if not isinstance(spec, RemoteSpec):
        raise ValueError(
            f"a RemoteDevice connects to a server: give ws://HOST:PORT or remote:ws://HOST:PORT, "
            f"not {target!r}"
        )
    return spec.url


def open_transport(url: str, options: ConnectionOptions) -> Transport:
    """The websocket to ``url`` within ``options.open_timeout``, upgraded with ``options.token``
    as ``Authorization: Bearer TOKEN``; for ``wss://`` the certificate is verified against
    ``options.ca_file`` or the system's CAs.

    Raises:
        HandshakeError: (a subclass of) the server refused the upgrade with a typed error.
        ConnectionLost: the server cannot be reached, TLS verification failed, or the upgrade
            broke.
    """
    token = options.token
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    try:
        tls = _tls(url, options.ca_file)
        return Transport(url, options.open_timeout, MAX_MESSAGE, headers, tls)
    except InvalidStatus as exc:
        refused = _refusal(exc)
        if refused is not None:
            raise refused from None
        raise ConnectionLost(f"cannot connect to {url}: {exc}") from exc
    except (OSError, InvalidHandshake, InvalidURI, TimeoutError) as exc:
        raise ConnectionLost(f"cannot connect to {url}: {exc}") from exc


def handshake(
    ws: Transport, url: str, index: int, receive: Callable[[], tuple[Any, list[Buffer]]]
) -> Welcome:
    """Ask for device ``index`` with a hello and return the server's welcome; ``receive``
    reads one message from ``ws``.

    Raises:
        HandshakeError: (a subclass of) the server refused the session (a ``Refused`` reply).
        ConnectionLost: the connection broke, or the server answered something else.
    """
    try:
        hello = Hello(protocol=PROTOCOL_VERSION, device_index=index)
        with ws.send_lock:
            ws.send(to_frames(encode(hello)))
        reply, _ = receive()
    except (Closed, DecodeError) as exc:
        raise ConnectionLost(f"handshake with {url} failed: {exc}") from exc
    if isinstance(reply, Refused):
        raise handshake_error(reply.error)
    if not isinstance(reply, Welcome):
        raise ConnectionLost(f"handshake with {url} failed: unexpected {reply.type}")
    return reply


def close_code(transport: Transport) -> ErrorCode | None:
    """The ErrorCode a server put at the start of its close reason (or 1009: too big)."""
    received = transport.close_received
    if received is None:
        return None
    code, reason = received
    if code == 1009:
        return ErrorCode.LIMIT_EXCEEDED
    try:
        return ErrorCode(reason.partition(":")[0])
    except ValueError:
        return None


def _refusal(exc: InvalidStatus) -> HandshakeError | None:
    """The typed error in an HTTP refusal of the upgrade (a JSON ErrorInfo body), if any."""
    response = exc.response
    try:
        info = ErrorInfo.model_validate_json(response.body or b"")
    except ValidationError:
        if response.status_code != 401:
            return None
        info = ErrorInfo(code=ErrorCode.AUTH_FAILED, message="the server refused the token")
    return handshake_error(info)


def _tls(url: str, ca_file: str | None) -> ssl.SSLContext | None:
    """Certificates are verified for ``wss://``, against ``ca_file`` or the system's CAs."""
    if not url.startswith("wss://"):
        return None
    return ssl.create_default_context(cafile=ca_file)
