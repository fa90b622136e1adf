"""Resuming a session whose connection was lost: when to try again (exponential backoff with
jitter, bounded in attempts and in time, as gRPC's clients reconnect), and the messages the
client keeps until the server has them (the client's side of protocol/README.md, "Resuming a
session": every message is applied exactly once, as Kafka's idempotent producer numbers its
records).

Below ``client._connection``, which keeps each message it sends in a :class:`Retained`, drops
what the server acknowledges (``Ack``, a reply, the welcome of a resumption) and sends the rest
again on the next connection, and which waits :meth:`Backoff.delays` between attempts.
"""

from __future__ import annotations

import collections
import random
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

RECONNECT_ATTEMPTS = 10  # connections tried after one is lost, at most
RECONNECT_TIMEOUT = 20.0  # seconds of trying, at most (a killed server is given up on in this)
BACKOFF_FIRST = 0.05  # seconds before the second attempt (the first goes at once)
BACKOFF_MAX = 2.0  # the longest wait between two attempts
BACKOFF_FACTOR = 1.6  # each wait this much longer than the one before (gRPC's multiplier)
JITTER = 0.2  # each wait drawn within +-20% (gRPC's), so clients cut together spread out

Message = Any  # one message's frames, as the transport sends them (client._connection.Frames)


@dataclass(frozen=True)
class Backoff:
    """How a connection tries again after it lost the server: up to ``attempts`` times within
    ``timeout`` seconds, the first at once, then after ``first`` seconds, growing by
    :data:`BACKOFF_FACTOR` to ``most`` seconds, each wait with :data:`JITTER`. ``attempts``
    0 turns resuming off: a lost connection ends the session.

    Raises:
        ValueError: a bound that is not a number in range.
    """

    attempts: int = RECONNECT_ATTEMPTS
    timeout: float = RECONNECT_TIMEOUT
    first: float = BACKOFF_FIRST
    most: float = BACKOFF_MAX

    def __post_init__(self) -> None:
        if not isinstance(self.attempts, int) or isinstance(self.attempts, bool):
            raise ValueError(f"reconnect_attempts must be an integer: {self.attempts!r}")
        if self.attempts < 0:
            raise ValueError(f"reconnect_attempts must be 0 or more: {self.attempts}")
        for name, value in (("timeout", self.timeout), ("backoff", self.first)):
            if not (isinstance(value, int | float) and value > 0):
                raise ValueError(f"reconnect_{name} must be a positive number: {value!r}")
        if not (isinstance(self.most, int | float) and self.most >= self.first):
            raise ValueError(
                f"reconnect_backoff_max must be at least reconnect_backoff: {self.most!r}"
            )

    def delays(self, rng: random.Random | None = None) -> Iterator[float]:
        """The wait before each attempt, in seconds: 0 for the first."""
        draw = (rng or random.Random()).uniform  # noqa: S311 - jitter, not a secret
        delay = self.first
        for attempt in range(self.attempts):
            if attempt == 0:
                yield 0.0
                continue
            yield delay * draw(1 - JITTER, 1 + JITTER)
            delay = min(delay * BACKOFF_FACTOR, self.most)


class Retained:
    """The messages sent and not known to have arrived: message number -> its frames
    (numbered from 1, across connections). Kept only while ``keep`` (the session can resume);
    the count goes on either way. Safe from any thread."""

    def __init__(self, keep: bool) -> None:
        self.keep = keep
        self.acked = 0  # messages the server has received whole (1..acked)
        self._kept: collections.deque[tuple[int, Message]] = collections.deque()
        self._lock = threading.Lock()

    def add(self, number: int, message: Message) -> None:
        if self.keep:
            with self._lock:
                self._kept.append((number, message))

    def ack(self, received: int) -> bool:
        """The server has messages 1..``received``: forget them. True when that is news."""
        with self._lock:
            if received <= self.acked:
                return False
            self.acked = received
            kept = self._kept
            while kept and kept[0][0] <= received:
                kept.popleft()
            return True

    def since(self, received: int) -> list[Message]:
        """The messages after number ``received``, in order, to send again."""
        self.ack(received)
        with self._lock:
            return [message for _, message in self._kept]

    def __len__(self) -> int:
        return len(self._kept)


__all__ = [
    "BACKOFF_FIRST",
    "BACKOFF_MAX",
    "RECONNECT_ATTEMPTS",
    "RECONNECT_TIMEOUT",
    "Backoff",
    "Retained",
]
