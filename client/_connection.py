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
request id before their batch is sent; whichever thread waits for one reads
(``client._receiving``). Nothing hangs: a reader or sender blocked on the socket wakes when it
is cut (by the keeper when the server stopped answering, by :meth:`Connection.close` after
:data:`CLOSE_TIMEOUT`). Large replies are received into pooled buffers, which the keeper lets go
of once idle.

Frees and graph drops are recorded without a lock (they come from ``__del__``, in any thread,
at any time); a batch's apply after its ops, so a free never overtakes an op that reads the id.

Sessions outlive their connection (``client._resuming``; protocol/README.md, "Resuming a
session"). Each message sent is numbered and kept until the server acknowledges it; a large
upload returns once it is acknowledged (it is kept as the caller's memory until then). When the
transport breaks (a send or a read fails, or the keeper gives up on a silent server), the first
thread to see it reconnects (:meth:`Connection._lost`, with backoff), resumes the session with
its secret, sends again what the server had not received and, holding ``_lock`` meanwhile,
swaps in the new transport; every other thread that saw the old one break waits for it and goes
on. The server sends again the replies this client had not received. Only when the session
cannot be resumed does every pending and later call fail, with :class:`SessionLost`.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from functools import partial
from typing import Any

from protocol import (
    FEATURE_RESUME,
    FEATURES,
    TensorMeta,
    Welcome,
    encode,
)
from protocol.codec import requests_only, to_frames
from protocol.graphs import GraphDef
from protocol.messages import Request
from protocol.ops import AnyOp

from ._holding import HeldRequests
from ._liveness import Traffic, Watch
from ._opening import close_code, handshake, open_transport
from ._options import DEFAULT_OPTIONS, ConnectionOptions
from ._pending import Pending
from ._recovery import Recovering
from ._resuming import Retained
from ._segments import segmenter
from ._stats import SegmentStats
from ._transport import Closed, Transport
from .errors import ConnectionLost, DeviceClosedError, ServerNotResponding, SessionLost

FLUSH_OPS = 2048
FLUSH_BYTES = 1 << 20
CLOSE_TIMEOUT = 10.0
KEEPALIVE_POLL = 1.0  # seconds between the keeper's looks at an idle socket (server pings)
RETAINED_MOST = 64  # messages kept unacknowledged before a sender waits for the server

Frames = list[bytes | list[bytes | memoryview]]  # messages, each one frame or its fragments
Sending = tuple[Transport, int, Frames]  # a flush: the transport, its generation, the messages


class Connection(Recovering, HeldRequests):
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
        self._index = index
        self._options = options
        self._liveness = options.liveness
        super().__init__(url, options.pool_bytes, options.bounded_replies)  # reading, resuming
        self._lock = threading.Lock()  # the pending batch, ids, state
        self._batch = Pending()  # under _lock, but its frees and drops
        self._tensor_ids = itertools.count(1)
        self.new_graph_id: Callable[[], int] = itertools.count(1).__next__  # graph ids
        self._request_ids = itertools.count(1)
        self.writes = 0  # in-place ops and graph runs queued (client._known)
        self._batches = 0  # messages made (flushes)
        self._closing = False
        self._stop = threading.Event()
        self._acked_to_server = 0  # the ack the last flush carried
        self._ws = open_transport(url, options)
        try:  # the socket keeps open_timeout until opened(): the handshake is bounded too
            receive = partial(self._receive, self._ws)
            resuming = options.backoff.attempts > 0  # not resuming: say so
            features = tuple(f for f in FEATURES if resuming or f != FEATURE_RESUME)
            self.welcome: Welcome = handshake(self._ws, url, index, receive, features=features)
        except BaseException:
            self._ws.close()
            raise
        self._ws.opened()
        self._batch.limit = self.welcome.max_message_size  # the server's, if it said
        self._current = (self._ws, self._generation)
        resumable = self.welcome.resume_secret is not None and options.backoff.attempts > 0
        self._sent = Retained(keep=resumable)  # the messages the server may not have yet
        self._segments = segmenter(options.segment_replay, self.welcome.features, self.new_graph_id)
        self.segment_metas: dict[int, TensorMeta] | None = None  # noted by device.new_handle
        if self._segments is not None:
            self._graph_refused, self._message_dropped = (
                self._segments.refused,
                self._segments.dropped,
            )
            self.segment_metas = self._segments.metas
        self._keeper = threading.Thread(target=self._keep, name=f"tensorwire {url}", daemon=True)
        self._keeper.start()

    def _keep(self) -> None:
        """The keeper thread: watch the server (:meth:`_look`) and, while no thread reads,
        process what the socket holds (pongs, the server's pings, acknowledgements)."""
        watch = Watch(self._liveness, time.monotonic())
        while not self._stop.wait(self._liveness.tick(KEEPALIVE_POLL)):
            self._pool.release_idle()
            if not self._look(watch):
                return
            self._acknowledge()
            self._poll()
            if self._error is not None:
                return

    def _look(self, watch: Watch) -> bool:
        """Ping the server when due; give up on it (False) once it stopped answering and the
        session could not be resumed."""
        (ws, generation), now = self._current, time.monotonic()
        unanswered = self._batches - self._answered
        traffic = Traffic(ws.received_bytes, ws.sent_bytes, ws.send_lock.locked(), unanswered)
        with self._waiters_lock:  # replies, and acknowledgements a sender waits for
            waiting = [*self._waiters.values(), *self._ack_waits]
        waits = [r.waiting_since for r in waiting if r.waiting_since is not None]
        reason = watch.look(now, traffic, min(waits, default=None))
        if reason is not None and not watch.unanswered_ping:  # a call waited past timeout:
            self._fail(ServerNotResponding(f"connection to {self.url} lost: {reason}"))
            ws.abort()  # blocked readers and senders wake
            return False
        if reason is not None:  # a silent connection (a stopped server, or a dead path): cut
            # it (blocked readers and senders wake, after _lost took its lock, so this cause
            # is the one that bounds the resumption) and resume, or fail
            self._lost(generation, ServerNotResponding(f"connection to {self.url} lost: {reason}"))
            if self._error is not None:
                return False
            watch.__init__(self._liveness, time.monotonic())  # type: ignore[misc]
            return True
        if watch.ping_due(now) and ws.ping():
            watch.pinged(now)
        return True

    def _acknowledge(self) -> None:
        """Tell the server which of its messages arrived, if no batch said so since: it
        forgets those (a kept read reply holds memory)."""
        if not (self._sent.keep and self._received > self._acked_to_server):
            return
        if not self._lock.acquire(blocking=False):
            return  # a flush is under way: it carries the ack
        frames: Sending | None = None
        try:  # never wait for a send here: the keeper would stop watching the server
            if self._error is None and not self._closing and not self._ws.send_lock.locked():
                frames = self._flush_locked(())
        finally:
            self._lock.release()
        if frames is not None:
            self._send(frames)

    def _broken(self, exc: BaseException, *also: Future[Any]) -> None:
        """Fail every pending reply (and ``also``) and every later call with ConnectionLost
        (a session the server ended: SessionLost)."""
        if self._closing:
            self._fail(DeviceClosedError(self.url), *also)
            return
        code = close_code(self._ws)
        message = f"connection to {self.url} lost ({exc})"
        if code is not None:
            self._fail(SessionLost(message, "dropped", code), *also)
        else:
            self._fail(ConnectionLost(message, code=code), *also)

    # --- caller threads ---------------------------------------------------------------------

    def new_id(self) -> int:
        return next(self._tensor_ids)

    def submit(self, op: AnyOp) -> None:
        """Queue ``op``; it travels with the next flush.

        Raises:
            ConnectionLost: the connection is closed or broken.
        """
        frames: Sending | None = None
        with self._lock:
            self._check_open()
            batch = self._batch
            batch.ops.append(op)
            self.writes += op.inplace or op.kind == "run_graph"  # what the client knew may change
            if len(batch.ops) >= FLUSH_OPS or len(batch.frees) >= FLUSH_OPS:
                frames = self._flush_locked(())
        if frames is not None:
            self._send(frames)
            self._bound_unacknowledged()

    def submit_upload(self, make_op: Callable[[int], AnyOp], data: memoryview) -> None:
        """Queue the op ``make_op(buffer_index)`` whose bytes are ``data``.

        Small uploads are copied at once; a large one is sent before this returns (and, for a
        session that can resume, received by the server: it may be sent again until then), so
        the caller may change its array afterwards either way.

        Raises:
            ConnectionLost: the connection is closed or broke before a large upload was sent.
            MessageTooLargeError: ``data`` cannot fit in a message the server takes.
        """
        self._queue(partial(self._batch.add_upload, make_op, data), (data,))

    def register_graph(self, graph_id: int, graph: GraphDef, data: Sequence[memoryview]) -> None:
        """Queue ``graph``'s registration under ``graph_id``; ``data`` are its constants' bytes,
        in order, taken as :meth:`submit_upload` takes an upload's. Raises as it does."""
        if self._batch.drops:  # a batch's drops apply after its registrations: make room first
            self.flush()
        self._queue(partial(self._batch.add_graph, graph_id, graph, data), data)

    def _queue(self, add: Callable[[], bool], data: Sequence[memoryview]) -> None:
        """Call ``add`` (True: a large buffer, sent before returning) and flush if need be; first
        send the batch if the buffers ``data`` would take it past the server's limit."""
        if self._batch.needs_room(data):
            self.flush()
        frames: Sending | None = None
        with self._lock:
            self._check_open()
            large = add()
            number = self._batches + 1  # the message that carries the buffers (the first)
            if large or self._batch.buffered >= FLUSH_BYTES:
                frames = self._flush_locked(())
        if frames is not None:
            self._send(frames)
            if large and self._sent.keep:
                self._wait_acked(number)  # the caller's memory is kept until then
            if large and self._error is not None:
                raise self._error
            self._bound_unacknowledged()

    def _bound_unacknowledged(self) -> None:
        """Wait, past :data:`RETAINED_MOST` messages kept, until the server has half of them:
        a sender that never reads keeps no more than that."""
        if len(self._sent) > RETAINED_MOST:
            self._wait_acked(self._batches - RETAINED_MOST // 2)

    def segment_stats(self) -> SegmentStats:
        """What segment replay did in this session (``client._segments``)."""
        return SegmentStats() if self._segments is None else self._segments.stats()

    def release(self, tensor_id: int) -> None:
        """Free ``tensor_id`` on the server at the next flush. Safe from ``__del__``."""
        self._batch.frees.append(tensor_id)

    def drop_graph(self, graph_id: int) -> None:
        """Drop graph ``graph_id`` on the server at the next flush. Safe from ``__del__``."""
        self._batch.drops.append(graph_id)

    def flush(self) -> None:
        frames: Sending | None = None
        with self._lock:
            if self._error is None and self._batch:
                frames = self._flush_locked(())
        if frames is not None:
            self._send(frames)
            self._bound_unacknowledged()

    def _check_open(self) -> None:
        if self._error is not None:
            raise self._error
        if self._closing:
            raise DeviceClosedError(self.url)

    def _flush_locked(self, requests: tuple[Request, ...]) -> Sending:
        """Encode the pending batch, number and keep its messages, and take the send lock,
        which the caller must release by passing the result to :meth:`_send` once it has let
        go of ``_lock``.
        """
        ack = self._acked_to_server = self._received
        segments, registration = self._segments, None
        if segments is not None:  # a segment replayed, or registered by a message of its own
            registration = segments.flush(self._batch, requests, self._answered, ack)
        frames: Frames = [] if registration is None else [to_frames(encode(registration))]
        if not self._batch:
            frames.append(requests_only(requests, ack))
        else:  # more than one message: many ids freed at once
            messages = self._batch.messages(requests, ack)
            if segments is not None:
                for batch, _ in messages:
                    segments.forget(batch.frees)
            frames += [to_frames(encode(*message)) for message in messages]
        for message in frames:
            self._batches += 1
            self._sent.add(self._batches, message)
        if segments is not None and registration is not None:
            segments.sent(self._batches - len(frames) + 1, self._batches)
        ws = self._ws
        ws.send_lock.acquire()  # under _lock: batches go out in the order they were made
        return ws, self._generation, frames

    def _send(self, sending: Sending) -> None:
        """Write a flush's batches and release the send lock taken by :meth:`_flush_locked`;
        resume the session if the transport broke (it sends them again)."""
        self._send_held(*sending)

    def close(self) -> None:
        """Flush what is pending and close the websocket (waiting at most
        :data:`CLOSE_TIMEOUT` for the server). Idempotent."""
        frames: Sending | None = None
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
