"""Listening for websocket connections: the TCP (or TLS) listener, each upgrade answered, each
upgraded connection's handler run in a task of its own, and closing them all.

websockets' sans-I/O protocol parses each upgrade request (``server/websocket.py``); the
listener decides the answer the moment the request is whole: ``process_request`` (health,
metrics, the gate's refusals) may answer it with a response of its own, else the protocol
accepts it (101). The handler of an accepted connection then runs until it returns, and the
connection is closed after it (1000; 1011 when the handler raised). Closing the listener stops
accepting, answers upgrades 503, closes every open connection (1001) and waits for the
handlers.
"""

from __future__ import annotations

import asyncio
import http
import logging
import ssl
from collections.abc import Awaitable, Callable

from websockets.http11 import Request, Response

from .websocket import Upgrades, WebSocket, WebSocketSettings

log = logging.getLogger("tensorwire.server")

ProcessRequest = Callable[[WebSocket, Request], Response | None]
Handler = Callable[[WebSocket], Awaitable[None]]
MakeConnection = Callable[[WebSocketSettings, Upgrades], WebSocket]


class Listener:
    """Serves websocket connections on one address once :meth:`start` has bound it.

    ``make_connection`` builds each connection (the wire's class); ``process_request`` may
    answer an upgrade request itself (a Response) or let it through (None); ``handler`` serves
    an upgraded connection until it returns.
    """

    def __init__(
        self,
        handler: Handler,
        process_request: ProcessRequest,
        settings: WebSocketSettings,
        make_connection: MakeConnection,
    ) -> None:
        self._handler = handler
        self._process_request = process_request
        self._settings = settings
        self._make_connection = make_connection
        self._upgrades = Upgrades(self._made, self._answer, self._opened)
        self._server: asyncio.Server | None = None
        self._connections: set[WebSocket] = set()  # from connection_made until it is lost
        self._handlers: set[asyncio.Task[None]] = set()
        self.serving = False

    async def start(self, host: str, port: int, tls: ssl.SSLContext | None) -> None:
        """Bind and start accepting connections.

        Raises:
            OSError: the address cannot be bound.
        """
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            self._connection,
            host,
            port,
            ssl=tls,
            ssl_handshake_timeout=self._settings.open_timeout if tls else None,
        )
        self.serving = True

    @property
    def port(self) -> int:
        """The bound port (the first socket's: every socket of one listener has the same)."""
        assert self._server is not None, "not started"
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    def _connection(self) -> WebSocket:
        return self._make_connection(self._settings, self._upgrades)

    def _made(self, ws: WebSocket) -> None:
        """Keep ``ws`` until it is lost. Not from the protocol factory: asyncio makes the
        protocol before a TLS handshake, and one that fails never tells it it was made or
        lost, so it would have been kept for good."""
        self._connections.add(ws)
        ws.lost.add_done_callback(lambda _: self._connections.discard(ws))

    def _answer(self, ws: WebSocket, request: Request) -> Response:
        response = self._process_request(ws, request)
        if response is None:
            response = ws.protocol.accept(request)
        if response.status_code == http.HTTPStatus.SWITCHING_PROTOCOLS and not self.serving:
            response = ws.protocol.reject(http.HTTPStatus.SERVICE_UNAVAILABLE, "shutting down\n")
        return response

    def _opened(self, ws: WebSocket) -> None:
        task = asyncio.get_running_loop().create_task(self._run(ws))
        self._handlers.add(task)
        task.add_done_callback(self._handlers.discard)

    async def _run(self, ws: WebSocket) -> None:
        """Serve one upgraded connection, then close it, whatever the handler did."""
        code = 1000
        try:
            await self._handler(ws)
        except Exception:
            code = 1011
            log.exception("connection handler failed")
        finally:
            await ws.close(code)

    async def close(self, code: int = 1001, reason: str = "") -> None:
        """Stop accepting; close every open connection (``code``) and cut those still
        upgrading; return once every handler has returned."""
        self.serving = False
        if self._server is not None:
            self._server.close()
        closes = []
        for ws in list(self._connections):
            if ws.upgrading:
                ws.abort()
            else:
                closes.append(ws.close(code, reason))
        if closes:
            await asyncio.gather(*closes)
        if self._handlers:
            await asyncio.wait(set(self._handlers))

    def abort_all(self) -> None:
        """Cut every connection at once (what a close could not end in time)."""
        for ws in list(self._connections):
            ws.abort()


__all__ = ["Handler", "Listener", "MakeConnection", "ProcessRequest"]
