"""The gate in front of every session: checks made on the HTTP upgrade request, and TLS. It
holds no session state: it runs before any session exists.

Everything here runs during the websocket opening handshake, before the connection is
upgraded and before any session exists (protocol/README.md, "Upgrade"). A refusal is an
HTTP response whose body is one JSON :class:`~protocol.ErrorInfo`, so a client can raise a
typed error instead of guessing from a status code:

- a browser ``Origin`` header that is not allowed, or more than one: 403 ``origin_refused``;
- a missing, wrong or repeated ``Authorization: Bearer TOKEN``: 401 ``auth_failed`` (compared
  in constant time with :func:`hmac.compare_digest`);
- the connection limit reached: 503 ``too_many_connections``;
- the server draining (``server.app``): 503 ``shutting_down``.

A header sent twice is refused, never an error: two values could disagree, and which one a
proxy in front checked is unknown.
"""

from __future__ import annotations

import hashlib
import hmac
import http
import ssl
from collections.abc import Callable

from websockets.http11 import Request, Response

from protocol import ErrorCode, ErrorInfo

from .config import InsecureConfigError, ServerConfig
from .responses import respond


def refusal(status: http.HTTPStatus, code: ErrorCode, message: str) -> Response:
    """An HTTP refusal whose body is the JSON of ``ErrorInfo(code, message)``."""
    body = ErrorInfo(code=code, message=message).model_dump_json().encode()
    if status is http.HTTPStatus.UNAUTHORIZED:
        return respond(
            status, body, "application/json", WWW_Authenticate='Bearer realm="tensorwire"'
        )
    return respond(status, body, "application/json")


def token_matches(request: Request, expected: str) -> bool:
    """True when the request carries one ``Authorization: Bearer <expected>`` header, compared
    in constant time; never for an empty ``expected`` (the settings refuse one). The one token
    check of the server (the upgrade and ``GET /metrics`` use it)."""
    values = request.headers.get_all("Authorization")
    scheme, _, presented = (values[0] if len(values) == 1 else "").partition(" ")
    matches = hmac.compare_digest(presented.strip().encode(), expected.encode())
    return scheme.lower() == "bearer" and matches and bool(expected)


def client_of(request: Request) -> str:
    """Who an accepted upgrade is, for the limits on detached sessions: a digest of the bearer
    token it presented (its headers, joined; empty without one). Not a secret (a digest of
    one): it may be compared, but is never logged."""
    values = request.headers.get_all("Authorization")
    return hashlib.sha256("\n".join(values).encode()).hexdigest() if values else ""


class Gate:
    """The upgrade checks, in order: origin, token, connection count. Called by the listener
    on each upgrade request; returns None to go on, or ``(limit, response)``: the
    ``refusals_total`` label and the refusal to send.

    ``open_connections`` returns how many connections are already upgraded and open.
    """

    def __init__(self, config: ServerConfig, open_connections: Callable[[], int]) -> None:
        self._config = config
        self._open_connections = open_connections

    def __call__(self, request: Request) -> tuple[str, Response] | None:
        config = self._config
        origins = request.headers.get_all("Origin")
        if len(origins) > 1:
            return "origin", refusal(
                http.HTTPStatus.FORBIDDEN,
                ErrorCode.ORIGIN_REFUSED,
                f"{len(origins)} Origin headers; a request may carry one",
            )
        if origins and origins[0] not in config.allowed_origins:
            return "origin", refusal(
                http.HTTPStatus.FORBIDDEN,
                ErrorCode.ORIGIN_REFUSED,
                f"Origin {origins[0]!r} is not allowed; start the server with "
                f"--allowed-origins {origins[0]}",
            )
        if config.token is not None and not token_matches(request, config.token):
            return "auth", refusal(
                http.HTTPStatus.UNAUTHORIZED,
                ErrorCode.AUTH_FAILED,
                "missing, wrong or repeated token: pass RemoteDevice(url, token=...) or set "
                "TENSORWIRE_TOKEN, TENSORWIRE_TOKEN_FILE or TENSOR_SERVER_TOKEN (one "
                "Authorization header)",
            )
        if self._open_connections() >= config.max_connections:
            return "connections", refusal(
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
