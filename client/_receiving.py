"""The reading side of a connection: whichever thread waits for a reply reads the socket
(leader/follower), and every message read goes to what it answers.

Below ``client._connection`` (whose :class:`~client._connection.Connection` is one of these),
above the replies' futures (``client._replies``) and the kept messages (``client._resuming``).

A thread that waits for a :class:`Reply` becomes the reader if none is (:meth:`Receiving.wait`)
and dispatches every message it receives, its own and other threads', until its own has come;
other waiters sleep until theirs is resolved or the reader steps down. A reply resolves its
request's future and acknowledges the client's messages up to the one that carried it; an
``Ack`` or a ``Dropped`` acknowledges too (the kept messages are forgotten, and a sender waiting
for that wakes); every message but an ``Ack`` counts as received, which the next batch tells the
server. When the connection breaks, the subclass resumes the session or fails every pending
reply and every later call (:meth:`Receiving._fail`): nothing hangs.

A reply's bytes are bounded before they are allocated (:meth:`Receiving._allowed`, called by the
decoder once the header is read): by what its request allowed (``Reply.most_bytes``), and on a
connection with ``bounded_replies`` (a server's pulls) every message that carries bytes must
answer such a request. One that declares more cuts the connection: a peer that lies about a
reply's size makes the pulling server allocate nothing for it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from protocol import (
    SERVER_ADAPTER,
    Ack,
    DecodeError,
    Dropped,
    GraphRefused,
    MessageLimitError,
    SessionError,
)
from protocol.codec import Buffer

from ._buffers import BufferPool, PooledDecoder
from ._replies import Reply, fail, resolve, take_batch
from ._resuming import Retained
from ._transport import Closed, Transport
from .errors import ConnectionLost, ServerProtocolError


class Receiving:
    """What a connection to ``url`` reads, and who waits for it; received buffers come from a
    pool that keeps ``pool_bytes`` for reuse. ``bounded_replies``: see the module docstring."""

    _ws: Transport  # the transport now (the subclass opens it)
    _generation: int  # which one it is: the subclass counts them
    _current: tuple[Transport, int]  # both, set together: read as one

    def __init__(self, url: str, pool_bytes: int, bounded_replies: bool = False) -> None:
        self.url = url
        self._bounded = bounded_replies
        self._reading = threading.Condition(threading.Lock())  # leader/follower of replies
        self._reader: threading.Thread | None = None  # the thread reading replies now
        self._waiters: dict[int, Reply] = {}
        self._waiters_lock = threading.Lock()  # alone, so a reader never waits for a flush
        self._error: ConnectionLost | None = None
        self._answered = 0  # the last message known to have run (its request was answered)
        self._server_error: ServerProtocolError | None = None
        self._closed: Future[None] = Future()  # fails when the connection ends
        self._pool = BufferPool(keep=pool_bytes)
        self._received = 0  # numbered server messages received whole, across connections
        self._sealed = -1  # transports up to this one count no more messages (being resumed)
        self._ack_waits: list[Reply] = []  # under _waiters_lock: each done once acked
        self._sent = Retained(keep=False)  # the messages the server may not have yet
        # the graph a GraphRefused names goes here (client._segments), when the session has it
        self._graph_refused: Callable[[int], None] | None = None
        # a Dropped's number goes here: True if it was a registration's own (nothing else lost)
        self._message_dropped: Callable[[int], bool] | None = None

    # --- what the subclass does when the connection breaks ------------------------------------

    def _lost(self, generation: int, exc: BaseException, *also: Future[Any]) -> None:
        """Transport number ``generation`` broke: resume, or fail everything (and ``also``)."""
        raise NotImplementedError

    def _broken(self, exc: BaseException, *also: Future[Any]) -> None:
        """Fail everything (and ``also``): the session cannot go on."""
        raise NotImplementedError

    def _abandon(self, code: int, reason: str) -> None:
        """Close the connection with ``code`` and ``reason``."""
        raise NotImplementedError

    # --- reading --------------------------------------------------------------------------------

    def _receive(self, ws: Transport) -> tuple[Any, list[Buffer]]:
        decoder = PooledDecoder(SERVER_ADAPTER, self._pool, self._allowed)
        ws.receive(decoder)  # large payloads land straight in the decoder's arrays
        return decoder.finish()

    def _decode(self, payload: bytearray) -> tuple[Any, list[Buffer]]:
        """A whole message taken by :meth:`Transport.poll`, decoded."""
        decoder = PooledDecoder(SERVER_ADAPTER, self._pool, self._allowed)
        decoder.feed(payload)
        return decoder.finish()

    def _allowed(self, message: Any) -> None:
        """Refuse ``message`` if it declares more buffer bytes than the request it answers
        allowed (on a bounded connection: any, unless it answers a request that allowed them).

        Raises:
            MessageLimitError: it declares too many; nothing was allocated for them.
        """
        declared = sum(message.buffer_sizes())
        if not declared:
            return
        with self._waiters_lock:
            reply = self._waiters.get(getattr(message, "request_id", -1))
        most = None if reply is None else reply.most_bytes
        if most is None:
            if not self._bounded:
                return
            most = 0
        if declared > most:
            asked = f"its request allows {most}" if reply is not None else "it answers no request"
            raise MessageLimitError(
                f"a reply declares {declared} bytes where {asked}: refused before any is allocated"
            )

    def _poll(self) -> None:
        """Unless a thread reads, read what the socket holds now, without blocking, and
        dispatch its whole small messages (acknowledgements, small replies): the keeper's."""
        with self._reading:
            if self._reader is not None:
                return
            self._reader = threading.current_thread()
        ws, generation = self._current
        try:
            for payload in ws.poll():
                self._dispatch(*self._decode(payload), generation)
        except Closed as exc:
            self._lost(generation, exc)
        except DecodeError as exc:
            self._broken(exc)
        finally:
            with self._reading:
                self._reader = None
                self._reading.notify_all()

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
            ws, generation = self._current
            try:
                message, buffers = self._receive(ws)
            except Closed as exc:
                self._lost(generation, exc, reply)
            except MessageLimitError as exc:
                self._broken(exc, reply)
                self._abandon(1009, "a reply larger than its request allows")
            except DecodeError as exc:
                self._broken(exc, reply)
                self._abandon(1002, "undecodable message")
            else:
                resolved = self._dispatch(message, buffers, generation)
                if resolved is not None and resolved is not reply:
                    with self._reading:
                        self._reading.notify_all()

    def _seal(self, generation: int) -> int:
        """Count nothing more from transport ``generation`` (the session is being resumed on
        another, where the server sends again what was not counted); how many numbered
        messages were."""
        with self._waiters_lock:
            self._sealed = generation
            return self._received

    def _counted(self, generation: int) -> bool:
        """Count one numbered message read from transport ``generation``: False (drop it) if
        that transport was sealed, as the server sends it again on the next."""
        with self._waiters_lock:
            if generation <= self._sealed:
                return False
            self._received += 1
            return True

    def _dispatch(self, message: Any, buffers: list[Buffer], generation: int) -> Future[Any] | None:
        """Resolve the future that ``message`` answers, and return it (None if none); for a
        :class:`Dropped` message, fail the requests of the message it names, and return one."""
        if isinstance(message, Ack):
            return self._acked(message.received)
        if not self._counted(generation):  # a numbered message: the server keeps it until
            return None  # acknowledged, and sends it again on the resumed transport
        if isinstance(message, SessionError):
            self._server_error = ServerProtocolError(message.error)
            return None
        if isinstance(message, GraphRefused):  # before the reply that confirms it
            if self._graph_refused is not None:
                self._graph_refused(message.graph_id)
            return None
        if isinstance(message, Dropped):  # our message number .message ran no op at all
            self._acked(message.message)
            if self._message_dropped is not None and self._message_dropped(message.message):
                return None
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
            self._acked(future.batch)
        return future

    def _acked(self, received: int) -> Future[Any] | None:
        """The server has the client's messages 1..``received``: forget them, and wake the
        senders waiting for that (one of whose replies is returned)."""
        if not self._sent.ack(received):
            return None
        with self._waiters_lock:
            done = [r for r in self._ack_waits if r.batch <= received]
            self._ack_waits = [r for r in self._ack_waits if r.batch > received]
        for reply in done:
            reply.set_result(None)
        return done[0] if done else None

    def _wait_acked(self, number: int) -> None:
        """Return once the server has received message ``number`` (reading meanwhile if no
        other thread does).

        Raises:
            ConnectionLost: the session was lost first.
        """
        reply = Reply(self)
        reply.batch = number
        with self._waiters_lock:
            if self._error is not None:
                raise self._error
            if self._sent.acked >= number:
                return
            self._ack_waits.append(reply)
        reply.result()

    def _fail(self, error: ConnectionLost, *also: Future[Any]) -> None:
        """Fail every pending reply (and ``also``) and every later call with the connection's
        first error: ``error``, unless it failed before."""
        with self._waiters_lock:  # not _lock: a flush may hold it, waiting on the socket
            if self._error is None:
                self._error = error
            waiters, self._waiters = self._waiters, {}
            acks, self._ack_waits = self._ack_waits, []
        fail((*waiters.values(), *acks, *also, self._closed), self._error)
        with self._reading:
            self._reading.notify_all()

    def take_server_error(self) -> ServerProtocolError | None:
        error, self._server_error = self._server_error, None
        return error

    def _leading(self) -> bool:
        """Whether the calling thread is the reader now (it cannot wait for itself)."""
        return self._reader is threading.current_thread()


__all__ = ["Receiving"]
