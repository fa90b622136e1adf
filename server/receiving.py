"""The owner's side of receiving on the server's wire: whole messages queue up in arrival order,
the connection loop takes them one by one with an idle timeout, and the socket stops being read
while too many wait (so TCP pushes back on a client that sends faster than it is answered).

The parser (``server/wire.py``) calls :meth:`ReceivingConnection.deliver` with each whole
message, and provides the two hooks below.
"""

from __future__ import annotations

import asyncio
import collections
import math
from collections.abc import Callable
from typing import Any

from .incoming import Received
from .websockets_adapter import AdaptedConnection

QUEUE_HIGH = 8  # default of max_waiting


class ReceivingConnection(AdaptedConnection):
    """A connection whose decoded messages wait in a queue for :meth:`receive`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.max_waiting = QUEUE_HIGH  # whole messages waiting before reading stops
        self.reading_paused = False
        self._messages: collections.deque[Received] = collections.deque()
        self._waiter: asyncio.Future[None] | None = None
        self._idle_at = 0.0  # when the wait in progress times out (see receive)
        self._within = math.inf  # that wait's timeout
        self._idle_timer: asyncio.TimerHandle | None = None
        # Set by the owner: answers a message in the callback that delivers it, while the owner
        # waits in receive with nothing queued; True when it did (see deliver)
        self.answer_now: Callable[[Received], bool] | None = None

    # --- hooks the parser provides ------------------------------------------------------------

    def stuck(self) -> bool:
        """Whether held bytes fill the receive buffer."""
        return False

    def at_rest(self) -> None:
        """Nothing waits: a chance to shrink buffers."""

    # --- the parser's side --------------------------------------------------------------------

    @property
    def waiting(self) -> int:
        """Whole messages received and not taken by :meth:`receive` yet."""
        return len(self._messages)

    def deliver(self, message: Received) -> None:
        """A whole message arrived: queue it and wake the owner (and stop reading the socket
        once ``max_waiting`` messages wait). While the owner waits in :meth:`receive` with
        nothing queued, :attr:`answer_now` may answer it here instead, which saves the owner's
        task a turn of the event loop; the wait's idle timeout then starts again."""
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
        self._messages.append(message)
        self._wake()
        if len(self._messages) >= self.max_waiting:
            self.update_reading()

    def update_reading(self) -> None:
        """Stop reading the socket while ``max_waiting`` messages wait or held bytes fill the
        buffer; read again once neither holds."""
        want = len(self._messages) >= self.max_waiting or self.stuck()
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
        armed again for that one's deadline (a timer made and cancelled per wait cost 3-4% of
        the server's CPU on small reads)."""
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
            if not self._messages:
                if self.is_closed:
                    raise self.closed_error()
                return None
        item = self._messages.popleft()
        if self.reading_paused:
            self.update_reading()
        return item


__all__ = ["ReceivingConnection"]
