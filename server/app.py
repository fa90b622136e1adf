"""The websocket transport: accept connections, run the handshake, feed sessions.

Rule: the only server module that touches sockets. Imports ``server.session`` and below.

Choice of transport (see README, "Design"): websockets' asyncio implementation, run under
anyio's asyncio backend. It is the fastest websocket stack measured on our machines (about
100 µs per small round trip, against 110–165 µs for the sans-I/O protocol driven over anyio
streams), and it brings keepalive pings, the close handshake, size limits and an HTTP hook for
health endpoints. Everything the server does beyond the socket (task groups, worker threads,
capacity limits, cancellation) is anyio. The price is that the server runs on asyncio only.

Per connection: one task receives and decodes messages into a bounded queue (a full queue stops
reading the socket, so TCP pushes back on a client that sends faster than the server runs);
one task takes batches off the queue in order, runs them (cheap ops on the loop, heavy ones in a
bounded worker-thread pool) and sends the replies.

Guards (README, "Security"): the token, Origin and connection count are checked on the HTTP
upgrade by :class:`server.guard.Gate`, before a session exists. Each decoder refuses declared
buffers over the message size or the session's quota before allocating them. A batch that
leaves the event loop is watched against the per-op deadline; past it the session is closed
(close code 1008, reason ``deadline_exceeded: ...``) while the worker thread runs on to the end
of its numpy call and its result is discarded. A reply the client does not take within the
send timeout drops the connection; so does a client that sends nothing for the idle timeout
while the server owes it nothing. Close reasons start with the :class:`~protocol.ErrorCode`.
"""

from __future__ import annotations

import logging
import secrets
import time
from dataclasses import dataclass, field

import anyio
import anyio.abc
from anyio.streams.memory import MemoryObjectReceiveStream
from websockets.asyncio.server import ServerConnection
from websockets.asyncio.server import serve as ws_serve
from websockets.exceptions import ConnectionClosed

from protocol import (
    CLIENT_ADAPTER,
    PROTOCOL_VERSION,
    Batch,
    DecodeError,
    ErrorCode,
    ErrorInfo,
    Hello,
    MessageDecoder,
    MessageLimitError,
    Refused,
    SessionError,
    Welcome,
    encode,
)
from protocol.codec import Buffer, to_frames
from protocol.messages import Message

from .config import ServerConfig, validate_host_device, validate_security
from .guard import Gate, tls_context
from .session import Job, Limits, Session
from .store import MemoryBudget, TensorStore

log = logging.getLogger("tensorwire.server")

QUEUE_DEPTH = 8  # default of ServerConfig.max_queued: decoded messages waiting per session


@dataclass
class _Received:
    message: Hello | Batch | None
    buffers: list[Buffer]
    error: ErrorInfo | None = None


@dataclass
class _Progress:
    """Per connection: whether a message is half received, and how much work is owed."""

    partial: bool = False
    pending: int = 0  # messages received whose replies are not sent yet


@dataclass
class _ThreadRun:
    """One worker-thread step of a job, as its session watches it."""

    started: anyio.Event = field(default_factory=anyio.Event)
    done: anyio.Event = field(default_factory=anyio.Event)
    returned: bool = False  # False when cancelled (server shutdown): the thread was abandoned


class _Drop(Exception):
    """Close this connection with ``reason`` (a close reason starting with an ErrorCode)."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(f"{code}: {message}"[:120])  # a close reason holds 123 bytes
        self.code = code
        self.reason = str(self)


async def _receive(
    ws: ServerConnection, decoder: MessageDecoder[Hello | Batch], progress: _Progress
) -> _Received:
    """One whole message, decoded. A decode error drains the rest of the message first, so
    the stream stays intact; a limit error keeps the (valid) header so its ops can be failed.
    """
    error: DecodeError | None = None
    progress.partial = False
    async for fragment in ws.recv_streaming(decode=False):
        progress.partial = True
        if error is None:
            try:
                decoder.feed(fragment)
            except DecodeError as exc:
                error = exc
    progress.partial = False
    try:
        if error is not None:
            raise error
        message, buffers = decoder.finish()
    except MessageLimitError as exc:
        return _Received(decoder.message, [], ErrorInfo(code=exc.code, message=str(exc)))
    except DecodeError as exc:
        return _Received(None, [], ErrorInfo(code=ErrorCode.BAD_MESSAGE, message=str(exc)))
    return _Received(message, buffers)


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
        self.budget = MemoryBudget(config.memory_budget)
        self._ssl = tls_context(config)
        self._limits = Limits(max_op_bytes=config.max_op_bytes, max_ndim=config.max_ndim)
        self._limiter = anyio.CapacityLimiter(config.worker_threads)
        self._open = 0  # upgraded connections being handled

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
            compression=None,  # tensor bytes do not compress; deflate costs 13x throughput
            max_size=config.max_message_size,
            max_queue=4,
            write_limit=config.write_limit,
            ssl=self._ssl,
            process_request=Gate(config, lambda: self._open),
            open_timeout=config.handshake_timeout,
            ping_interval=config.ping_interval,
            ping_timeout=config.ping_timeout,
        )
        try:
            async with anyio.create_task_group() as self._tasks:  # worker-thread runners
                self.port = ws_server.sockets[0].getsockname()[1]
                log.info(
                    "listening host=%s port=%s server_id=%s", config.host, self.port, self.server_id
                )
                task_status.started(self.port)
                await anyio.sleep_forever()
        finally:
            with anyio.CancelScope(shield=True), anyio.move_on_after(config.shutdown_grace):
                ws_server.close()
                await ws_server.wait_closed()

    async def _handle(self, ws: ServerConnection) -> None:
        self._open += 1
        try:
            await self._handle_open(ws)
        finally:
            self._open -= 1

    async def _handle_open(self, ws: ServerConnection) -> None:
        timeout = self.config.handshake_timeout
        try:
            with anyio.fail_after(timeout):
                session = await self._handshake(ws)
        except (TimeoutError, ConnectionClosed):
            await ws.close(1008, f"{ErrorCode.IDLE_TIMEOUT}: no hello within {timeout} s")
            return
        if session is None:
            return
        self.sessions[session.session_id] = session
        log.info(
            "session opened id=%s peer=%s device=%s",
            session.session_id,
            ws.remote_address,
            session.device_index,
        )
        try:
            await self._run(ws, session)
        finally:
            del self.sessions[session.session_id]
            session.close()
            log.info("session closed id=%s", session.session_id)

    async def _handshake(self, ws: ServerConnection) -> Session | None:
        decoder = MessageDecoder(CLIENT_ADAPTER, self.config.max_header_size, max_buffer_bytes=0)
        received = await _receive(ws, decoder, _Progress())
        hello = received.message
        error: ErrorInfo | None = received.error
        if error is None and not isinstance(hello, Hello):
            error = ErrorInfo(code=ErrorCode.BAD_MESSAGE, message="the first message must be hello")
        elif isinstance(hello, Hello):
            error = self._check_hello(hello)
        if error is not None or not isinstance(hello, Hello):
            assert error is not None
            await self._send(ws, Refused(protocol=PROTOCOL_VERSION, error=error))
            await ws.close(1000, "handshake refused")
            return None
        store = TensorStore(self.config.effective_session_quota, self.budget)
        session = Session(secrets.token_hex(8), hello.device_index, store, self._limits)
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
        self, ws: ServerConnection, message: Message, buffers: tuple[memoryview, ...] = ()
    ) -> None:
        """Send one message. Raises :class:`_Drop` if the client does not take it in time."""
        try:
            with anyio.fail_after(self.config.send_timeout):
                await ws.send(to_frames(encode(message, buffers)))
        except TimeoutError:
            raise _Drop(
                ErrorCode.SEND_TIMEOUT,
                f"the client took no reply for {self.config.send_timeout} s",
            ) from None

    async def _run(self, ws: ServerConnection, session: Session) -> None:
        progress = _Progress()
        send, receive = anyio.create_memory_object_stream[_Received](self.config.max_queued)
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._work, ws, session, receive, progress)
                try:
                    async with send:
                        while True:
                            item = await self._receive_idle(ws, session, progress)
                            progress.pending += 1
                            await send.send(item)
                except (ConnectionClosed, anyio.BrokenResourceError):
                    pass
                finally:
                    tg.cancel_scope.cancel()
        except* _Drop as group:
            drop = group.exceptions[0]
            assert isinstance(drop, _Drop)
            log.info("session dropped id=%s reason=%s", session.session_id, drop.reason)
            if drop.code is ErrorCode.SEND_TIMEOUT:
                ws.transport.abort()  # the client does not read: a close frame would not pass
            else:
                await ws.close(1008, drop.reason)

    async def _receive_idle(
        self, ws: ServerConnection, session: Session, progress: _Progress
    ) -> _Received:
        """The next message; raises :class:`_Drop` after the idle timeout with nothing owed."""
        idle = self.config.idle_timeout
        while True:
            decoder = MessageDecoder(
                CLIENT_ADAPTER,
                self.config.max_header_size,
                max_buffer_bytes=self.config.max_message_size,
                check=lambda m: session.check_upload(m) if isinstance(m, Batch) else None,
            )
            with anyio.move_on_after(idle) as scope:
                return await _receive(ws, decoder, progress)
            if progress.partial or not progress.pending:  # cancelling mid-message breaks ws
                raise _Drop(ErrorCode.IDLE_TIMEOUT, f"nothing received for {idle} s")
            assert scope.cancelled_caught

    async def _work(
        self,
        ws: ServerConnection,
        session: Session,
        queue: MemoryObjectReceiveStream[_Received],
        progress: _Progress,
    ) -> None:
        async with queue:
            try:
                async for item in queue:
                    await self._answer(ws, session, item)
                    progress.pending -= 1
            except ConnectionClosed:
                pass  # the receive side sees it too and ends the session

    async def _answer(self, ws: ServerConnection, session: Session, item: _Received) -> None:
        """Run one received message and send its replies.

        Raises:
            _Drop: the op deadline passed, or a worker step failed.
        """
        if not isinstance(item.message, Batch):
            error = item.error or ErrorInfo(
                code=ErrorCode.BAD_MESSAGE, message="hello is only valid as the first message"
            )
            await self._send(ws, SessionError(error=error))
            return
        job = session.start(item.message, item.buffers, rejected=item.error)
        while not session.step(job, inline=True):
            await self._step_in_thread(session, job)
        if session.closed:
            raise _Drop(ErrorCode.INTERNAL, "a worker step failed; see the server log")
        for reply, buffers in session.finish(job):
            await self._send(ws, reply, tuple(buffers))

    async def _step_in_thread(self, session: Session, job: Job) -> None:
        """Run the rest of ``job`` in a worker thread, watching the per-op deadline.

        The thread runs in the server's task group, so a session that gives up on it (deadline,
        disconnect) neither waits for it nor frees its worker slot before numpy returns.

        Raises:
            _Drop: ``deadline_exceeded`` when one op ran past ``op_deadline``;
                ``internal`` when the server is shutting down and abandoned the thread.
        """
        run = _ThreadRun()
        self._tasks.start_soon(self._thread_runner, session, job, run)
        await run.started.wait()
        deadline = self.config.op_deadline
        while not run.done.is_set():
            op_started = job.op_started or time.monotonic()
            with anyio.move_on_after(op_started + deadline - time.monotonic()):
                await run.done.wait()
            if not run.done.is_set() and job.op_started == op_started:
                op = job.batch.ops[min(job.next, len(job.batch.ops) - 1)]
                session.close()
                raise _Drop(
                    ErrorCode.DEADLINE_EXCEEDED,
                    f"{op.describe()} ran past the {deadline} s per-op deadline",
                )
        if not run.returned:  # cancelled: the server is shutting down
            session.close()
            raise _Drop(ErrorCode.INTERNAL, "the server is shutting down")

    async def _thread_runner(self, session: Session, job: Job, run: _ThreadRun) -> None:
        try:
            async with self._limiter:
                job.op_started = time.monotonic()
                run.started.set()
                await anyio.to_thread.run_sync(session.step, job, False, abandon_on_cancel=True)
                run.returned = True
        except Exception:
            log.exception("worker step failed session=%s", session.session_id)
            session.close()
            run.returned = True
        finally:
            run.started.set()
            run.done.set()


async def serve(
    config: ServerConfig, *, task_status: anyio.abc.TaskStatus[int] = anyio.TASK_STATUS_IGNORED
) -> None:
    """Validate ``config``, bind and serve until cancelled (the programmatic entry point).

    Raises:
        UnsupportedDeviceError: before anything binds, for a remote or capture device.
    """
    await Server(config).serve(task_status=task_status)
