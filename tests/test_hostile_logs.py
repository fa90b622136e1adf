"""Issue 30, finding 8, through a real server logging at ``INFO``: what a client can make the
server log (undecodable messages, failed ops naming two hundred thousand inputs, graph
registrations that fail) is bounded per connection and in all, each line is bounded, and what
was dropped is counted: in ``/metrics``, in a ``log records dropped`` line, and on the
flooding session's ``session closed`` line."""

from __future__ import annotations

import re
import struct
import time

import pytest

from protocol import Batch
from protocol.codec import encode, to_frames
from protocol.graphs import GraphConstant, GraphDef, GraphTensor, RegisterGraph
from protocol.messages import Message, Sync
from protocol.ops import Binary, Full, Join
from server.process import TAIL_BYTES

from .ops_helpers import metrics, value
from .polling import wait_until
from .raw import TOKEN, Raw
from .servers import run_server

pytestmark = [pytest.mark.server, pytest.mark.wire]

LOG_RATE = 20  # --log-rate: lines a second in all, a tenth of it per connection
LINE_BOUND = 16 * 1024  # a record's text is cut well below this (fields and traceback bounded)
UNDECODABLE = 2000  # 5-byte messages, each answered `dropped` and logged `bad message`
WIDE_INPUTS = 200_000  # a failed stack over these inputs names each in its log line
REGISTRATIONS = 50  # graphs whose constant has a shape numpy cannot build


def _whole(message: Message, buffers: tuple[memoryview, ...] = ()) -> bytes:
    frames = to_frames(encode(message, buffers))
    return frames if isinstance(frames, bytes) else b"".join(bytes(f) for f in frames)


def _undecodable(raw: Raw) -> int:
    """Bytes sent: messages whose header is one byte of broken JSON."""
    message = struct.pack("<I", 1) + b"{"
    for _ in range(UNDECODABLE):
        raw.send_raw(message)
        assert raw.recv().type == "dropped"
    return UNDECODABLE * len(message)


def _wide_failures(raw: Raw) -> int:
    """Bytes sent: three stacks of 200k inputs of two shapes, which fail their inference."""
    raw.send(Batch(ops=[Full(out=1, shape=(1,), dtype="float32", value=0.0)]))
    raw.send(Batch(ops=[Full(out=2, shape=(2,), dtype="float32", value=0.0)]))
    sent = 0
    for k in range(3):
        wide = Join(op="stack", out=100 + k, xs=(1, 2) * (WIDE_INPUTS // 2))
        data = _whole(Batch(ops=[wide], requests=[Sync(request_id=k + 1)]))
        raw.send_raw(data)
        assert raw.recv().type == "sync_reply"
        sent += len(data)
    return sent


def _failed_registrations(raw: Raw) -> int:
    """Bytes sent: graphs whose constant is declared (2**40, 2**40, 0): no bytes, a shape
    numpy refuses to make."""
    x = GraphTensor(name="x", id=0, shape=(2,), dtype="float32")
    y = GraphTensor(name="y", id=2, shape=(2,), dtype="float32")
    constant = GraphConstant(id=1, shape=(2**40, 2**40, 0), dtype="float32")
    graph = GraphDef(
        inputs=[x], outputs=[y], constants=[constant], ops=[Binary(op="add", out=2, x1=0, x2=0)]
    )
    sent = 0
    for k in range(REGISTRATIONS):
        batch = Batch(
            graphs=[RegisterGraph(graph_id=k + 1, graph=graph)],
            buffers=[0],
            requests=[Sync(request_id=100 + k)],
        )
        data = _whole(batch, (memoryview(b""),))
        raw.send_raw(data)
        assert raw.recv().type == "sync_reply"
        sent += len(data)
    return sent


def test_a_client_cannot_flood_the_log() -> None:
    args = ("--token", TOKEN, "--log-level", "INFO", "--log-rate", str(LOG_RATE))
    with run_server(*args) as proc:
        logged_before, started = proc.stderr.total, time.monotonic()
        flooders = [Raw(proc.url) for _ in range(3)]
        sent = _wide_failures(flooders[0])  # first: some of its lines are written, cut
        sent += sum(_undecodable(raw) for raw in flooders)
        sent += _failed_registrations(flooders[1])
        time.sleep(1.5)  # the overall bucket fills again: the close lines pass
        for raw in flooders:
            raw.close()
        wait_until(lambda: proc.stderr.text().count(" session closed ") == 3, "3 close lines")
        elapsed = time.monotonic() - started
        logged = proc.stderr.total - logged_before
        samples = metrics(proc.port, TOKEN)
        lines = proc.stderr.lines()

    # every line is bounded, and so is their number: a burst and the rate, in all
    assert logged < TAIL_BYTES, f"{logged} log bytes for {sent} bytes sent"  # all in `lines`
    assert logged / sent < 0.1, f"{logged / sent:.2f} log bytes per byte sent"
    longest = max(len(line) for line in lines)
    assert longest < LINE_BOUND, f"a log line of {longest} chars"
    allowed = LOG_RATE * (1 + elapsed) + 10
    assert len(lines) <= allowed, f"{len(lines)} lines in {elapsed:.1f} s"

    # what was dropped is counted: in the metrics, in a summary line and on the close lines
    caused = 3 * UNDECODABLE + 3  # a line each, at least
    dropped = sum(
        value(samples, "tensorwire_log_records_dropped_total", reason=reason)
        for reason in ("connection", "overall", "kind")
    )
    assert dropped >= caused - len(lines), (dropped, caused, len(lines))
    assert value(samples, "tensorwire_log_records_cut_total") >= 1  # a wide op's line
    assert any(re.search(r" log records dropped .*dropped=[1-9]", line) for line in lines)
    closed = [line for line in lines if " session closed " in line]
    assert all(re.search(r"log_dropped=[1-9]", line) for line in closed), closed
