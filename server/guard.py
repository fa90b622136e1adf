"""The gate in front of every session: checks made on the HTTP upgrade request, and TLS. It
holds no session state: it runs before any session exists.

Everything here runs during the websocket opening handshake, before the connection is
upgraded and before any session exists (protocol/README.md, "Upgrade"). A refusal is an
HTTP response whose body is one JSON :class:`~protocol.ErrorInfo`, so a client can raise a
typed error instead of guessing from a status code:

- a browser ``Origin`` header that is not allowed: 403 ``origin_refused``;
- a missing or wrong ``Authorization: Bearer TOKEN``: 401 ``auth_failed`` (compared in
  constant time with :func:`hmac.compare_digest`);
- the connection limit reached: 503 ``too_many_connections``.
"""

from __future__ import annotations

import hmac
import http
import ssl
from collections.abc import Callable

from websockets.asyncio.server import ServerConnection
from websockets.http11 import Request, Response

from protocol import ErrorCode, ErrorInfo

from .config import InsecureConfigError, ServerConfig


def refusal(
    connection: ServerConnection, status: http.HTTPStatus, code: ErrorCode, message: str
) -> Response:
    """An HTTP refusal whose body is the JSON of ``ErrorInfo(code, message)``."""
    body = ErrorInfo(code=code, message=message).model_dump_json()
    response = connection.respond(status, body)
    response.headers["Content-Type"] = "application/json"
    if status is http.HTTPStatus.UNAUTHORIZED:
        response.headers["WWW-Authenticate"] = 'Bearer realm="tensorwire"'
    return response


def token_matches(request: Request, expected: str) -> bool:
    """True when the request carries ``Authorization: Bearer <expected>``, compared in constant
    time. The one token check of the server (the upgrade and ``GET /metrics`` use it)."""
    scheme, _, presented = request.headers.get("Authorization", "").partition(" ")
    matches = hmac.compare_digest(presented.strip().encode(), expected.encode())
    return scheme.lower() == "bearer" and matches


class Gate:
    """The upgrade checks, in order: origin, token, connection count. Called from the server's
    ``process_request`` hook; returns None to go on, or ``(limit, response)``: the
    ``refusals_total`` label and the refusal to send.

    ``open_connections`` returns how many connections are already upgraded and open.
    """

    def __init__(self, config: ServerConfig, open_connections: Callable[[], int]) -> None:
        self._config = config
        self._open_connections = open_connections

    def __call__(
        self, connection: ServerConnection, request: Request
    ) -> tuple[str, Response] | None:
        config = self._config
        origin = request.headers.get("Origin")
        if origin is not None and origin not in config.allowed_origins:
            return "origin", refusal(
                connection,
                http.HTTPStatus.FORBIDDEN,
                ErrorCode.ORIGIN_REFUSED,
                f"Origin {origin!r} is not allowed; start the server with "
                f"--allowed-origins {origin}",
            )
        if config.token is not None and not token_matches(request, config.token):
            return "auth", refusal(
                connection,
                http.HTTPStatus.UNAUTHORIZED,
                ErrorCode.AUTH_FAILED,
                "missing or wrong token: pass RemoteDevice(url, token=...) or set "
                "TENSOR_SERVER_TOKEN",
            )
        if self._open_connections() >= config.max_connections:
            return "connections", refusal(
                connection,
                http.HTTPStatus.SERVICE_UNAVAILABLE,
                ErrorCode.TOO_MANY_CONNECTIONS,
                f"the server holds its limit of {config.max_connections} connections; "
                "try again later",
            )
        return None


def tls_context(config: ServerConfig) -> ssl.SSLContext | None:
    """The server's TLS context, or None without ``tls_cert``. Call before binding.

    Raises:
        InsecureConfigError: a certificate or key file that cannot be loaded (one line).
    """
    if config.tls_cert is None or config.tls_key is None:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(config.tls_cert, config.tls_key)
    except (OSError, ssl.SSLError) as exc:
        raise InsecureConfigError(
            f"cannot load --tls-cert {config.tls_cert} / --tls-key {config.tls_key}: {exc}"
        ) from None
    return context
