"""The server: the listeners, plain HTTP answers, drain and shutdown.

The top of the server's layering: it builds every other part and hands each upgraded
connection to :class:`server.connection.Connections`, which runs its handshake and session.

The transport (ARCHITECTURE.md, "The wire"): asyncio's event loop, run under anyio's asyncio
backend, with websockets' sans-I/O protocol for the upgrade and the control frames
(``server/websocket.py``) and the wire's own framing for data frames, so that payloads are
received straight into their arrays and sent from them (``server/wire.py``,
``server/sending.py``). Everything the server does beyond the socket (task groups, worker
threads, capacity limits, cancellation) is anyio.

Plain HTTP requests on the same port get ``/healthz`` and ``/metrics`` (``server.endpoints``)
instead of an upgrade (``server/listener.py``). Drain (``Server.drain``, on SIGTERM): upgrades
get 503 ``shutting_down`` (a JSON error, as the gate's refusals), each session keeps a count of
messages received but not yet answered and is closed (1001, ``shutting_down: ...``) when that
count is zero; past the grace, the rest are closed: a session whose op was running in a worker
thread with the code ``shutting_down`` too, one that does not read by cutting its connection.

Guards (docs/security.md): the Origin, the token and the connection count are checked on the
HTTP upgrade by :class:`server.guard.Gate`, before a session exists; the guards of a live
session (sizes, quota, deadline, send and idle timeouts) are ``server.connection``'s.
"""

from __future__ import annotations

import http
import logging
import secrets

import anyio
import anyio.abc
from websockets.http11 import Request, Response

from protocol import ErrorCode

from . import endpoints
from .allocator import give_back_freed_memory, keep_freed_memory, resident_bytes
from .budget import MemoryBudget
from .config import ServerConfig, validate_host_device, validate_security
from .connection import Connections
from .errors import GOING_AWAY
from .exposures import Exposures
from .guard import Gate, client_of, refusal, tls_context
from .listener import Listener
from .logs import fields
from .metrics import Metrics
from .peers import PeerFetcher
from .pulls import Transfers
from .responses import plain
from .session import Session
from .websocket import WebSocket, WebSocketSettings
from .wire import WireConnection
from .workers import Workers

log = logging.getLogger("tensorwire.server")

CLOSE_AFTER_DRAIN = 2.0  # seconds for close handshakes once a drain has run its grace
PEERS_CLOSE = 1.0  # seconds to close the sessions with peer servers (server/peers.py)
TRIM_EVERY = 1.0  # seconds between looks at the resident memory while busy


class Server:
    """A Tensorwire server. Construction validates the hosted device; nothing binds until
    :meth:`serve` runs.

    Raises:
        UnsupportedDeviceError: from the constructor, for a remote or capture device.
    """

    def __init__(self, config: ServerConfig) -> None:
        self.device = validate_host_device(config.device)
        self.warnings = validate_security(config)
        self.config = config
        self.server_id = secrets.token_hex(8)
        self.port: int | None = None
        self.metrics_port: int | None = None
        self.draining = False
        self._workers = Workers(config.worker_threads, config.op_deadline)
        self._peers = PeerFetcher(config)  # its sessions with peer servers, for pulls
        self._exposures = Exposures(config.transfer_ttl)  # open transfer capabilities
        self.budget = MemoryBudget(
            config.effective_memory_budget, config.spare_memory, spare_ttl=config.spare_ttl
        )
        keep_freed_memory()  # op results reuse freed results' pages (given back when idle)
        self._ssl = tls_context(config)
        self.metrics = Metrics(
            lambda: [live.session for live in self._live.values()],
            lambda: sum(live.in_flight for live in self._live.values()),
            lambda: self.draining,
            config.effective_memory_budget,
            lambda: self.budget.spare_bytes,
        )
        self._connections = Connections(
            config,
            self.device.count,
            Transfers(self._exposures, self.server_id, self._peers),
            self.budget,
            self._workers,
            self.metrics,
            lambda: self.draining,
        )
        self._live = self._connections.live  # by session id: one record per live session
        self._gate = Gate(config, lambda: self._connections.open)
        self._endpoints = endpoints.Endpoints(
            str(self.device), self.metrics, config.token, config.metrics_auth
        )

    @property
    def sessions(self) -> dict[str, Session]:
        """The open sessions, by session id (a snapshot)."""
        return {sid: live.session for sid, live in self._live.items()}

    @property
    def scheme(self) -> str:
        return "ws" if self._ssl is None else "wss"

    async def serve(
        self, *, task_status: anyio.abc.TaskStatus[int] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Bind, report the bound port through ``task_status``, and serve until cancelled;
        then close every session (close code 1001) within the shutdown grace period.
        """
        config = self.config
        settings = WebSocketSettings(
            max_message_size=config.max_message_size,
            write_limit=config.write_limit,
            open_timeout=config.handshake_timeout,
            ping_interval=config.ping_interval,
            ping_timeout=config.ping_timeout,
        )
        listener = Listener(self._connections.handle, self._http, settings, WireConnection)
        await listener.start(config.host, config.port, self._ssl)
        listeners = [listener]
        try:
            if config.metrics_port is not None:
                listeners.append(await self._serve_metrics(settings))
            self.port = listener.port
            log.info(
                "listening",
                extra=fields(
                    host=config.host,
                    port=self.port,
                    metrics_port=self.metrics_port or self.port,
                    device=str(self.device),
                    server_id=self.server_id,
                ),
            )
            async with anyio.create_task_group() as tasks:  # worker threads outlive sessions
                self._workers.serve_in(tasks)
                tasks.start_soon(self._trim_spare)
                tasks.start_soon(self._bound_freed_memory, resident_bytes())
                task_status.started(self.port)
                await anyio.sleep_forever()
        finally:
            with anyio.CancelScope(shield=True):
                await self._close(listeners)

    async def _trim_spare(self) -> None:
        """Drop spare memory (freed uploads kept for uploads) once it is ``spare_ttl`` old, and
        give malloc's freed memory back to the kernel once no op has run for as long; drop
        expired transfer capabilities (a few seconds late at most)."""
        seen, idle_for = self.budget.reservations, 0.0
        while True:
            await anyio.sleep(self.budget.spare_ttl / 2)
            self.budget.trim_spare()
            self._exposures.expire()  # their bytes back when their time is up, claimed or not
            if self.budget.reservations != seen:
                seen, idle_for = self.budget.reservations, 0.0
            elif idle_for < self.budget.spare_ttl:
                idle_for += self.budget.spare_ttl / 2
                if idle_for >= self.budget.spare_ttl:
                    await anyio.to_thread.run_sync(give_back_freed_memory)  # ms for GiBs

    async def _bound_freed_memory(self, at_rest: int) -> None:
        """Give malloc's freed memory back while the server is busy, once the process holds
        more than ``at_rest`` (its memory before any session), what the budget counts, and
        half the budget (``server/allocator.py``): at most once a :data:`TRIM_EVERY`."""
        while True:
            await anyio.sleep(TRIM_EVERY)
            budget = self.budget
            counted = budget.used + budget.overhead + budget.spare_bytes
            if resident_bytes() > at_rest + counted + budget.limit // 2:
                await anyio.to_thread.run_sync(give_back_freed_memory)

    async def _close(self, listeners: list[Listener]) -> None:
        """Close every session (1001) and listener; after a drain, or past the shutdown grace,
        abort the connections still open (a client that does not read cannot hold us)."""
        bound = CLOSE_AFTER_DRAIN if self.draining else self.config.shutdown_grace
        with anyio.move_on_after(bound):
            async with anyio.create_task_group() as tg:
                for each in listeners:
                    tg.start_soon(each.close)
        for each in listeners:
            each.abort_all()
        with anyio.move_on_after(PEERS_CLOSE):  # a peer that does not answer is left behind
            await anyio.to_thread.run_sync(self._peers.close, abandon_on_cancel=True)

    async def _serve_metrics(self, settings: WebSocketSettings) -> Listener:
        """The ``--metrics-port`` listener: HTTP only, never a websocket."""

        async def no_sessions(ws: WebSocket) -> None:  # unreachable: _http_metrics answers
            await ws.close(1008, "this port serves /metrics only")

        metrics = Listener(no_sessions, self._http_metrics, settings, WireConnection)
        await metrics.start(self.config.host, self.config.metrics_port or 0, None)
        self.metrics_port = metrics.port
        return metrics

    def _http(self, ws: WebSocket, request: Request) -> Response | None:
        """Answer ``/healthz`` and ``/metrics``; refuse upgrades while draining; else None (go
        on with the websocket handshake)."""
        with_metrics = self.config.metrics_port is None
        answer = self._endpoints.answer(request, draining=self.draining, with_metrics=with_metrics)
        if answer is None and self.draining:  # a refusal like the gate's: the client types it
            self._connections.refused("draining", ws, "server is shutting down")
            return refusal(
                http.HTTPStatus.SERVICE_UNAVAILABLE,
                ErrorCode.SHUTTING_DOWN,
                "the server is shutting down: it takes no new session; connect to another "
                "server, or retry once it is back",
            )
        if answer is None and (refused := self._gate(request)) is not None:
            limit, response = refused
            self._connections.refused(limit, ws, response.body.decode(errors="replace"))
            return response
        ws.client = client_of(request)
        return answer

    def _http_metrics(self, ws: WebSocket, request: Request) -> Response:
        answer = self._endpoints.answer(request, draining=self.draining, with_metrics=True)
        return answer or plain(404, "this port serves GET /metrics and /healthz only")

    async def drain(self) -> None:
        """Stop taking sessions (``/healthz`` answers 503, upgrades get 503), let each session
        finish the messages it has received, close it (1001) as soon as it has none, and return
        when every session is closed or ``shutdown_grace`` has passed. Then cancel :meth:`serve`.
        """
        self.draining = True
        grace = self.config.shutdown_grace
        log.info("draining", extra=fields(sessions=len(self._live), grace_s=grace))
        reason = "signal"  # unless the grace runs out first: cancelled from outside
        try:
            with anyio.move_on_after(grace) as scope:
                async with anyio.create_task_group() as tg:
                    for live in list(self._live.values()):
                        if live.idle():
                            tg.start_soon(live.ws.close, 1001, GOING_AWAY)
                await self._connections.all_closed()
            reason = "grace" if scope.cancelled_caught else reason
        finally:
            if left := len(self._live):
                log.info("drain cut short", extra=fields(sessions_left=left, reason=reason))
            else:
                log.info("drained")


async def serve(
    config: ServerConfig, *, task_status: anyio.abc.TaskStatus[int] = anyio.TASK_STATUS_IGNORED
) -> None:
    """Validate ``config``, bind and serve until cancelled (the programmatic entry point).

    Raises:
        UnsupportedDeviceError: before anything binds, for a remote or capture device.
    """
    await Server(config).serve(task_status=task_status)
