"""Structured logs: one line per event on stderr, as ``key=value`` text or as JSON.

A log call names the event in its message and carries its fields in ``extra``::

    log.info("session opened", extra=fields(session=sid, peer="127.0.0.1:50312", device=0))

and comes out as one of::

    2026-11-29T22:10:00.123Z INFO session opened session=4f2a peer=127.0.0.1:50312 device=0
    {"ts": "2026-11-29T22:10:00.123Z", "level": "INFO", "event": "session opened", ...}

This is the standard library's ``logging`` with two small formatters and one handler; a logging
library would bring more than the lines it saves.

Anyone who can reach the port can make the server log (an undecodable message, a failed op, a
refused upgrade), so what is written is bounded three ways (:class:`BoundedHandler`):

- each line: a field's value over :data:`FIELD_CHARS` (a traceback over
  :data:`EXCEPTION_CHARS`) is cut in its middle, saying how much was cut;
- each kind of flood-prone event (refusals, websockets' and asyncio's complaints about a peer)
  passes a :class:`Throttle`: 10 lines a second each;
- lines per second (``--log-rate``): a token bucket for each connection (the event's
  ``session``, else its ``peer``) passes a tenth of the rate, and one for the whole server the
  rate; a bucket holds a second's worth.

What is dropped is counted (:data:`COUNTS`, exported by ``server.metrics``), written at most
once a second as a ``log records dropped`` line, and, for one session, on its ``session closed``
line as ``log_dropped=N`` (that line does not wait for its connection's bucket).
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, TextIO

FIELDS = "tw_fields"  # the ``extra`` key that carries an event's fields
THROTTLED_EVENTS = frozenset({"refused"})  # ours; every event of these loggers is throttled too
THROTTLED_LOGGERS = ("websockets", "asyncio")
CLOSING_EVENTS = frozenset({"session closed"})  # a connection's last line: its drops reported
FIELD_CHARS = 1024  # an event's name or a field's value is cut to this many characters
EXCEPTION_CHARS = 8192  # a traceback is cut to this many characters
CONNECTIONS_KEPT = 4096  # connections whose buckets are kept; the least recently seen goes
DROP_REASONS = ("connection", "overall", "kind")  # a connection's bucket, the server's, a kind's
SUMMARY_EVENT = "log records dropped"
SUMMARY_PERIOD = 1.0  # seconds between two summary lines, at least

Clock = Callable[[], float]


@dataclass
class LogCounts:
    """What the log dropped, by reason (:data:`DROP_REASONS`), and the lines it cut."""

    dropped: Counter[str] = field(default_factory=Counter)
    cut: int = 0


COUNTS = LogCounts()  # this process's: the log, like its handler, is one per process


def fields(**values: object) -> dict[str, dict[str, object]]:
    """The ``extra=`` argument that attaches ``values`` to a log event."""
    return {FIELDS: values}


def _timestamp(record: logging.LogRecord) -> str:
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
    return f"{stamp}.{int(record.msecs):03d}Z"


def _cut(text: str, limit: int) -> str:
    """``text``, or its head and tail with what lies between them replaced by a note."""
    if len(text) <= limit:
        return text
    head = limit // 4
    return f"{text[:head]}...[{len(text) - limit} chars cut]...{text[head - limit :]}"


def _bounded(record: logging.LogRecord) -> tuple[str, dict[str, Any]]:
    """The event's name and its fields (a traceback as ``exception``), each cut to its bound;
    a record with anything cut is counted in :data:`COUNTS`."""
    values: dict[str, Any] = dict(getattr(record, FIELDS, {}))
    if record.exc_info:
        values["exception"] = logging.Formatter().formatException(record.exc_info)
    event = record.getMessage()
    cut = len(event) > FIELD_CHARS
    for key, value in values.items():
        if not (isinstance(value, int | float) or value is None):
            text, limit = str(value), EXCEPTION_CHARS if key == "exception" else FIELD_CHARS
            cut = cut or len(text) > limit
            values[key] = _cut(text, limit)
    if cut:
        COUNTS.cut += 1
    return _cut(event, FIELD_CHARS), values


class TextFormatter(logging.Formatter):
    """``TIME LEVEL event key=value ...``; a value that is empty, holds a space, a quote, an
    ``=`` or any character that is not printable (a newline, a terminal escape) is
    JSON-quoted, so one event stays one line of plain text."""

    def format(self, record: logging.LogRecord) -> str:
        event, values = _bounded(record)
        parts = [_timestamp(record), record.levelname, event]
        for key, value in values.items():
            text = str(value)
            if not text or not text.isprintable() or any(c in text for c in ' "='):
                text = json.dumps(text)
            parts.append(f"{key}={text}")
        return " ".join(parts)


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``ts``, ``level``, ``logger``, ``event``, then the fields."""

    def format(self, record: logging.LogRecord) -> str:
        event, values = _bounded(record)
        line: dict[str, Any] = {
            "ts": _timestamp(record),
            "level": record.levelname,
            "logger": record.name,
            "event": event,
        }
        line.update(values)
        return json.dumps(line, default=str)


@dataclass
class _Window:
    start: float
    passed: int = 0
    dropped: int = 0


class Throttle(logging.Filter):
    """Passes at most ``burst`` lines of each throttled event per ``period`` seconds (an event
    of ours named in :data:`THROTTLED_EVENTS`, by its ``limit`` field; any of the loggers in
    :data:`THROTTLED_LOGGERS`, by message); the first line after a window that dropped some
    carries ``suppressed=N``. Other events always pass. Keys are event names and limits, a
    small fixed set, so the filter's memory is bounded."""

    def __init__(self, burst: int = 10, period: float = 1.0, clock: Clock = time.monotonic) -> None:
        super().__init__()
        self._burst, self._period, self._clock = burst, period, clock
        self._windows: dict[tuple[str, str, str], _Window] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        values: dict[str, Any] = getattr(record, FIELDS, {})
        if isinstance(record.msg, str) and record.msg in THROTTLED_EVENTS:
            key = (record.name, str(record.msg), str(values.get("limit", "")))
        elif record.name.split(".")[0] in THROTTLED_LOGGERS:
            key = (record.name, str(record.msg), "")
        else:
            return True
        now = self._clock()
        window = self._windows.get(key)
        if window is None or now - window.start >= self._period:
            if window is not None and window.dropped:
                setattr(record, FIELDS, {**values, "suppressed": window.dropped})
            window = self._windows[key] = _Window(now)
        window.passed += 1
        if window.passed > self._burst:
            window.dropped += 1
            return False
        return True


@dataclass
class _Bucket:
    """A token bucket: ``rate`` lines a second, ``rate`` at once (one at least)."""

    rate: float
    stamp: float
    tokens: float = 0.0

    def __post_init__(self) -> None:
        self.tokens = self.capacity

    @property
    def capacity(self) -> float:
        return max(self.rate, 1.0)

    def take(self, now: float) -> bool:
        self.tokens = min(self.capacity, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if self.tokens < 1.0:
            return False
        self.tokens -= 1.0
        return True


@dataclass
class _Connection:
    bucket: _Bucket
    dropped: int = 0  # lines of this connection dropped, for its closing line


class RateLimit:
    """``rate`` lines a second in all, a tenth of it for each connection (:class:`_Bucket`).
    Used under its handler's lock only."""

    def __init__(self, rate: float, clock: Clock = time.monotonic) -> None:
        self._rate, self._clock = rate, clock
        self._overall = _Bucket(rate, clock())
        self._connections: OrderedDict[str, _Connection] = OrderedDict()
        self._unreported: Counter[str] = Counter()  # drops since the last summary line
        self._reported_at = clock()

    def admit(self, record: logging.LogRecord) -> bool:
        """Whether ``record`` is written; if not, it is counted. A closing line (see
        :data:`CLOSING_EVENTS`) passes its connection's bucket, and says what it dropped."""
        values: dict[str, Any] = getattr(record, FIELDS, {})
        key = values.get("session") or values.get("peer")
        now = self._clock()
        if key is not None:
            connection = self._connection(str(key), now)
            if record.msg in CLOSING_EVENTS:
                del self._connections[str(key)]
                if connection.dropped:
                    setattr(record, FIELDS, {**values, "log_dropped": connection.dropped})
            elif not connection.bucket.take(now):
                connection.dropped += 1
                self.dropped("connection")
                return False
        if not self._overall.take(now):
            self.dropped("overall")
            return False
        return True

    def dropped(self, reason: str) -> None:
        COUNTS.dropped[reason] += 1
        self._unreported[reason] += 1

    def summary(self, force: bool = False) -> logging.LogRecord | None:
        """A ``log records dropped`` line, if some were since the last one and it is a period
        ago (or ``force``); None otherwise."""
        now = self._clock()
        if not self._unreported or (now - self._reported_at < SUMMARY_PERIOD and not force):
            return None
        counts = {reason: self._unreported[reason] for reason in DROP_REASONS}
        self._unreported.clear()
        self._reported_at = now
        record = logging.getLogger("tensorwire.logs").makeRecord(
            "tensorwire.logs", logging.WARNING, __file__, 0, SUMMARY_EVENT, (), None
        )
        setattr(record, FIELDS, {"dropped": sum(counts.values()), **counts})
        return record

    def _connection(self, key: str, now: float) -> _Connection:
        connection = self._connections.get(key)
        if connection is None:
            connection = self._connections[key] = _Connection(_Bucket(self._rate / 10, now))
            if len(self._connections) > CONNECTIONS_KEPT:
                self._connections.popitem(last=False)
        else:
            self._connections.move_to_end(key)
        return connection


class BoundedHandler(logging.StreamHandler[TextIO]):
    """Writes what passes the :class:`Throttle` and the :class:`RateLimit` (none for a rate
    of 0), and a ``log records dropped`` line before the next line written once a second has
    passed since the last (and when it is closed)."""

    def __init__(self, rate: float, clock: Clock = time.monotonic) -> None:
        super().__init__(sys.stderr)
        self._throttle = Throttle(clock=clock)
        self._limit = RateLimit(rate, clock) if rate > 0 else None

    def emit(self, record: logging.LogRecord) -> None:  # under the handler's lock
        if not self._throttle.filter(record):
            self._count("kind")
            return
        if self._limit is not None:
            if not self._limit.admit(record):
                return
            self._write_summary()
        super().emit(record)

    def close(self) -> None:
        with self.lock:  # type: ignore[union-attr]  # made by createLock() in __init__
            self._write_summary(force=True)
        super().close()

    def _count(self, reason: str) -> None:
        if self._limit is not None:
            self._limit.dropped(reason)
        else:
            COUNTS.dropped[reason] += 1

    def _write_summary(self, force: bool = False) -> None:
        summary = None if self._limit is None else self._limit.summary(force)
        if summary is not None:
            super().emit(summary)


def configure(level: str, fmt: Literal["text", "json"], rate: float = 0.0) -> None:
    """Send every ``tensorwire.*`` event at ``level`` or above to stderr, one line each, at
    most ``rate`` lines a second (0: no bound on their number)."""
    handler = BoundedHandler(rate)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    # websockets logs every HTTP request and connection at INFO; ours already say what matters
    logging.getLogger("websockets").setLevel(max(logging.WARNING, root.level))
