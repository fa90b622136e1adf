"""What a connection does when its transport breaks: resume the session on a new one, or fail
(protocol/README.md, "Resuming a session"; the client's side).

Below ``client._connection`` (whose :class:`~client._connection.Connection` is one of these),
over its reading side (``client._receiving``) and the reconnection (``client._opening.reopen``,
with the backoff of ``client._resuming``).

The first thread to see the transport break (a sender, the reader, or the keeper giving up on
a silent server) takes the recovery lock, cuts the transport, reconnects and resumes the
session with its secret, then, holding the connection's lock so that no flush goes out
meanwhile, sends again every message the server has not received and swaps the new transport
in. Every other thread that saw the old one break waits on the lock and goes on with the new
one. A session that cannot be resumed (closed by the server with a close frame, resuming
turned off, or refused or unreachable) fails every pending and later call, with
:class:`~client.SessionLost` where the session is gone.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future
from typing import Any

from protocol import Welcome

from ._opening import reopen
from ._options import ConnectionOptions
from ._receiving import Receiving
from ._replies import fail
from ._transport import Closed, Transport
from .errors import ConnectionLost, SessionLost, TensorwireError


class Recovering(Receiving):
    """A connection that resumes its session when its transport breaks."""

    welcome: Welcome  # the session's (the subclass's handshake)
    _index: int
    _options: ConnectionOptions
    _lock: threading.Lock  # the pending batch: no flush while messages go out again
    _closing: bool

    def __init__(self, url: str, pool_bytes: int, bounded_replies: bool = False) -> None:
        super().__init__(url, pool_bytes, bounded_replies)
        self._generation = 0  # transports so far, less one: which one _ws is
        self._recovering = threading.Lock()  # one thread resumes the session at a time

    def _lost(self, generation: int, exc: BaseException, *also: Future[Any]) -> None:
        """Transport number ``generation`` broke with ``exc``: resume the session on a new one
        (every thread that saw it break returns once one did), or fail every pending reply (and
        ``also``) and every later call. Never raises."""
        with self._recovering:
            if generation != self._generation or self._error is not None:
                if self._error is not None:
                    fail(also, self._error)
                return  # another thread resumed the session (or it failed)
            old = self._ws
            ended = old.close_received is not None  # a close frame: the server ended the session
            if self._closing or not self._sent.keep or ended:
                self._broken(exc, *also)
                return
            old.abort()
            received = self._seal(generation)  # what the server need not send again
            try:
                ws, welcome = reopen(
                    self.url, self._index, self._options, self.welcome, received, self._receive, exc
                )
            except ConnectionLost as error:
                self._fail(error, *also)
                return
            except TensorwireError as error:  # refused otherwise (its token, say)
                self._fail(SessionLost(str(error), "unknown"), *also)
                return
            again = self._swap(ws, welcome)
        self._send_held(ws, generation + 1, again)  # readers take replies meanwhile
        old.close()  # cut already: a thread that still holds it fails on it (Closed)

    def _swap(self, ws: Transport, welcome: Welcome) -> list[Any]:
        """Make ``ws`` the connection's transport, holding its send lock (the caller lets go
        of it once it sent what the server has not received: the welcome says how many it
        has); returns those messages. No flush goes out meanwhile, and none on ``ws`` before
        them."""
        self._acked(welcome.received)
        with self._lock:
            again = self._sent.since(welcome.received)
            ws.send_lock.acquire()
            self._ws = ws
            self._generation += 1
            self._current = (ws, self._generation)
        return again

    def _send_held(self, ws: Transport, generation: int, messages: list[Any]) -> None:
        """Send ``messages`` on ``ws`` (transport ``generation``), whose send lock the caller
        took, and let go of it; resume the session if the transport broke (the next one gets
        them again). Other threads read meanwhile."""
        broke: Closed | None = None
        try:
            for message in messages:
                if self._error is None:
                    ws.send(message)
        except Closed as exc:
            broke = exc
        finally:
            ws.release_send_lock()
        if broke is not None:
            self._lost(generation, broke)


__all__ = ["Recovering"]
