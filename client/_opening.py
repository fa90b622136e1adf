"""Opening a session: the websocket upgrade (token, TLS) and the hello/welcome handshake, with
the server's refusals, and the reason in its close frame, as typed errors.

Below ``client._connection``, which calls it when a session opens and when one ends.
"""

from __future__ import annotations

import ssl
import time
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from typing import Any

from pydantic import ValidationError
from websockets.exceptions import InvalidStatus

from protocol import (
    FEATURES,
    PROTOCOL_VERSION,
    DecodeError,
    ErrorCode,
    ErrorInfo,
    Hello,
    Refused,
    RemoteSpec,
    Resume,
    Welcome,
    encode,
    parse_device_spec,
)
from protocol.codec import Buffer, to_frames

from ._options import ConnectionOptions
from ._transport import Closed, InvalidHandshake, InvalidURI, Transport
from .errors import (
    ConnectionLost,
    HandshakeError,
    ServerBusyError,
    ServerNotResponding,
    SessionLost,
    SessionLostReason,
    VersionMismatchError,
    handshake_error,
)

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
    ws: Transport,
    url: str,
    index: int,
    receive: Callable[[], tuple[Any, list[Buffer]]],
    resume: Resume | None = None,
    server_id: str | None = None,
    features: tuple[str, ...] = FEATURES,
) -> Welcome:
    """Ask for device ``index`` with a hello (taking up the session ``resume`` names, if
    given, which server ``server_id`` opened) and return the server's welcome; ``receive``
    reads one message from ``ws``. ``features`` are those the client announces (without
    ``resume``, the server does not keep the session when its connection is lost).

    Raises:
        VersionMismatchError: the server speaks another protocol version (both are named).
        SessionLost: the server refused to resume the session.
        HandshakeError: (a subclass of) the server refused the session (a ``Refused`` reply).
        ConnectionLost: the connection broke, or the server answered something else.
    """
    try:
        hello = Hello(
            protocol=PROTOCOL_VERSION, device_index=index, features=list(features), resume=resume
        )
        with ws.send_lock:
            ws.send(to_frames(encode(hello)))
        reply, _ = receive()
    except (Closed, DecodeError) as exc:
        raise ConnectionLost(f"handshake with {url} failed: {exc}") from exc
    if isinstance(reply, Refused | Welcome) and reply.protocol != PROTOCOL_VERSION:
        raise _version_mismatch(url, reply.protocol)
    if isinstance(reply, Refused):
        error = reply.error
        if reply.server_id != server_id and error.code is ErrorCode.SESSION_UNKNOWN:
            restarted = f"the server at {url} restarted (server_id {server_id} is now "
            raise SessionLost(f"{restarted}{reply.server_id})", "server_restarted", error.code)
        if error.code in _SESSION_LOST:
            message = f"cannot resume the session on {url}: {error.message}"
            raise SessionLost(message, _SESSION_LOST[error.code], error.code)
        raise handshake_error(error)
    if not isinstance(reply, Welcome):
        raise ConnectionLost(f"handshake with {url} failed: unexpected {reply.type}")
    return reply


def reopen(
    url: str,
    index: int,
    options: ConnectionOptions,
    welcome: Welcome,
    received: int,
    receive: Callable[[Transport], tuple[Any, list[Buffer]]],
    cause: BaseException,
) -> tuple[Transport, Welcome]:
    """A new connection to ``url`` that resumes the session ``welcome`` opened, whose client
    has received ``received`` numbered messages; tried as ``options.backoff`` says, after the
    last connection broke with ``cause``. After a server that stopped answering (``cause`` is
    a :class:`ServerNotResponding`), trying again is bounded by ``options.ping_timeout`` as
    well, so that such a server is given up on within twice its liveness bound.

    Raises:
        SessionLost: the session cannot be resumed (the reason says why); for a server that
            stopped answering (``cause``), a :class:`ServerNotResponding`.
        HandshakeError: the server refused the connection for another reason (its token).
    """
    assert welcome.resume_secret is not None
    backoff = options.backoff
    resume = Resume(session_id=welcome.session_id, secret=welcome.resume_secret, received=received)
    within = min(backoff.timeout, welcome.resume_window)
    if isinstance(cause, ServerNotResponding) and options.ping_timeout is not None:
        within = min(within, options.ping_timeout)
    deadline = time.monotonic() + within
    last: BaseException = cause
    for delay in backoff.delays():
        left = deadline - time.monotonic() - delay
        if left <= 0:
            break
        time.sleep(delay)
        attempt = replace(options, open_timeout=min(options.open_timeout, left))
        ws: Transport | None = None
        try:
            ws = open_transport(url, attempt)
            reply = handshake(ws, url, index, partial(receive, ws), resume, welcome.server_id)
        except (ConnectionLost, ServerBusyError) as exc:  # not there yet, or busy: again
            if ws is not None:
                ws.close()
            if isinstance(exc, SessionLost):
                raise
            last = exc
            continue
        except BaseException:
            if ws is not None:
                ws.close()
            raise
        ws.opened()
        return ws, reply
    why = f"no connection resumed the session within {backoff.attempts} attempts and "
    why += f"{within:g} s (last: {last})"
    if isinstance(cause, ServerNotResponding):
        raise ServerNotResponding(f"{cause.detail}; {why}") from cause
    raise SessionLost(f"connection to {url} lost ({cause}); {why}", "unreachable") from cause


def _version_mismatch(url: str, server_version: int) -> VersionMismatchError:
    older = "server" if server_version < PROTOCOL_VERSION else "client"
    message = (
        f"the server at {url} speaks protocol v{server_version}, this client speaks "
        f"v{PROTOCOL_VERSION}: upgrade the {older}"
    )
    return VersionMismatchError(ErrorInfo(code=ErrorCode.VERSION_MISMATCH, message=message))


_SESSION_LOST: dict[ErrorCode, SessionLostReason] = {
    ErrorCode.SESSION_EXPIRED: "expired",
    ErrorCode.SESSION_DROPPED: "dropped",
    ErrorCode.SESSION_UNKNOWN: "unknown",
}


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
