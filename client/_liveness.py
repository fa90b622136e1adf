"""Whether the server still answers, as the client sees it: keepalive pings, and how long a call
may wait for the server.

Below ``client._connection``, whose keeper thread shows a :class:`Watch` the connection's
traffic every :meth:`Liveness.tick` seconds and acts on its verdict: send a ping, or give up on
the server with :class:`~client.errors.ServerNotResponding` (the connection then fails every
pending and later call, as a lost one does). The watch does no I/O and reads no clock: it
judges what it is shown.

Theory of operation. Any byte received is an answer. A pong shows that the server's event
loop runs; the server answers pings there even while an op runs in a worker thread, so a long
op keeps its connection (``tests/test_client_liveness.py``), and the bytes of a long reply
count as well. After ``ping_interval`` seconds without an answer the client pings; a ping left
unanswered for ``ping_timeout`` seconds means the server is stopped, hung or unreachable.
Silence counts only while the server can be reading this session: a healthy server stops
reading a session whose messages wait behind a long op (flow control: more than
``--max-queued``, 8 by default, wait behind the one it runs) and cannot read a ping then. So
silence does not count while a send of the client's is held up, nor while more than
:data:`SERVER_QUEUE` of its messages are unanswered (sent after the last one known to have
run: a reply to a request says that its message and every one before it ran). ``timeout``
bounds those waits instead: it bounds what a call waits for, a reply (from when a thread began
to wait for it) and a send that makes no progress, so it must exceed the longest op a session
runs; it is off by default.
"""

from __future__ import annotations

from dataclasses import dataclass

PING_INTERVAL = 5.0  # seconds without an answer before the client pings
PING_TIMEOUT = 20.0  # seconds a ping may go unanswered: a stopped server is found within 26 s
MIN_TICK = 0.01  # the keeper's shortest look interval, however small the bounds
# The server's default --max-queued: with more of the client's messages unanswered than this, a
# healthy server may have stopped reading them (one runs, this many wait). A server run with a
# lower --max-queued may stop reading sooner: give its clients a ping_timeout over its longest op.
SERVER_QUEUE = 8


@dataclass(frozen=True)
class Liveness:
    """The client's bounds on the server, each in seconds or None (off); ``RemoteDevice``'s
    parameters of the same names.

    Raises:
        ValueError: a bound that is not a positive number.
    """

    ping_interval: float | None = PING_INTERVAL
    ping_timeout: float | None = PING_TIMEOUT
    timeout: float | None = None

    def __post_init__(self) -> None:
        for name in ("ping_interval", "ping_timeout", "timeout"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, int | float) and value > 0):
                raise ValueError(f"{name} must be a positive number of seconds or None: {value!r}")

    def tick(self, poll: float) -> float:
        """How often the keeper looks: every ``poll`` seconds, and at least four times within
        each bound, so that none is overrun by more than a quarter."""
        bounds = (self.ping_interval, self.ping_timeout, self.timeout)
        return max(MIN_TICK, min(poll, *(b / 4 for b in bounds if b is not None)))


DEFAULT_LIVENESS = Liveness()


@dataclass(frozen=True)
class Traffic:
    """The connection at one look: bytes received and data bytes sent so far, whether a thread
    holds the send lock (a send, or a small write of control frames), and how many messages
    were sent after the last one known to have run."""

    received: int
    sent: int
    sending: bool
    unanswered: int = 0


class Watch:
    """The keeper's judgement of the server, one look at a time (times are
    ``time.monotonic()``, from the caller)."""

    def __init__(self, liveness: Liveness, now: float) -> None:
        self.liveness = liveness
        self._last = Traffic(0, 0, False, 0)
        self._looked_at = now
        self._heard_at = now  # the last answer, or the end of the last send of ours
        self._pinged_at: float | None = None  # an unanswered ping's
        self._stuck_since: float | None = None  # a send's, while it makes no progress
        self.unanswered_ping = False  # the last verdict was a ping left unanswered (not a
        # call waiting past ``timeout``, which a resumed connection would not shorten)

    def look(self, now: float, traffic: Traffic, waiting_since: float | None) -> str | None:
        """Take in ``traffic`` and ``waiting_since`` (when the longest wait of a thread for a
        reply began; None: no thread waits); return why to give up on the server, or None."""
        last, self._last = self._last, traffic
        held_up = traffic.sending or traffic.unanswered > SERVER_QUEUE  # it may not read us now
        if traffic.received != last.received or held_up:
            self._heard_at, self._pinged_at = now, None  # an answer, or no silence to count
        if not (traffic.sending and last.sending and traffic.sent == last.sent):
            self._stuck_since = None
        elif self._stuck_since is None:
            self._stuck_since = self._looked_at
        self._looked_at = now
        return self._overrun(now, waiting_since)

    def _overrun(self, now: float, waiting_since: float | None) -> str | None:
        bounds = self.liveness
        timeout, ping_timeout = bounds.timeout, bounds.ping_timeout
        if timeout is not None and waiting_since is not None and now - waiting_since >= timeout:
            return f"no reply from the server within {timeout:g} s (timeout)"
        if timeout is not None and self._stuck_since is not None:
            if now - self._stuck_since >= timeout:
                return f"the server took none of a message's bytes for {timeout:g} s (timeout)"
        if ping_timeout is not None and self._pinged_at is not None:
            if now - self._pinged_at >= ping_timeout:
                self.unanswered_ping = True
                return f"the server did not answer a ping within {ping_timeout:g} s (ping_timeout)"
        return None

    def ping_due(self, now: float) -> bool:
        """Whether to ping now: no answer for ``ping_interval`` and no ping unanswered."""
        interval = self.liveness.ping_interval
        return interval is not None and self._pinged_at is None and now - self._heard_at >= interval

    def pinged(self, now: float) -> None:
        """A ping went out at ``now``."""
        self._pinged_at = now
