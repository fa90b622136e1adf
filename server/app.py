"""The websocket transport: accept connections, run the handshake, feed sessions.

Rule: with ``server.wire`` and ``server.sending``, the only server modules that touch sockets.
Imports ``server.session``, ``server.wire`` and below.

Choice of transport (see README, "Design"): websockets' asyncio implementation, run under
anyio's asyncio backend. It is the fastest websocket stack measured on our machines (about
100 µs per small round trip, against 110–165 µs for the sans-I/O protocol driven over anyio
streams), and it brings keepalive pings, the close handshake, size limits and an HTTP hook for
health endpoints. Everything the server does beyond the socket (task groups, worker threads,
capacity limits, cancellation) is anyio. The price is that the server runs on asyncio only.
Data frames are parsed by :class:`server.wire.WireConnection` and written by its base
:class:`server.sending.SendingConnection`, subclasses of websockets' connection, so that
payloads are received straight into their arrays and sent from them.

Per connection: the wire decodes messages as their bytes arrive and stops reading the socket
while ``max_queued`` of them wait (so TCP pushes back on a client that sends faster than the
server runs); one task takes them in order, runs each (cheap ops on the loop, heavy ones in a
bounded worker-thread pool, given up if the connection is lost meanwhile) and sends its
replies before it takes the next. (One task, not a receiving task handing batches to a
working one: that hand-over cost an event-loop turn, about 130 us, on every upload.)

Plain HTTP requests on the same port get ``/healthz`` and ``/metrics`` (``server.endpoints``)
from websockets' ``process_request`` hook, before any upgrade. Drain (``Server.drain``, on
SIGTERM): upgrades get 503, each session keeps a count of messages received but not yet
answered and is closed (1001) when that count is zero; past the grace, the rest are closed.

Guards (README, "Security"): the Origin, the token and the connection count are checked on the
HTTP upgrade by :class:`server.guard.Gate`, before a session exists. Each decoder refuses
declared buffers over the message size or the session's quota before allocating them. A batch
that leaves the event loop is watched against the per-op deadline (``server.workers``); past
it the session is closed (close code 1008, reason ``deadline_exceeded: ...``). A reply the
client does not take within the send timeout drops the connection; so does a client that sends
nothing for the idle timeout while the server owes it nothing. Close reasons start with the
:class:`~protocol.ErrorCode`.
"""

from __future__ import annotations

import logging
import secrets
import time

import anyio
import anyio.abc
from websockets.asyncio.server import Server as WsServer
from websockets.asyncio.server import ServerConnection
from websockets.asyncio.server import serve as ws_serve
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response

from protocol import (
    CLIENT_ADAPTER,
    PROTOCOL_VERSION,
    Batch,
    ErrorCode,
    ErrorInfo,
    Hello,
    MessageDecoder,
    Read,
    Refused,
    SessionError,
    Welcome,
    encode,
)
from protocol.messages import Message

from . import endpoints
from .budget import MemoryBudget
from .config import ServerConfig, validate_host_device, validate_security
from .errors import Drop
from .frames import Received
from .guard import Gate, tls_context
from .logs import fields
from .metrics import REFUSAL_LIMIT, Metrics
from .session import Job, Limits, Session
from .store import TensorStore
from .wire import WireConnection
from .workers import Workers

log = logging.getLogger("tensorwire.server")

_DROP_LIMIT = {  # refusals_total label of each reason a session is dropped
    ErrorCode.IDLE_TIMEOUT: "idle",
    ErrorCode.SEND_TIMEOUT: "send_timeout",
    ErrorCode.DEADLINE_EXCEEDED: "deadline",
}

CLOSE_AFTER_DRAIN = 2.0  # seconds for close handshakes once a drain has run its grace


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
        self.sessions: dict[str, Session] = {}
        self.port: int | None = None
        self.metrics_port: int | None = None
        self.draining = False
        self._workers = Workers(config.worker_threads, config.op_deadline)
        self.budget = MemoryBudget(config.effective_memory_budget, config.spare_memory)
        self._ssl = tls_context(config)
        self._limits = Limits(max_op_bytes=config.max_op_bytes, max_ndim=config.max_ndim)
        self._gate = Gate(config, lambda: self._open)
        self._open = 0  # upgraded connections being handled
        self._sockets: dict[str, WireConnection] = {}  # by session id
        self._in_flight: dict[str, int] = {}  # by session id: received, not yet answered
        self._all_closed: anyio.Event | None = None  # made by drain(); set when none are left
        self.metrics = Metrics(
            lambda: self.sessions.values(),
            lambda: sum(self._in_flight.values()),
            lambda: self.draining,
            config.effective_memory_budget,
            lambda: self.budget.spare_bytes,
        )
        self._endpoints = endpoints.Endpoints(
            str(self.device), self.metrics, config.token, config.metrics_auth
        )

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
        ws_server = await ws_serve(
            self._handle,
            config.host,
            config.port,
            process_request=self._http,
            create_connection=WireConnection,  # our own data frames: see server.wire
            compression=None,  # tensor bytes do not compress; deflate costs 13x throughput
            max_size=config.max_message_size,
            write_limit=config.write_limit,
            ssl=self._ssl,
            open_timeout=config.handshake_timeout,
            ping_interval=config.ping_interval,
            ping_timeout=config.ping_timeout,
        )
        servers = [ws_server]
        try:
            if config.metrics_port is not None:
                servers.append(await self._serve_metrics())
            self.port = ws_server.sockets[0].getsockname()[1]
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
                if self.budget.spare_limit:  # --spare-memory 0: nothing to trim
                    tasks.start_soon(self._trim_spare)
                task_status.started(self.port)
                await anyio.sleep_forever()
        finally:
            with anyio.CancelScope(shield=True):
                await self._close(servers)

    async def _trim_spare(self) -> None:
        """Drop spare memory (freed tensors kept for uploads) once it is ``spare_ttl`` old."""
        while True:
            await anyio.sleep(self.budget.spare_ttl / 2)
            self.budget.trim_spare()

    async def _close(self, servers: list[WsServer]) -> None:
        """Close every session (1001) and listener; after a drain, or past the shutdown grace,
        abort the connections still open (a client that does not read cannot hold us)."""
        bound = CLOSE_AFTER_DRAIN if self.draining else self.config.shutdown_grace
        with anyio.move_on_after(bound):
            for each in servers:
                each.close()
            for each in servers:
                await each.wait_closed()
        for ws in list(self._sockets.values()):
            ws.transport.abort()

    async def _serve_metrics(self) -> WsServer:
        """The ``--metrics-port`` listener: HTTP only, never a websocket."""

        async def no_sessions(ws: ServerConnection) -> None:  # unreachable: _http_metrics answers
            await ws.close(1008, "this port serves /metrics only")

        metrics_server = await ws_serve(
            no_sessions,
            self.config.host,
            self.config.metrics_port,
            process_request=self._http_metrics,
        )
        self.metrics_port = metrics_server.sockets[0].getsockname()[1]
        return metrics_server

    def _http(self, ws: ServerConnection, request: Request) -> Response | None:
        """Answer ``/healthz`` and ``/metrics``; refuse upgrades while draining; else None (go
        on with the websocket handshake)."""
        with_metrics = self.config.metrics_port is None
        answer = self._endpoints.answer(request, draining=self.draining, with_metrics=with_metrics)
        if answer is None and self.draining:
            self._refused("draining", ws, "server is shutting down")
            return endpoints.plain(503, "server is shutting down")
        if answer is None and (refusal := self._gate(ws, request)) is not None:
            limit, response = refusal
            self._refused(limit, ws, response.body.decode(errors="replace"))
            return response
        return answer

    def _http_metrics(self, ws: ServerConnection, request: Request) -> Response:
        answer = self._endpoints.answer(request, draining=self.draining, with_metrics=True)
        return answer or endpoints.plain(404, "this port serves GET /metrics and /healthz only")

    def _refused(self, limit: str, ws: ServerConnection, reason: str) -> None:
        self.metrics.refused(limit)
        log.info("refused", extra=fields(limit=limit, peer=_peer(ws), reason=reason))

    async def drain(self) -> None:
        """Stop taking sessions (``/healthz`` answers 503, upgrades get 503), let each session
        finish the messages it has received, close it (1001) as soon as it has none, and return
        when every session is closed or ``shutdown_grace`` has passed. Then cancel :meth:`serve`.
        """
        self.draining = True
        self._all_closed = anyio.Event()
        grace = self.config.shutdown_grace
        log.info("draining", extra=fields(sessions=len(self.sessions), grace_s=grace))
        reason = "signal"  # unless the grace runs out first: cancelled from outside
        try:
            with anyio.move_on_after(grace) as scope:
                async with anyio.create_task_group() as tg:
                    for session_id, ws in list(self._sockets.items()):
                        if self._idle(session_id, ws):
                            tg.start_soon(ws.close, 1001, "server shutting down")
                if self.sessions:
                    await self._all_closed.wait()
            reason = "grace" if scope.cancelled_caught else reason
        finally:
            if left := len(self.sessions):
                log.info("drain cut short", extra=fields(sessions_left=left, reason=reason))
            else:
                log.info("drained")

    async def _handle(self, ws: ServerConnection) -> None:
        assert isinstance(ws, WireConnection)  # serve() makes them
        self._open += 1
        try:
            await self._handle_open(ws)
        finally:
            self._open -= 1

    async def _handle_open(self, ws: WireConnection) -> None:
        timeout = self.config.handshake_timeout
        try:
            with anyio.fail_after(timeout):
                session = await self._handshake(ws)
        except TimeoutError:
            self._refused("handshake_timeout", ws, "no hello in time")
            await ws.close(1008, f"{ErrorCode.IDLE_TIMEOUT}: no hello within {timeout} s")
            return
        except ConnectionClosed:
            return  # the peer left before its hello
        if session is None:
            return
        sid = session.session_id
        self.sessions[sid], self._sockets[sid], self._in_flight[sid] = session, ws, 0
        self.metrics.sessions_opened.inc()
        peer = _peer(ws)
        log.info(
            "session opened", extra=fields(session=sid, peer=peer, device=session.device_index)
        )
        try:
            if self.draining:
                await ws.close(1001, "server shutting down")
            await self._run(ws, session)
        except ConnectionClosed:
            pass  # the peer went away, or was cut off, while a reply was being sent
        finally:
            del self.sessions[sid], self._sockets[sid], self._in_flight[sid]
            self.metrics.retire(session)
            session.close()
            log.info(
                "session closed",
                extra=fields(session=sid, peer=peer, ops=session.ops_run, code=ws.close_code),
            )
            if self._all_closed is not None and not self.sessions:
                self._all_closed.set()

    async def _handshake(self, ws: WireConnection) -> Session | None:
        max_header = self.config.max_header_size
        ws.decode_one(lambda: MessageDecoder(CLIENT_ADAPTER, max_header, max_buffer_bytes=0))
        ws.max_header = max_header
        received = await ws.receive()
        assert received is not None  # no timeout given
        hello = received.message
        error: ErrorInfo | None = received.error
        if error is None and not isinstance(hello, Hello):
            error = ErrorInfo(code=ErrorCode.BAD_MESSAGE, message="the first message must be hello")
        elif isinstance(hello, Hello):
            error = self._check_hello(hello)
        if error is not None or not isinstance(hello, Hello):
            assert error is not None
            self._refused(REFUSAL_LIMIT.get(error.code, error.code.value), ws, error.message)
            await self._send(ws, Refused(protocol=PROTOCOL_VERSION, error=error))
            await ws.close(1000, "handshake refused")
            return None
        store = TensorStore(self.config.effective_session_quota, self.budget)
        session = Session(secrets.token_hex(8), hello.device_index, store, self._limits)
        self._decode_for(ws, session)  # before the welcome: the client may send at once
        await self._send(
            ws,
            Welcome(
                protocol=PROTOCOL_VERSION,
                device_index=hello.device_index,
                device_count=self.device.count,
                server_id=self.server_id,
                session_id=session.session_id,
            ),
        )
        return session

    def _decode_for(self, ws: WireConnection, session: Session) -> None:
        """Decode what ``ws`` receives from now on as ``session``'s batches: limits checked,
        uploads refused by its quota before they are allocated."""
        config = self.config
        ws.decoders = lambda: MessageDecoder(
            CLIENT_ADAPTER,
            config.max_header_size,
            max_buffer_bytes=config.max_message_size,
            check=lambda m: session.check_upload(m) if isinstance(m, Batch) else None,
            max_buffers=config.max_buffers,
            allocate=self.budget.allocate,
        )
        ws.max_waiting = config.max_queued

    def _check_hello(self, hello: Hello) -> ErrorInfo | None:
        if hello.protocol != PROTOCOL_VERSION:
            return ErrorInfo(
                code=ErrorCode.VERSION_MISMATCH,
                message=(
                    f"client speaks protocol v{hello.protocol}, this server speaks "
                    f"v{PROTOCOL_VERSION}; upgrade the older side"
                ),
            )
        if hello.device_index >= self.device.count:
            return ErrorInfo(
                code=ErrorCode.BAD_DEVICE_INDEX,
                message=(
                    f"device index {hello.device_index} does not exist: this server hosts "
                    f"{self.device.count} device(s), indices 0..{self.device.count - 1}"
                ),
            )
        return None  # the token was checked on the upgrade request (server.guard)

    async def _send(
        self, ws: WireConnection, message: Message, buffers: tuple[memoryview, ...] = ()
    ) -> None:
        """Send one message and count its bytes.

        Raises:
            Drop: ``send_timeout``, the client did not take it within ``send_timeout``.
        """
        try:
            sent = await ws.send_message(encode(message, buffers), self.config.send_timeout)
            self.metrics.sent_bytes.inc(sent)
        except TimeoutError:
            raise Drop(
                ErrorCode.SEND_TIMEOUT,
                f"the client took no reply for {self.config.send_timeout} s",
            ) from None

    async def _run(self, ws: WireConnection, session: Session) -> None:
        """Answer the session's messages one by one, in order, until it ends."""
        sid = session.session_id
        try:
            while True:
                try:
                    item = await self._receive_idle(ws)
                except ConnectionClosed:
                    return
                self._in_flight[sid] += 1
                self.metrics.received_bytes.inc(item.nbytes)
                await self._answer(ws, session, item)
                await self._settled(ws, session)
        except Drop as drop:
            self._refused(_DROP_LIMIT.get(drop.code, drop.code.value), ws, drop.reason)
            if drop.code is ErrorCode.SEND_TIMEOUT:
                ws.transport.abort()  # the client does not read: a close frame would not pass
            else:
                await ws.close(1008, drop.reason)

    async def _receive_idle(self, ws: WireConnection) -> Received:
        """The next message. Raises :class:`Drop` after the idle timeout (it runs only while
        the server owes nothing: messages are answered before the next is taken)."""
        idle = self.config.idle_timeout
        item = await ws.receive(idle)
        if item is None:
            raise Drop(ErrorCode.IDLE_TIMEOUT, f"nothing received for {idle} s")
        return item

    async def _answer(self, ws: WireConnection, session: Session, item: Received) -> None:
        """Run one received message and send its replies.

        Raises:
            Drop: the op deadline passed, a worker step failed, or a reply was not taken.
        """
        if not isinstance(item.message, Batch):
            error = item.error or ErrorInfo(
                code=ErrorCode.BAD_MESSAGE, message="hello is only valid as the first message"
            )
            log.warning(
                "bad message", extra=fields(session=session.session_id, error=error.message)
            )
            await self._send(ws, SessionError(error=error))
            return
        job = session.start(item.message, item.buffers, rejected=item.error)
        while not session.step(job, inline=True):
            await self._off_loop(ws, session, job)
        if session.closed:
            raise Drop(ErrorCode.INTERNAL, "a worker step failed; see the server log")
        for reply, buffers in session.finish(job):
            await self._send(ws, reply, tuple(buffers))
        reads = sum(isinstance(r, Read) for r in item.message.requests)
        self.metrics.read_done(reads, time.perf_counter() - item.at)

    async def _off_loop(self, ws: WireConnection, session: Session, job: Job) -> None:
        """Run the rest of ``job`` in a worker thread (:meth:`Workers.run`); stop waiting for
        it if the connection is lost meanwhile (the session ends; the thread finishes alone).

        Raises:
            ConnectionClosed: the connection was lost.
            Drop: from :meth:`Workers.run`.
        """
        lost = ws.connection_lost_waiter
        with anyio.CancelScope() as scope:

            def cancel(_: object) -> None:
                scope.cancel()

            lost.add_done_callback(cancel)
            try:
                await self._workers.run(session, job)
            finally:
                lost.remove_done_callback(cancel)
        if scope.cancelled_caught:
            raise ws.close_exc

    async def _settled(self, ws: WireConnection, session: Session) -> None:
        """One received message is answered; while draining, close the session once nothing
        it sent waits."""
        self._in_flight[session.session_id] -= 1
        if self.draining and self._idle(session.session_id, ws):
            await ws.close(1001, "server shutting down")

    def _idle(self, sid: str, ws: WireConnection) -> bool:
        """Whether the session owes nothing: no message being answered, none waiting whole."""
        return self._in_flight.get(sid) == 0 and not ws.waiting


def _peer(ws: ServerConnection) -> str:
    address = ws.remote_address
    if isinstance(address, tuple) and len(address) >= 2:
        host = address[0]
        return f"[{host}]:{address[1]}" if ":" in str(host) else f"{host}:{address[1]}"
    return str(address)


async def serve(
    config: ServerConfig, *, task_status: anyio.abc.TaskStatus[int] = anyio.TASK_STATUS_IGNORED
) -> None:
    """Validate ``config``, bind and serve until cancelled (the programmatic entry point).

    Raises:
        UnsupportedDeviceError: before anything binds, for a remote or capture device.
    """
    await Server(config).serve(task_status=task_status)
