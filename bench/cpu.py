"""``python -m bench.cpu [--kinds [--blas-threads N]] [--reps N]``: CPU microseconds per
pipelined op on each side, in one process, with an array operand (``x + a``) and with a Python
scalar (``x + 1.0``), what noting the user's line of each op costs (``origins=True``,
``client._origins``), and what segment replay (``client._segments``) costs and saves per op:
the structural key the client builds for a segment whose op types it has seen, and the
server's run of the same ops registered as a segment (one ``run_segment`` op). With
``--kinds``, the server's per op kind of real training steps and per step instead
(``bench/_kinds.py``). On a loaded machine, ``--blas-threads 1`` keeps out of the figures the
time BLAS's calling thread spins waiting for its other threads (a matmul's figures moved 2-3x
between runs).

Thread CPU time (``time.thread_time``), best of several repetitions, so that a loaded machine
moves it far less than wall-clock figures. No sockets: the client side builds ops against a
stub connection; the server side decodes a 2048-op batch and runs it through a session. The
CPU figures of the pipelined hot path in ``bench/README.md`` come from it.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from client._known import Known
from client._origins import Origins
from client._structure import structure
from client.array import RemoteArray
from protocol import CLIENT_ADAPTER, Batch, TensorMeta, decode, encode
from protocol.codec import byte_view
from protocol.graphs import GraphDef, GraphTensor, RegisterGraph, renumber
from protocol.ops import Binary, BinaryScalar, FromBuffer, RunSegment
from protocol.version import version_text
from server.session import Session

from . import _kinds
from ._timing import blas_held

OPS = 2048
REPS = 7


def _best(fn: Callable[[], object], reps: int = REPS) -> float:
    best = float("inf")
    for _ in range(reps):
        start = time.thread_time()
        fn()
        best = min(best, time.thread_time() - start)
    return best


class _StubDevice:
    """What ``client.array.apply`` needs of a device (its op-building API), doing nothing."""

    def __init__(self) -> None:
        self.last = 0
        self.segment_metas: dict[int, TensorMeta] = {}  # noted as segment replay notes them
        self.origins = Origins(on=False)  # what user code made each op: on for one row
        self.sync_ops = False
        self.known = Known()  # what the client knows of its tensors: nothing here

    def new_id(self) -> int:
        self.last += 1
        return self.last

    def submit(self, op: Any) -> None:
        pass

    def release(self, tensor_id: int) -> None:
        pass


def _batch(scalar: bool) -> tuple[Batch, list[bytes | memoryview]]:
    """``x = x + a`` (``x = x + 1.0`` if ``scalar``) OPS times on 16 float32 elements."""
    data = np.ones(16, dtype=np.float32)
    ops: list[Any] = [FromBuffer(out=1, shape=(16,), dtype="float32", buffer=0)]
    if scalar:
        ops += [BinaryScalar(op="add", out=i + 2, x=i + 1, scalar=1.0) for i in range(OPS)]
    else:
        ops += [Binary(op="add", out=i + 2, x1=i + 1, x2=1) for i in range(OPS)]
    batch = Batch(ops=ops, buffers=[data.nbytes])
    return batch, encode(batch, [byte_view(data)])


def _run(session: Session, message: bytes) -> None:
    decoded, buffers = decode(CLIENT_ADAPTER, message)
    job = session.start(decoded, buffers)  # type: ignore[arg-type]
    while not session.step(job, True):
        session.step(job, False)
    session.finish(job)


def _segment(batch: Batch) -> tuple[bytes, bytes]:
    """The batch's ops as one ``run_segment`` beside the upload, and the message that
    registers them (inputs numbered from 0, a made id ``i`` as ``1 + i - 2``)."""
    ops = batch.ops[1:]
    ids = {1: 0, **{op.out: op.out - 1 for op in ops}}
    graph = GraphDef(
        inputs=[GraphTensor(name="x", id=0, shape=(16,), dtype="float32")],
        outputs=[GraphTensor(name="y", id=len(ops), shape=(16,), dtype="float32")],
        ops=[renumber(op, ids) for op in ops],
    )
    register = Batch(graphs=[RegisterGraph(graph_id=1, graph=graph)])
    run = Batch(ops=[batch.ops[0], RunSegment(graph=1, out=2, args=(1,))], buffers=batch.buffers)
    data = memoryview(bytes(batch.buffers[0]))
    return b"".join(encode(run, [data])), b"".join(encode(register))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.cpu", description=__doc__)
    parser.add_argument("--version", action="version", version=version_text())
    parser.add_argument("--kinds", action="store_true", help="per op kind of training steps")
    parser.add_argument("--reps", type=int, default=7, help="repetitions, the best one kept")
    parser.add_argument(
        "--blas-threads", type=int, help="with --kinds, BLAS held to this many threads"
    )
    args = parser.parse_args(argv)
    if args.kinds:
        with blas_held(args):
            _kinds.main(args.reps)
        return 0
    for operand in ("array", "scalar"):
        print(f"x = x + {'a' if operand == 'array' else '1.0'}:")
        _measure(operand == "scalar")
    return 0


def _measure(scalar: bool) -> None:
    a = RemoteArray(_StubDevice(), 0, TensorMeta((16,), "float32"))  # type: ignore[arg-type]
    other: RemoteArray | float = 1.0 if scalar else a

    def build() -> None:
        x = a
        for _ in range(OPS):
            x = x + other

    def build_noted() -> None:  # each op notes the user's line that made it
        a.device.origins.on = True
        try:
            build()
        finally:
            a.device.origins.on = False

    batch, chunks = _batch(scalar)
    message = b"".join(chunks)

    def serialize() -> None:
        Batch(ops=list(batch.ops), buffers=list(batch.buffers))
        encode(batch, [memoryview(bytes(64))])

    def run() -> None:
        _run(Session("bench", 0), message)

    metas = {1: TensorMeta((16,), "float32")}
    segment, register = _segment(batch)

    def key() -> None:
        structure(batch.ops, (), metas)

    registered = []  # a session per repetition, the segment registered: only its run timed
    for _ in range(REPS):
        registered.append(Session("bench", 0))
        _run(registered[-1], register)

    def replay() -> None:
        _run(registered.pop(), segment)

    for name, fn in (
        ("client: build op", build),
        ("client: build op, origins on", build_noted),
        ("client: batch + encode", serialize),
        ("server: decode + check + run", run),
        ("client: segment key", key),
        ("server: run_segment", replay),
    ):
        print(f"  {name:30} {_best(fn) / OPS * 1e6:6.2f} us/op")


if __name__ == "__main__":
    raise SystemExit(main())
