"""The log's bounds on a clock of the test's own (``server/logs.py``): a connection's bucket, the
server's, the closing line that says what its connection dropped, the summary line, and the
cut of an overlong field. Through a real server: tests/test_hostile_logs.py."""

from __future__ import annotations

import io
import json
import logging

from server import logs
from server.logs import BoundedHandler, JsonFormatter, TextFormatter, fields


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _handler(rate: float, clock: Clock) -> tuple[BoundedHandler, io.StringIO]:
    handler = BoundedHandler(rate, clock=clock)
    out = io.StringIO()
    handler.setStream(out)
    handler.setFormatter(TextFormatter())
    return handler, out


def _record(event: str, level: int = logging.INFO, **values: object) -> logging.LogRecord:
    return logging.getLogger("tensorwire.test").makeRecord(
        "tensorwire.test", level, __file__, 0, event, (), None, extra=fields(**values)
    )


def test_a_connection_gets_a_tenth_of_the_rate_and_the_server_the_rate() -> None:
    clock = Clock()
    handler, out = _handler(100, clock)
    before = dict(logs.COUNTS.dropped)
    for _ in range(50):
        handler.handle(_record("bad message", session="a"))
    assert out.getvalue().count("bad message") == 10  # a tenth of 100, a second's worth
    for n in range(200):
        handler.handle(_record("session opened", session=f"s{n}"))
    assert out.getvalue().count("session opened") == 90  # what the server's bucket had left
    assert logs.COUNTS.dropped["connection"] - before.get("connection", 0) == 40
    assert logs.COUNTS.dropped["overall"] - before.get("overall", 0) == 110
    clock.now += 0.5  # half a second: half of each bucket again
    for _ in range(50):
        handler.handle(_record("bad message", session="a"))
    assert out.getvalue().count("bad message") == 15


def test_a_closing_line_passes_its_connection_bucket_and_says_what_it_dropped() -> None:
    clock = Clock()
    handler, out = _handler(100, clock)
    for _ in range(30):
        handler.handle(_record("op failed", session="a"))
    handler.handle(_record("session closed", session="a", ops=3))
    (closed,) = [line for line in out.getvalue().splitlines() if "session closed" in line]
    assert closed.endswith("session closed session=a ops=3 log_dropped=20")
    handler.handle(_record("session closed", session="b"))  # nothing dropped: nothing said
    assert out.getvalue().splitlines()[-1].endswith("session closed session=b")


def test_drops_are_summed_up_once_a_second_and_when_the_log_closes() -> None:
    clock = Clock()
    handler, out = _handler(10, clock)
    for _ in range(25):
        handler.handle(_record("refused", peer="127.0.0.1:1", limit="auth"))
    assert " log records dropped " not in out.getvalue()
    clock.now += 1.0
    handler.handle(_record("session opened", session="b"))
    lines = out.getvalue().splitlines()
    assert lines[-2].endswith(
        "WARNING log records dropped dropped=24 connection=9 overall=0 kind=15"
    )
    assert lines[-1].endswith("session opened session=b")
    for _ in range(3):
        handler.handle(_record("op failed", session="b"))
    handler.close()
    assert (
        out.getvalue()
        .splitlines()[-1]
        .endswith("log records dropped dropped=3 connection=3 overall=0 kind=0")
    )


def test_a_rate_of_zero_writes_every_line() -> None:
    handler, out = _handler(0, Clock())
    for _ in range(1000):
        handler.handle(_record("op failed", session="a"))
    assert out.getvalue().count("op failed") == 1000


def test_a_long_field_and_a_long_traceback_are_cut_in_their_middle() -> None:
    cut_before = logs.COUNTS.cut
    wide = "stack(" + ", ".join(f"#{i}" for i in range(200_000)) + ") -> #7"
    record = _record("op failed", session="a", op=wide, code="invalid_op")
    line = TextFormatter().format(record)
    assert len(line) < logs.FIELD_CHARS + 200
    op = json.loads(line.split(" op=", 1)[1].split(" code=", 1)[0])
    assert op.startswith("stack(#0, #1, ") and op.endswith(", #199999) -> #7")
    assert f"...[{len(wide) - logs.FIELD_CHARS} chars cut]..." in op
    assert logs.COUNTS.cut == cut_before + 1
    try:
        raise ValueError("x" * 100_000)
    except ValueError as exc:
        failed = _record("graph registration failed", logging.ERROR, session="a")
        failed.exc_info = (type(exc), exc, exc.__traceback__)
    event = json.loads(JsonFormatter().format(failed))
    assert event["event"] == "graph registration failed" and event["session"] == "a"
    assert len(event["exception"]) < logs.EXCEPTION_CHARS + 50
    assert event["exception"].startswith("Traceback (most recent call last):")
    assert logs.COUNTS.cut == cut_before + 2


def test_text_lines_quote_what_a_terminal_would_act_on() -> None:
    line = TextFormatter().format(_record("bad message", session="a", error="\x1b[2J\x07"))
    assert line.endswith('error="\\u001b[2J\\u0007"') and line.isprintable()
