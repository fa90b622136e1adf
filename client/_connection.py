"""One session with a server device, driven by the threads that use it.

The layer below ``client.device``: it knows nothing of arrays. Opening the session (upgrade,
handshake, refusals) is ``client._opening``'s.

Theory of operation. The websocket is :class:`client._transport.Transport`: websockets'
sans-I/O protocol over a socket that the calling threads read and write themselves, so a read
crosses no thread: the reading thread writes its batch and reads its own reply. A daemon
*keeper* thread answers the server's pings while no thread is reading (every
:data:`KEEPALIVE_POLL` seconds it takes the reader's place if it is free and processes what
the socket holds, without blocking), and watches the server in turn (``client._liveness``):
it pings a silent server, and gives up on one that answers no ping within ``ping_timeout``
or leaves a call waiting past ``timeout``, with :class:`ServerNotResponding`.

Callers (any thread) append ops to a pending batch (``client._pending``) under a lock; nothing
waits. A *flush* turns the pending ops and graph registrations, the ids freed and graphs
dropped since the last flush and any requests into one :class:`~protocol.Batch`, encodes it
and writes it to the socket from the flushing thread, in flush order (the send lock is taken
before the batch lock is let go). Flushes happen on a read, a sync, a stats call, when the
batch holds :data:`FLUSH_OPS` ops or :data:`FLUSH_BYTES` upload bytes, and on close. A caller
that outruns the socket blocks in its flush (backpressure: the kernel's socket buffer is the
bound, not an unbounded queue).

Requests (read, sync, stats) register a :class:`Reply` (a ``concurrent.futures.Future``) under a
request id before their batch is sent. Replies are read by whichever thread waits for one
(leader/follower): :meth:`Reply.result` makes the waiting thread the reader if none is, and it
dispatches every reply it receives, its own and other threads', until its own has come; other
waiters sleep until theirs is resolved or the reader steps down. When the connection closes or
breaks, every pending reply fails with :class:`ConnectionLost`, and so does every later call:
nothing hangs (a reader or sender blocked on the socket wakes when it is cut: by the keeper
when the server stopped answering, by :meth:`Connection.close` after :data:`CLOSE_TIMEOUT`).

Large replies are received into buffers of a :class:`~client._buffers.BufferPool`, reused
once the caller has dropped them; the keeper lets go of the ones left idle.

Frees and graph drops are recorded without a lock (they come from ``__del__``, in any thread,
at any time); a batch's apply after its ops, so a free never overtakes an op that reads the id.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from functools import partial
from typing import Any

from protocol import SERVER_ADAPTER, DecodeError, Dropped, SessionError, Welcome, encode
from protocol.codec import Buffer, requests_only, to_frames
from protocol.graphs import GraphDef
from protocol.messages import Request
from protocol.ops import AnyOp

from ._buffers import BufferPool, PooledDecoder
from ._liveness import Traffic, Watch
from ._opening import close_code, handshake, open_transport
from ._options import DEFAULT_OPTIONS, ConnectionOptions
from ._pending import COPY_BELOW as COPY_BELOW
from ._pending import Pending
from ._replies import Reply, fail, resolve, take_batch
from ._transport import Closed
from .errors import ConnectionLost, ServerNotResponding, ServerProtocolError

FLUSH_OPS = 2048
FLUSH_BYTES = 1 << 20
CLOSE_TIMEOUT = 10.0
KEEPALIVE_POLL = 1.0  # seconds between the keeper's looks at an idle socket (server pings)

Frames = list[bytes | list[bytes | memoryview]]  # messages, each one frame or its fragments


class Connection:
    """A session with device ``index`` of the server at ``url``, opened and watched as
    ``options`` say.

    Raises:
        HandshakeError: (a subclass of) the server refused the session.
        ConnectionLost: the server cannot be reached or the handshake broke.
    """

    def __init__(
        self,
        url: str,
        index: int = 0,
        options: ConnectionOptions = DEFAULT_OPTIONS,
    ) -> None:
        self.url = url
        self._liveness = options.liveness
        self._lock = threading.Lock()  # the pending batch, ids, state
        self._reading = threading.Condition(threading.Lock())  # leader/follower of replies
        self._reader: threading.Thread | None = None  # the thread reading replies now
        self._batch = Pending()  # under _lock, but its frees and drops
        self._tensor_ids = itertools.count(1)
        self.new_graph_id: Callable[[], int] = itertools.count(1).__next__  # graph ids
        self._request_ids = itertools.count(1)
        self._waiters: dict[int, Reply] = {}
        self._waiters_lock = threading.Lock()  # alone, so a reader never waits for a flush
        self._error: ConnectionLost | None = None
        self._batches = 0  # messages made (flushes)
        self._answered = 0  # the last of them known to have run (its request was answered)
        self._server_error: ServerProtocolError | None = None
        self._closing = False
        self._closed: Future[None] = Future()  # fails when the connection ends
        self._stop = threading.Event()
        self._pool = BufferPool(keep=options.pool_bytes)
        self._ws = open_transport(url, options)
        try:  # the socket keeps open_timeout until opened(): the handshake is bounded too
            self.welcome: Welcome = handshake(self._ws, url, index, self._receive)
        except BaseException:
            self._ws.close()
            raise
        self._ws.opened()
        self._keeper = threading.Thread(target=self._keep, name=f"tensorwire {url}", daemon=True)
        self._keeper.start()

    def _keep(self) -> None:
        """The keeper thread: watch the server (:meth:`_look`) and, while no thread reads,
        process what the socket holds (pongs, the server's pings)."""
        watch = Watch(self._liveness, time.monotonic())
        while not self._stop.wait(self._liveness.tick(KEEPALIVE_POLL)):
            self._pool.release_idle()
            if not self._look(watch):
                return
            with self._reading:
                if self._reader is not None:
                    continue
                self._reader = threading.current_thread()
            try:
                self._ws.poll()
            except Closed as exc:
                self._broken(exc)
                return
            finally:
                with self._reading:
                    self._reader = None
                    self._reading.notify_all()

    def _look(self, watch: Watch) -> bool:
        """Ping the server when due; give up on it (False) once it stopped answering."""
        ws, now = self._ws, time.monotonic()
        unanswered = self._batches - self._answered
        traffic = Traffic(ws.received_bytes, ws.sent_bytes, ws.send_lock.locked(), unanswered)
        with self._waiters_lock:
            waits = [r.waiting_since for r in self._waiters.values() if r.waiting_since is not None]
        reason = watch.look(now, traffic, min(waits, default=None))
        if reason is not None:  # fail everything, then cut: blocked readers and senders wake
            self._fail(ServerNotResponding(f"connection to {self.url} lost: {reason}"))
            self._ws.abort()
            return False
        if watch.ping_due(now) and ws.ping():
            watch.pinged(now)
        return True

    # --- receiving: whichever thread waits reads ---------------------------------------------

    def _receive(self) -> tuple[Any, list[Buffer]]:
        decoder = PooledDecoder(SERVER_ADAPTER, self._pool)
        self._ws.receive(decoder)  # large payloads land straight in the decoder's arrays
        return decoder.finish()

    def wait(self, reply: Future[Any]) -> None:
        """Return once ``reply`` is resolved, reading and dispatching replies meanwhile if no
        other thread is. Never raises; a broken connection resolves ``reply`` with its error.
        """
        reading = self._reading
        while True:
            with reading:
                while self._reader is not None and not reply.done():
                    reading.wait()
                if reply.done():
                    return
                self._reader = threading.current_thread()
            try:
                self._read_until(reply)
            finally:
                with reading:
                    self._reader = None
                    reading.notify_all()

    def _read_until(self, reply: Future[Any]) -> None:
        while not reply.done():
            try:
                message, buffers = self._receive()
            except Closed as exc:
                self._broken(exc, reply)
            except DecodeError as exc:
                self._broken(exc, reply)
                self._abandon(1002, "undecodable message")
            else:
                resolved = self._dispatch(message, buffers)
                if resolved is not None and resolved is not reply:
                    with self._reading:
                        self._reading.notify_all()

    def _dispatch(self, message: Any, buffers: list[Buffer]) -> Future[Any] | None:
        """Resolve the future that ``message`` answers, and return it (None if none); for a
        :class:`Dropped` message, fail the requests of the message it names, and return one."""
        if isinstance(message, SessionError):
            self._server_error = ServerProtocolError(message.error)
            return None
        if isinstance(message, Dropped):  # our message number .message ran no op at all
            error = ServerProtocolError(message.error)
            with self._waiters_lock:
                lost = take_batch(self._waiters, message.message)
            fail(lost, error)  # its requests will never be answered
            if not lost:
                self._server_error = error  # for the next check, as a SessionError's
            return lost[0] if lost else None  # so that the threads waiting for them look
        with self._waiters_lock:
            future = self._waiters.pop(message.request_id, None)
        if future is not None:  # the server ran its message, and every one before
            resolve(future, message, buffers)
            self._answered = max(self._answered, future.batch)
        return future

    def _broken(self, exc: BaseException, *also: Future[Any]) -> None:
        """Fail every pending reply (and ``also``) and every later call with ConnectionLost."""
        reason = "closed" if self._closing else f"lost ({exc})"
        code = None if self._closing else close_code(self._ws)
        self._fail(ConnectionLost(f"connection to {self.url} {reason}", code=code), *also)

    def _fail(self, error: ConnectionLost, *also: Future[Any]) -> None:
        """Fail every pending reply (and ``also``) and every later call with the connection's
        first error: ``error``, unless it failed before."""
        with self._waiters_lock:  # not _lock: a flush may hold it, waiting on the socket
            if self._error is None:
                self._error = error
            waiters, self._waiters = self._waiters, {}
        fail((*waiters.values(), *also, self._closed), self._error)
        with self._reading:
            self._reading.notify_all()

    # --- caller threads ---------------------------------------------------------------------

    def new_id(self) -> int:
        return next(self._tensor_ids)

    def submit(self, op: AnyOp) -> None:
        """Queue ``op``; it travels with the next flush.

        Raises:
            ConnectionLost: the connection is closed or broken.
        """
        frames: Frames | None = None
        with self._lock:
            self._check_open()
            batch = self._batch
            batch.ops.append(op)
            if len(batch.ops) >= FLUSH_OPS or len(batch.frees) >= FLUSH_OPS:
                frames = self._flush_locked(())
        if frames is not None:
            self._send(frames)

    def submit_upload(self, make_op: Callable[[int], AnyOp], data: memoryview) -> None:
        """Queue the op ``make_op(buffer_index)`` whose bytes are ``data``.

        Small uploads are copied at once; a large one is sent before this returns, so the
        caller may change its array afterwards either way.

        Raises:
            ConnectionLost: the connection is closed or broke before a large upload was sent.
        """
        self._queue(partial(self._batch.add_upload, make_op, data))

    def register_graph(self, graph_id: int, graph: GraphDef, data: Sequence[memoryview]) -> None:
        """Queue ``graph``'s registration under ``graph_id``; ``data`` are its constants' bytes,
        in order, taken as :meth:`submit_upload` takes an upload's. Raises as it does."""
        if self._batch.drops:  # a batch's drops apply after its registrations: make room first
            self.flush()
        self._queue(partial(self._batch.add_graph, graph_id, graph, data))

    def _queue(self, add: Callable[[], bool]) -> None:
        """Call ``add`` (True: a large buffer, sent before returning) and flush if need be."""
        frames: Frames | None = None
        with self._lock:
            self._check_open()
            large = add()
            if large or self._batch.buffered >= FLUSH_BYTES:
                frames = self._flush_locked(())
        if frames is not None:
            self._send(frames)
            if large and self._error is not None:
                raise self._error

    def release(self, tensor_id: int) -> None:
        """Free ``tensor_id`` on the server at the next flush. Safe from ``__del__``."""
        self._batch.frees.append(tensor_id)

    def drop_graph(self, graph_id: int) -> None:
        """Drop graph ``graph_id`` on the server at the next flush. Safe from ``__del__``."""
        self._batch.drops.append(graph_id)

    def request(self, make: Callable[[int], Request]) -> Reply:
        """Flush with the request ``make(request_id)``; the reply resolves with its answer.

        Raises:
            ConnectionLost: the connection is closed or broken.
        """
        future = Reply(self)
        with self._lock:
            self._check_open()
            request_id = next(self._request_ids)
            with self._waiters_lock:  # checked again here: _broken does not take _lock
                self._check_open()
                self._waiters[request_id] = future
            frames = self._flush_locked((make(request_id),))
            future.batch = self._batches
        self._send(frames)
        return future

    def flush(self) -> None:
        frames: Frames | None = None
        with self._lock:
            if self._error is None and self._batch:
                frames = self._flush_locked(())
        if frames is not None:
            self._send(frames)

    def take_server_error(self) -> ServerProtocolError | None:
        error, self._server_error = self._server_error, None
        return error

    def _check_open(self) -> None:
        if self._error is not None:
            raise self._error
        if self._closing:
            raise ConnectionLost(f"connection to {self.url} is closed")

    def _flush_locked(self, requests: tuple[Request, ...]) -> Frames:
        """Encode the pending batch and take the send lock, which the caller must release by
        passing the frames to :meth:`_send` once it has let go of ``_lock``.
        """
        self._batches += 1
        if not self._batch:
            self._ws.send_lock.acquire()  # under _lock: batches go out in the order made
            return [requests_only(requests)]
        messages = self._batch.messages(requests)  # more than one: many ids freed at once
        self._batches += len(messages) - 1
        frames = [to_frames(encode(*message)) for message in messages]
        self._ws.send_lock.acquire()  # under _lock: batches go out in the order they were made
        return frames

    def _send(self, frames: Frames) -> None:
        """Write a flush's batches and release the send lock taken by :meth:`_flush_locked`."""
        try:
            for message in frames:
                if self._error is None:
                    self._ws.send(message)
        except Closed as exc:
            self._broken(exc)
        finally:
            self._ws.release_send_lock()

    def close(self) -> None:
        """Flush what is pending and close the websocket (waiting at most
        :data:`CLOSE_TIMEOUT` for the server). Idempotent."""
        frames: Frames | None = None
        with self._lock:
            if self._closing:
                return
            if self._error is None and self._batch:
                frames = self._flush_locked(())
            self._closing = True
        if frames is not None:
            self._send(frames)
        self._abandon(1000, "")
        self._stop.set()
        self._ws.close()
        self._pool.clear()

    def _abandon(self, code: int, reason: str) -> None:
        """Close handshake: send a close frame, then read (as the reader) until the server
        closes the socket; cut it after :data:`CLOSE_TIMEOUT` (a server that stopped reading
        or answering). Every pending and later call fails with ConnectionLost."""
        timer = threading.Timer(CLOSE_TIMEOUT, self._ws.abort)
        timer.daemon = True
        try:
            timer.start()
        except RuntimeError:  # no new threads at interpreter shutdown: bound the reads instead
            self._ws.socket.settimeout(CLOSE_TIMEOUT)
        try:
            if self._ws.send_lock.acquire(timeout=CLOSE_TIMEOUT):  # no batch half sent
                try:
                    self._ws.send_close(code, reason)
                finally:
                    self._ws.release_send_lock()
            if threading.current_thread() is not self._keeper and not self._leading():
                self.wait(self._closed)
        finally:
            timer.cancel()
            self._ws.abort()
            self._broken(Closed("closed"))

    def _leading(self) -> bool:
        """Whether the calling thread is the reader now (it cannot wait for itself)."""
        return self._reader is threading.current_thread()
