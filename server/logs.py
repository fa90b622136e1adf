"""Structured logs: one line per event on stderr, as ``key=value`` text or as JSON.

A log call names the event in its message and carries its fields in ``extra``::

    log.info("session opened", extra=fields(session=sid, peer="127.0.0.1:50312", device=0))

and comes out as one of::

    2026-11-29T22:10:00.123Z INFO session opened session=4f2a peer=127.0.0.1:50312 device=0
    {"ts": "2026-11-29T22:10:00.123Z", "level": "INFO", "event": "session opened", ...}

This is the standard library's ``logging`` with two small formatters; a logging library would
bring more than the forty lines it saves. Events that anyone who can reach the port causes at
will (refusals of the upgrade, websockets' and asyncio's own complaints about a peer) pass a
:class:`Throttle`, so a flood of bad requests cannot flood the log.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

FIELDS = "tw_fields"  # the ``extra`` key that carries an event's fields
THROTTLED_EVENTS = frozenset({"refused"})  # ours; every event of these loggers is throttled too
THROTTLED_LOGGERS = ("websockets", "asyncio")


def fields(**values: object) -> dict[str, dict[str, object]]:
    """The ``extra=`` argument that attaches ``values`` to a log event."""
    return {FIELDS: values}


def _timestamp(record: logging.LogRecord) -> str:
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
    return f"{stamp}.{int(record.msecs):03d}Z"


def _fields_of(record: logging.LogRecord) -> dict[str, Any]:
    values: dict[str, Any] = dict(getattr(record, FIELDS, {}))
    if record.exc_info:
        values["exception"] = logging.Formatter().formatException(record.exc_info)
    return values


class TextFormatter(logging.Formatter):
    """``TIME LEVEL event key=value ...``; values with spaces or quotes are JSON-quoted."""

    def format(self, record: logging.LogRecord) -> str:
        parts = [_timestamp(record), record.levelname, record.getMessage()]
        for key, value in _fields_of(record).items():
            text = str(value)
            if not text or any(c in text for c in ' "=\n'):
                text = json.dumps(text)
            parts.append(f"{key}={text}")
        return " ".join(parts)


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``ts``, ``level``, ``logger``, ``event``, then the fields."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": _timestamp(record),
            "level": record.levelname,
            "logger": record.name,
            "event": record.getMessage(),
        }
        line.update(_fields_of(record))
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

    def __init__(
        self, burst: int = 10, period: float = 1.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
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


def configure(level: str, fmt: Literal["text", "json"]) -> None:
    """Send every ``tensorwire.*`` event at ``level`` or above to stderr, one line each."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    handler.addFilter(Throttle())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    # websockets logs every HTTP request and connection at INFO; ours already say what matters
    logging.getLogger("websockets").setLevel(max(logging.WARNING, root.level))
