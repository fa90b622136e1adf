"""The owner's side of receiving on the server's wire: whole messages queue up in arrival order,
the connection loop takes them one by one with an idle timeout, and the socket stops being read
while too many wait (so TCP pushes back on a client that sends faster than it is answered).

The parser (``server/wire.py``) calls :meth:`ReceivingConnection.deliver` with each whole
message, and provides the hooks below.

A message header over :data:`STEPWISE_HEADER` bytes is validated in slices of
:data:`HEADER_SLICE` seconds of the loop's time (:meth:`ReceivingConnection.hold`), each a
callback of its own, so that every other connection is served between them; meanwhile this
one is held: its socket is not read and nothing more is parsed. Pydantic holds the GIL while it
validates, so a worker thread would not free the loop (bench/REASONS.md, 'Header validated in
slices').

The loop is shared in turns (bench/REASONS.md, 'Turns of the event loop'): a connection whose
messages wait for its owner is in its loop's :func:`queued` set; while another connection is
there, the owner takes queued messages for :data:`SHARED_TURN` before the loop has a turn (and
inline ops run in short slices, ``Session.step(contended=True)``), else for :data:`OWNER_TURN`,
so that a lone client's batches run whole. A connection that is its loop's only one
(:meth:`ReceivingConnection.alone`) may also run a small graph on the loop
(``Session.step(alone=True)``).
"""

from __future__ import annotations

import asyncio
import collections
import math
import time
import weakref
from collections.abc import Callable
from typing import Any

from protocol import Batch

from .incoming import MessageBeingRead, Received, step_header
from .websocket import WebSocket

QUEUE_HIGH = 8  # default of max_waiting
STEPWISE_HEADER = 1 << 18  # a longer header is validated in slices (a client sends 2048 ops: less)
HEADER_SLICE = 0.001  # seconds of validating a header before other callbacks have a turn
OWNER_TURN = 0.02  # seconds the owner may take queued messages before the loop has a turn
SHARED_TURN = 0.002  # ... while another connection's messages wait too
# Parsed items (ops, frees, requests, graphs) of the messages waiting, before reading stops:
# parsed ops are Python objects that no quota counts, many times their bytes on the wire
# (bench/REASONS.md, 'Queued items'), so the queue is bounded by what it holds as well as by
# its length. 8 client batches of 2048 ops (16k items) stay under it.
QUEUED_ITEMS = 32_768


_queued: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, weakref.WeakSet[Any]] = (
    weakref.WeakKeyDictionary()
)


_open: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, weakref.WeakSet[Any]] = (
    weakref.WeakKeyDictionary()
)


def queued(loop: asyncio.AbstractEventLoop) -> weakref.WeakSet[Any]:
    """The connections of ``loop`` whose messages wait for their owners (weakly: a connection
    dropped with messages still queued leaves the set with its last reference)."""
    return _of(_queued, loop)


def _of(
    sets: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, weakref.WeakSet[Any]],
    loop: asyncio.AbstractEventLoop,
) -> weakref.WeakSet[Any]:
    found = sets.get(loop)
    if found is None:
        found = sets[loop] = weakref.WeakSet()
    return found


class ReceivingConnection(WebSocket):
    """A connection whose decoded messages wait in a queue for :meth:`receive`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.max_waiting = QUEUE_HIGH  # whole messages waiting before reading stops
        self.reading_paused = False
        self.holding = False  # a header is validated in slices (see hold)
        self._messages: collections.deque[Received] = collections.deque()
        self._delivered = 0  # whole messages so far: the next one's Received.number
        self._sealed = False  # taken over by a resuming connection: nothing more is delivered
        self._items = 0  # parsed items of the messages waiting (QUEUED_ITEMS)
        self._waiter: asyncio.Future[None] | None = None
        self._idle_at = 0.0  # when the wait in progress times out (see receive)
        self._within = math.inf  # that wait's timeout
        self._idle_timer: asyncio.TimerHandle | None = None
        self._turn_at = 0.0  # when the owner last waited, or last gave the loop a turn
        self._queued = queued(self.loop)  # the loop's connections with messages waiting
        self._open = _of(_open, self.loop)  # its connections made and not lost yet
        # Set by the owner: answers a message in the callback that delivers it, while the owner
        # waits in receive with nothing queued; True when it did (see deliver)
        self.answer_now: Callable[[Received], bool] | None = None

    # --- hooks the parser provides ------------------------------------------------------------

    def stuck(self) -> bool:
        """Whether held bytes fill the receive buffer."""
        return False

    def at_rest(self) -> None:
        """Nothing waits: a chance to shrink buffers."""

    def parse(self) -> None:
        """Parse the bytes that wait (after :meth:`hold`)."""

    # --- the parser's side --------------------------------------------------------------------

    @property
    def delivered(self) -> int:
        """The number of the last whole message delivered (the hello's is 0)."""
        return self._delivered - 1

    def seal(self) -> None:
        """Deliver nothing more (a resuming connection took the session over: what this one
        delivered so far is the session's, and the client sends the rest again there)."""
        self._sealed = True

    def number_from(self, first: int) -> None:
        """Number the messages delivered from now on ``first``, ``first + 1``, ...: a resumed
        session's, which go on from its earlier connections'."""
        self._delivered = first

    @property
    def waiting(self) -> int:
        """Whole messages received and not taken by :meth:`receive` yet."""
        return len(self._messages)

    def alone(self) -> bool:
        """Whether this is its loop's only connection (any other, even one still opening,
        could wait behind what this one's owner runs)."""
        return len(self._open) <= (self in self._open)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._open.add(self)  # here, not at init: a failed TLS handshake makes it never lost

    def connection_lost(self, exc: Exception | None) -> None:
        self._open.discard(self)
        super().connection_lost(exc)

    def contended(self) -> bool:
        """Whether another connection's messages wait for this loop (see the module
        docstring)."""
        return len(self._queued) > (self in self._queued)

    def deliver(self, message: Received) -> None:
        """A whole message arrived: queue it and wake the owner (and stop reading the socket
        once ``max_waiting`` messages wait). While the owner waits in :meth:`receive` with
        nothing queued, :attr:`answer_now` may answer it here instead, which saves the owner's
        task a turn of the event loop; the wait's idle timeout then starts again."""
        if self._sealed:
            return
        message.number, self._delivered = self._delivered, self._delivered + 1
        waiter, answer = self._waiter, self.answer_now
        if (
            answer is not None
            and waiter is not None
            and not waiter.done()
            and not self._messages
            and answer(message)
        ):
            self._idle_at = self.loop.time() + self._within  # inf without a timeout
            return
        if not self._messages:
            self._queued.add(self)
        self._messages.append(message)
        self._items += _items(message)
        self._wake()
        if len(self._messages) >= self.max_waiting or self._items >= QUEUED_ITEMS:
            self.update_reading()

    def hold(self, message: MessageBeingRead, then: Callable[[], None]) -> None:
        """Validate ``message``'s header in slices (see the module docstring), holding the
        connection meanwhile; then call ``then()`` (the parser takes up where it stopped) and
        :meth:`parse` on. Nothing more happens once the connection is closed."""
        self.holding = True
        self.update_reading()
        self.loop.call_soon(self._hold_turn, message, then)

    def _hold_turn(self, message: MessageBeingRead, then: Callable[[], None]) -> None:
        if self.is_closed or self._sealed:
            return
        try:
            done = step_header(message, time.monotonic() + HEADER_SLICE)
        except Exception:
            self.abort()  # a bug: end the connection, as asyncio does for an error in a read
            raise
        if not done:
            self.loop.call_soon(self._hold_turn, message, then)
            return
        self.holding = False
        then()
        self.parse()
        self.update_reading()

    def update_reading(self) -> None:
        """Stop reading the socket while ``max_waiting`` messages wait, held bytes fill the
        buffer or a header is validated (:meth:`hold`); read again once none holds."""
        want = (
            len(self._messages) >= self.max_waiting
            or self._items >= QUEUED_ITEMS
            or self.holding
            or self.stuck()
        )
        if want != self.reading_paused:
            self.reading_paused = want
            if want:
                self.transport.pause_reading()
            else:
                self.transport.resume_reading()

    def stop_waiting(self) -> None:
        """The connection is lost: wake the owner, and drop the idle timer (it holds this
        connection until it fires)."""
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None
        self._wake()

    # --- the owner's side ---------------------------------------------------------------------

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def _idle_check(self) -> None:
        """The idle timer: wake a wait that began ``within`` seconds ago or more. One timer
        serves every wait: it is armed for the first and, when it fires during a later one,
        armed again for that one's deadline, instead of a timer made and cancelled per wait
        (bench/REASONS.md, 'One idle timer')."""
        self._idle_timer = None
        if self._waiter is None or self._idle_at == math.inf:
            return  # not waiting, or waiting without a timeout: the next timed wait arms it
        if self.loop.time() < self._idle_at:
            self._idle_timer = self.loop.call_at(self._idle_at, self._idle_check)
        else:
            self._wake()

    async def receive(self, within: float | None = None) -> Received | None:
        """The next whole message, or None once ``within`` seconds pass without one (a timer
        of the loop's, see :meth:`_idle_check`: cheaper than a cancel scope).

        Raises:
            ConnectionClosed: the connection closed and every message was taken.
        """
        if not self._messages:
            if self.is_closed:
                raise self.closed_error()
            self.at_rest()
            self._waiter = self.loop.create_future()
            self._within = math.inf if within is None else within
            if within is None:
                self._idle_at = math.inf
            else:
                self._idle_at = self.loop.time() + within
                if self._idle_timer is None:
                    self._idle_timer = self.loop.call_at(self._idle_at, self._idle_check)
            try:
                await self._waiter
            finally:
                self._waiter = None
            self._turn_at = self.loop.time()  # the owner's run of messages starts
            if not self._messages:
                if self.is_closed:
                    raise self.closed_error()
                return None
        elif self.loop.time() > self._turn_at + (  # message after message, without waiting:
            SHARED_TURN if self.contended() else OWNER_TURN  # a turn of the loop for the others
        ):
            await asyncio.sleep(0)
            self._turn_at = self.loop.time()
        item = self._messages.popleft()
        if not self._messages:
            self._queued.discard(self)
        self._items -= _items(item)
        if self.reading_paused:
            self.update_reading()
        return item


def _items(received: Received) -> int:
    """What a waiting message holds, in parsed items (see :data:`QUEUED_ITEMS`)."""
    batch = received.message
    if not isinstance(batch, Batch):
        return 0
    return len(batch.ops) + len(batch.frees) + len(batch.requests) + len(batch.graphs)


__all__ = ["ReceivingConnection"]
