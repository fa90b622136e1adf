"""One session with a server device, driven by a background event-loop thread.

Rule: imports ``protocol`` and ``client.errors`` only; knows nothing of arrays.

Theory of operation. Callers (any thread) append ops to a pending batch under a lock; nothing
waits. A *flush* turns the pending ops, the ids freed since the last flush and any requests into
one :class:`~protocol.Batch`, encodes it, and hands the frames to the writer task on the loop
thread, in flush order. Flushes happen on a read, a sync, a stats call, when the batch holds
:data:`FLUSH_OPS` ops or :data:`FLUSH_BYTES` upload bytes, and on close. Bytes handed to the
writer but not yet written are bounded by :data:`MAX_IN_FLIGHT`: a caller that outruns the
socket blocks in ``flush`` (backpressure, not an unbounded queue).

Requests (read, sync, stats) register a :class:`concurrent.futures.Future` under a request id
before their batch is handed over; the reader task resolves it from the reply. When the
connection closes or breaks, every pending future fails with :class:`ConnectionLost`, and so does
every later call: nothing hangs.

Frees are recorded without a lock (they come from ``__del__``, in any thread, at any time) and
are taken *before* the ops at each flush, so a free never overtakes an op that reads the id.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import ssl
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import numpy as np
from pydantic import ValidationError
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus, InvalidURI

from protocol import (
    PROTOCOL_VERSION,
    SERVER_ADAPTER,
    Batch,
    DecodeError,
    DescribeReply,
    ErrorCode,
    ErrorInfo,
    Hello,
    MessageDecoder,
    ReadReply,
    Refused,
    RequestFailed,
    SessionError,
    StatsReply,
    SyncReply,
    Welcome,
    encode,
    to_numpy,
)
from protocol.codec import Buffer, to_frames
from protocol.messages import Request
from protocol.ops import AnyOp

from .errors import (
    ConnectionLost,
    HandshakeError,
    RemoteError,
    ServerProtocolError,
    handshake_error,
)

FLUSH_OPS = 2048
FLUSH_BYTES = 1 << 20
COPY_BELOW = 1 << 20  # uploads smaller than this are copied; larger ones are sent before return
MAX_IN_FLIGHT = 64 << 20
MAX_MESSAGE = 2**31
CLOSE_TIMEOUT = 10.0

_Outgoing = tuple[bytes | list[bytes | memoryview], "Future[None] | None", int]


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


def _close_code(exc: BaseException) -> ErrorCode | None:
    """The ErrorCode a server put at the start of its close reason (or 1009: too big)."""
    if not isinstance(exc, ConnectionClosed) or exc.rcvd is None:
        return None
    if exc.rcvd.code == 1009:
        return ErrorCode.LIMIT_EXCEEDED
    try:
        return ErrorCode(exc.rcvd.reason.partition(":")[0])
    except ValueError:
        return None


def _tls(url: str, ca_file: str | None) -> ssl.SSLContext | None:
    """Certificates are verified for ``wss://``, against ``ca_file`` or the system's CAs."""
    if not url.startswith("wss://"):
        return None
    return ssl.create_default_context(cafile=ca_file)


async def _receive(ws: ClientConnection) -> tuple[Any, list[Buffer]]:
    decoder = MessageDecoder(SERVER_ADAPTER)
    async for fragment in ws.recv_streaming(decode=False):
        decoder.feed(fragment)
    return decoder.finish()


class Connection:
    """A session with device ``index`` of the server at ``url``.

    Raises:
        HandshakeError: (a subclass of) the server refused the session.
        ConnectionLost: the server cannot be reached or the handshake broke.
    """

    def __init__(
        self,
        url: str,
        index: int = 0,
        token: str | None = None,
        open_timeout: float = 10.0,
        ca_file: str | None = None,
    ) -> None:
        self.url = url
        self._lock = threading.Lock()
        self._ops: list[AnyOp] = []
        self._buffers: list[memoryview] = []
        self._buffered = 0
        self._frees: collections.deque[int] = collections.deque()
        self._tensor_ids = itertools.count(1)
        self._request_ids = itertools.count(1)
        self._waiters: dict[int, Future[Any]] = {}
        self._error: ConnectionLost | None = None
        self._server_error: ServerProtocolError | None = None
        self._closing = False
        self._in_flight = 0
        self._drained = threading.Condition(self._lock)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name=f"tensorwire {url}", daemon=True
        )
        self._thread.start()
        try:
            self.welcome: Welcome = self._call(self._open(url, index, token, open_timeout, ca_file))
        except BaseException:
            self._stop_loop()
            raise

    # --- loop thread ------------------------------------------------------------------------

    def _call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    async def _open(
        self, url: str, index: int, token: str | None, open_timeout: float, ca_file: str | None
    ) -> Welcome:
        headers = {"Authorization": f"Bearer {token}"} if token is not None else None
        try:
            self._ws = await connect(
                url,
                additional_headers=headers,
                ssl=_tls(url, ca_file),
                compression=None,
                max_size=MAX_MESSAGE,
                open_timeout=open_timeout,
                proxy=None,
                write_limit=2**20,
            )
        except InvalidStatus as exc:
            refused = _refusal(exc)
            if refused is not None:
                raise refused from None
            raise ConnectionLost(f"cannot connect to {url}: {exc}") from exc
        except (OSError, InvalidHandshake, InvalidURI, TimeoutError) as exc:
            raise ConnectionLost(f"cannot connect to {url}: {exc}") from exc
        try:
            hello = Hello(protocol=PROTOCOL_VERSION, device_index=index)
            await self._ws.send(to_frames(encode(hello)))
            reply, _ = await _receive(self._ws)
        except (ConnectionClosed, DecodeError) as exc:
            await self._ws.close()
            raise ConnectionLost(f"handshake with {url} failed: {exc}") from exc
        if isinstance(reply, Refused):
            await self._ws.close()
            raise handshake_error(reply.error)
        if not isinstance(reply, Welcome):
            await self._ws.close()
            raise ConnectionLost(f"handshake with {url} failed: unexpected {reply.type}")
        self._outbox: asyncio.Queue[_Outgoing | None] = asyncio.Queue()
        self._reader = asyncio.ensure_future(self._read_loop())
        self._writer = asyncio.ensure_future(self._write_loop())
        return reply

    async def _write_loop(self) -> None:
        while (item := await self._outbox.get()) is not None:
            frames, sent, nbytes = item
            try:
                if self._error is None:
                    await self._ws.send(frames)
            except ConnectionClosed as exc:
                self._broken(exc)
            finally:
                with self._lock:
                    self._in_flight -= nbytes
                    self._drained.notify_all()
            if sent is not None:
                if self._error is None:
                    sent.set_result(None)
                else:
                    sent.set_exception(self._error)

    async def _read_loop(self) -> None:
        try:
            while True:
                message, buffers = await _receive(self._ws)
                self._dispatch(message, buffers)
        except ConnectionClosed as exc:
            self._broken(exc)
        except DecodeError as exc:
            self._broken(exc)
            await self._ws.close(1002, "undecodable message")

    def _dispatch(self, message: Any, buffers: list[Buffer]) -> None:
        if isinstance(message, SessionError):
            self._server_error = ServerProtocolError(message.error)
            return
        with self._lock:
            future = self._waiters.pop(message.request_id, None)
        if future is None:
            return
        if isinstance(message, ReadReply):
            array = np.frombuffer(buffers[0], dtype=to_numpy(message.dtype))
            if not array.flags.writeable:
                array = array.copy()
            future.set_result(array.reshape(message.shape))
        elif isinstance(message, RequestFailed):
            future.set_exception(RemoteError(message.error))
        elif isinstance(message, StatsReply | SyncReply | DescribeReply):
            future.set_result(message)

    def _broken(self, exc: BaseException) -> None:
        with self._lock:
            if self._error is None:
                reason = "closed" if self._closing else f"lost ({exc})"
                code = None if self._closing else _close_code(exc)
                self._error = ConnectionLost(f"connection to {self.url} {reason}", code=code)
            waiters, self._waiters = self._waiters, {}
            self._drained.notify_all()
        for future in waiters.values():
            if not future.done():
                future.set_exception(self._error)

    # --- caller threads ---------------------------------------------------------------------

    def new_id(self) -> int:
        return next(self._tensor_ids)

    def submit(self, op: AnyOp) -> None:
        """Queue ``op``; it travels with the next flush."""
        with self._lock:
            self._check_open()
            self._ops.append(op)
            if len(self._ops) >= FLUSH_OPS or len(self._frees) >= FLUSH_OPS:
                self._flush_locked(())

    def submit_upload(self, make_op: Callable[[int], AnyOp], data: memoryview) -> None:
        """Queue the op ``make_op(buffer_index)`` whose bytes are ``data``.

        Small uploads are copied at once; a large one is sent before this returns, so the
        caller may change its array afterwards either way.
        """
        sent: Future[None] | None = None
        with self._lock:
            self._check_open()
            if data.nbytes < COPY_BELOW:
                data = memoryview(bytes(data))
            self._ops.append(make_op(len(self._buffers)))
            self._buffers.append(data)
            self._buffered += data.nbytes
            if data.nbytes >= COPY_BELOW:
                sent = self._flush_locked((), wait_sent=True)
            elif self._buffered >= FLUSH_BYTES:
                self._flush_locked(())
        if sent is not None:
            sent.result()

    def release(self, tensor_id: int) -> None:
        """Free ``tensor_id`` on the server at the next flush. Safe from ``__del__``."""
        self._frees.append(tensor_id)

    def request(self, make: Callable[[int], Request]) -> Future[Any]:
        """Flush with the request ``make(request_id)``; the future resolves with its reply."""
        future: Future[Any] = Future()
        with self._lock:
            self._check_open()
            request_id = next(self._request_ids)
            self._waiters[request_id] = future
            self._flush_locked((make(request_id),))
        return future

    def flush(self) -> None:
        with self._lock:
            if self._error is None and (self._ops or self._frees):
                self._flush_locked(())

    def take_server_error(self) -> ServerProtocolError | None:
        error, self._server_error = self._server_error, None
        return error

    def _check_open(self) -> None:
        if self._error is not None:
            raise self._error
        if self._closing:
            raise ConnectionLost(f"connection to {self.url} is closed")

    def _flush_locked(
        self, requests: tuple[Request, ...], wait_sent: bool = False
    ) -> Future[None] | None:
        frees = [self._frees.popleft() for _ in range(len(self._frees))]  # before the ops
        batch = Batch(
            ops=self._ops,
            frees=frees,
            requests=list(requests),
            buffers=[b.nbytes for b in self._buffers],
        )
        frames = to_frames(encode(batch, self._buffers))
        nbytes = len(frames) if isinstance(frames, bytes) else sum(len(f) for f in frames)
        self._ops, self._buffers, self._buffered = [], [], 0
        while self._in_flight > MAX_IN_FLIGHT and self._error is None:
            self._drained.wait()
        self._in_flight += nbytes
        sent: Future[None] | None = Future() if wait_sent else None
        self._loop.call_soon_threadsafe(self._outbox.put_nowait, (frames, sent, nbytes))
        return sent

    def close(self) -> None:
        """Flush what is pending, close the websocket and stop the loop thread. Idempotent."""
        with self._lock:
            if self._closing:
                return
            if self._error is None and (self._ops or self._frees):
                self._flush_locked(())
            self._closing = True
        try:
            self._call(self._aclose())
        finally:
            self._stop_loop()

    async def _aclose(self) -> None:
        self._outbox.put_nowait(None)
        try:
            async with asyncio.timeout(CLOSE_TIMEOUT):
                await self._writer
                await self._ws.close()
                await self._reader
        except TimeoutError:  # a server that stopped reading: drop the connection
            self._ws.transport.abort()
            self._broken(TimeoutError("close timed out"))

    def _stop_loop(self) -> None:
        if self._loop.is_running():
            self._loop.call_soon_threadsafe(self._loop.stop)
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=5)
            if not self._loop.is_running():
                self._loop.close()
