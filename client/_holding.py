"""A connection's requests: each flushed at once with the pending batch, or held back to go
out together (``together``): a read, the reads sent along with it and the session's stats, or
the describes of one op's outputs, in one message, which the server takes in once."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from protocol.messages import Request

from ._replies import Reply
from .errors import ConnectionLost


class HeldRequests:
    """The part of a connection that makes requests: each sent at once, or one thread's held
    until its ``together()`` ends, then flushed as one message."""

    _lock: threading.Lock
    _error: ConnectionLost | None
    _batches: int
    _request_ids: Iterator[int]
    _waiters_lock: threading.Lock
    _waiters: dict[int, Reply]

    _held: list[tuple[Request, Reply]] | None = None  # under _lock; None: none held
    _holder = 0  # the thread whose together() holds them

    if TYPE_CHECKING:  # the connection's

        def _flush_locked(self, requests: tuple[Request, ...]) -> Any: ...
        def _send(self, sending: Any) -> None: ...
        def _check_open(self) -> None: ...
        def wait(self, reply: Future[Any]) -> None: ...

    def request(self, make: Callable[[int], Request], most_bytes: int | None = None) -> Reply:
        """Flush with the request ``make(request_id)``; the reply resolves with its answer. A
        reply that declares more than ``most_bytes`` bytes (None: any) is refused as its header
        arrives, before any buffer for it is allocated, and the connection is cut (its place
        in the stream is lost): every pending and later call fails with ConnectionLost.

        Raises:
            ConnectionLost: the connection is closed or broken.
        """
        future = Reply(self)
        future.most_bytes = most_bytes
        with self._lock:
            self._check_open()
            request_id = next(self._request_ids)
            with self._waiters_lock:  # checked again here: _broken does not take _lock
                self._check_open()
                self._waiters[request_id] = future
            if self._holding(make, request_id, future):  # sent as together() ends
                return future
            frames = self._flush_locked((make(request_id),))
            future.batch = self._batches
        self._send(frames)
        return future

    def _holding(self, make: Callable[[int], Request], request_id: int, reply: Reply) -> bool:
        """Under ``_lock``: hold the request ``make(request_id)`` if this thread is inside
        :meth:`together` (True), else leave it to the caller to send now."""
        if self._held is None or self._holder != threading.get_ident():
            return False
        self._held.append((make(request_id), reply))
        return True

    @contextmanager
    def together(self) -> Iterator[None]:
        """The requests this thread makes inside go out in one message as it ends (one
        flush, one message for the server to take in, one round trip)."""
        with self._lock:
            holding = self._held is None
            if holding:
                self._held, self._holder = [], threading.get_ident()
        try:
            yield
        finally:
            if holding:
                self._send_held_requests()

    def _send_held_requests(self) -> None:
        sending = None
        with self._lock:
            held, self._held = self._held or [], None
            if held and self._error is None:  # else a break failed their replies
                sending = self._flush_locked(tuple(request for request, _ in held))
                for _, reply in held:
                    reply.batch = self._batches
        if sending is not None:
            self._send(sending)
