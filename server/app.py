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
"""

from __future__ import annotations

import hmac
import logging
import secrets
from dataclasses import dataclass

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
    Refused,
    SessionError,
    Welcome,
    encode,
)
from protocol.codec import Buffer, to_frames
from protocol.messages import Message

from .config import ServerConfig, validate_host_device
from .session import Session

log = logging.getLogger("tensorwire.server")

QUEUE_DEPTH = 8  # decoded messages waiting per session before the socket stops being read


@dataclass
class _Received:
    message: Hello | Batch | None
    buffers: list[Buffer]
    error: ErrorInfo | None = None


async def _receive(ws: ServerConnection) -> _Received:
    """One whole message, decoded. A decode error drains the rest of the message first."""
    decoder = MessageDecoder(CLIENT_ADAPTER)
    error: DecodeError | None = None
    async for fragment in ws.recv_streaming(decode=False):
        if error is None:
            try:
                decoder.feed(fragment)
            except DecodeError as exc:
                error = exc
    try:
        if error is not None:
            raise error
        message, buffers = decoder.finish()
    except DecodeError as exc:
        return _Received(None, [], ErrorInfo(code=ErrorCode.BAD_MESSAGE, message=str(exc)))
    return _Received(message, buffers)


async def _send(
    ws: ServerConnection, message: Message, buffers: tuple[memoryview, ...] = ()
) -> None:
    await ws.send(to_frames(encode(message, buffers)))


class Server:
    """A Tensorwire server. Construction validates the hosted device; nothing binds until
    :meth:`serve` runs.

    Raises:
        UnsupportedDeviceError: from the constructor, for a remote or capture device.
    """

    def __init__(self, config: ServerConfig) -> None:
        self.device = validate_host_device(config.device)
        self.config = config
        self.server_id = secrets.token_hex(8)
        self.sessions: dict[str, Session] = {}
        self.port: int | None = None
        self._limiter = anyio.CapacityLimiter(config.worker_threads)

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
            write_limit=2**20,
        )
        try:
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
        try:
            with anyio.fail_after(self.config.handshake_timeout):
                session = await self._handshake(ws)
        except (TimeoutError, ConnectionClosed):
            await ws.close(1008, "handshake timed out")
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
        received = await _receive(ws)
        hello = received.message
        error: ErrorInfo | None = received.error
        if error is None and not isinstance(hello, Hello):
            error = ErrorInfo(code=ErrorCode.BAD_MESSAGE, message="the first message must be hello")
        elif isinstance(hello, Hello):
            error = self._check_hello(hello)
        if error is not None or not isinstance(hello, Hello):
            assert error is not None
            await _send(ws, Refused(protocol=PROTOCOL_VERSION, error=error))
            await ws.close(1000, "handshake refused")
            return None
        session = Session(secrets.token_hex(8), hello.device_index)
        await _send(
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
        expected = self.config.token
        if expected is not None and not hmac.compare_digest(
            (hello.token or "").encode(), expected.encode()
        ):
            return ErrorInfo(code=ErrorCode.AUTH_FAILED, message="missing or wrong token")
        return None

    async def _run(self, ws: ServerConnection, session: Session) -> None:
        send, receive = anyio.create_memory_object_stream[_Received](QUEUE_DEPTH)
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._work, ws, session, receive)
            try:
                async with send:
                    while True:
                        await send.send(await _receive(ws))
            except ConnectionClosed:
                pass
            finally:
                tg.cancel_scope.cancel()

    async def _work(
        self,
        ws: ServerConnection,
        session: Session,
        queue: MemoryObjectReceiveStream[_Received],
    ) -> None:
        async with queue:
            try:
                async for item in queue:
                    await self._answer(ws, session, item)
            except ConnectionClosed:
                pass  # the receive side sees it too and ends the session

    async def _answer(self, ws: ServerConnection, session: Session, item: _Received) -> None:
        """Run one received message and send its replies."""
        if item.error is not None or not isinstance(item.message, Batch):
            error = item.error or ErrorInfo(
                code=ErrorCode.BAD_MESSAGE, message="hello is only valid as the first message"
            )
            await _send(ws, SessionError(error=error))
            return
        job = session.start(item.message, item.buffers)
        while not session.step(job, inline=True):
            await anyio.to_thread.run_sync(session.step, job, False, limiter=self._limiter)
        for reply, buffers in session.finish(job):
            await _send(ws, reply, tuple(buffers))


async def serve(
    config: ServerConfig, *, task_status: anyio.abc.TaskStatus[int] = anyio.TASK_STATUS_IGNORED
) -> None:
    """Validate ``config``, bind and serve until cancelled (the programmatic entry point).

    Raises:
        UnsupportedDeviceError: before anything binds, for a remote or capture device.
    """
    await Server(config).serve(task_status=task_status)
