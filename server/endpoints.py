"""Plain HTTP answers on the websocket port: ``GET /healthz`` and ``GET /metrics``.

It only builds ``websockets.http11.Response`` objects; the listener sends them in answer to a
request instead of upgrading it (``server/listener.py``).

``/healthz`` needs no token (container health checks and load balancers call it) and says only
whether the server takes new sessions::

    200 {"status": "serving", "protocol": 2, "device": "ndarray", "version": "0.1.0"}
    503 {"status": "draining", "protocol": 2, "device": "ndarray", "version": "0.1.0"}

(``version``: the package's, which ``tensorwire ping`` shows.)

``/metrics`` is the Prometheus text format of :mod:`server.metrics`. With ``--metrics-auth
token`` (the default) and a server token, it needs ``Authorization: Bearer TOKEN`` (401
otherwise). Neither endpoint reveals tensor data.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from http import HTTPStatus

from websockets.http11 import Request, Response

from protocol import PROTOCOL_VERSION, __version__

from .guard import token_matches
from .metrics import CONTENT_TYPE, Metrics
from .responses import respond

HEALTH_PATH = "/healthz"
METRICS_PATH = "/metrics"


def path_of(request: Request) -> str:
    """The request's path without its query string."""
    return request.path.partition("?")[0]


def health(draining: bool, device: str) -> Response:
    """200 while the server takes sessions, 503 once it drains."""
    status = "draining" if draining else "serving"
    body = json.dumps(
        {"status": status, "protocol": PROTOCOL_VERSION, "device": device, "version": __version__}
    )
    code = HTTPStatus.SERVICE_UNAVAILABLE if draining else HTTPStatus.OK
    return respond(code, body.encode() + b"\n", "application/json")


def _authorized(request: Request, token: str) -> bool:
    return token_matches(request, token)  # the server's one token check (server.guard)


def metrics(request: Request, registry: Metrics, token: str | None, auth: str) -> Response:
    """The exposition, or 401 when ``auth == "token"``, a token is set and the request lacks it."""
    if auth == "token" and token is not None and not _authorized(request, token):
        body = b"GET /metrics needs 'Authorization: Bearer TOKEN'\n"
        return respond(401, body, "text/plain; charset=utf-8", WWW_Authenticate="Bearer")
    return respond(200, registry.exposition(), CONTENT_TYPE)


@dataclass(frozen=True)
class Endpoints:
    """What the HTTP answers need from the server."""

    device: str
    registry: Metrics
    token: str | None
    auth: str

    def answer(self, request: Request, *, draining: bool, with_metrics: bool) -> Response | None:
        """The answer to ``/healthz`` (and ``/metrics`` when ``with_metrics``), else None."""
        path = path_of(request)
        if path == HEALTH_PATH:
            return health(draining, self.device)
        if path == METRICS_PATH and with_metrics:
            return metrics(request, self.registry, self.token, self.auth)
        return None
