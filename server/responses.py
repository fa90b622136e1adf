"""Complete HTTP responses, for requests on the websocket port that are answered without an
upgrade: ``/healthz``, ``/metrics`` and the refusals of the upgrade checks. The connection
closes after each."""

from __future__ import annotations

from http import HTTPStatus

from websockets.datastructures import Headers
from websockets.http11 import Response


def respond(status: int, body: bytes, content_type: str, **extra: str) -> Response:
    """A complete HTTP response; ``extra`` headers by name, ``_`` read as ``-``."""
    headers = Headers(
        [
            ("Content-Type", content_type),
            ("Content-Length", str(len(body))),
            ("Cache-Control", "no-store"),
            ("Connection", "close"),
            *((name.replace("_", "-"), value) for name, value in extra.items()),
        ]
    )
    return Response(status, HTTPStatus(status).phrase, headers, body)


def plain(status: int, text: str) -> Response:
    """A short text answer (404 on the metrics port, 503 to upgrades while draining)."""
    return respond(status, text.encode() + b"\n", "text/plain; charset=utf-8")


__all__ = ["plain", "respond"]
