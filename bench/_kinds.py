"""``python -m bench.cpu --kinds``: the server's CPU per op by op kind, on the ops of real
training steps (``bench/_step_ops.py``), and per whole step.

For each kind of op a step uses (``binary:matmul``, ``reduce:sum``, ``reshape``...), a batch
of :data:`OPS` ops of that kind (fewer, once they create :data:`BYTES`: a kind of large
results is measured on what a session holds), the step's own in its order and repeated (each
op creating a new id; an in-place op writes its target again), runs on the session as it
stands after the step; a kind is measured on the first workload that uses it (the digits MLP,
then the CNN, then the transformer). Thread CPU time, best of several repetitions, per op:
decode + check + run, check + run alone, and numpy's part of it (the executor's runners
called on the stored arrays, nothing checked or stored), so that the bookkeeping is told from
the work. Uploads (``from_buffer``) are left out: they belong to the transfer figures.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np

from protocol import Batch
from protocol.ops import AnyOp, InPlaceBinary, InPlaceBinaryScalar, MultiOutputOp, SetItem
from server import executor
from server.executor import elementwise, indexing
from server.session import Session
from server.store import Failure, Stored

from ._step_ops import Recording, encoded, kind, recordings, run, run_encoded

OPS = 2048  # ops in a batch of one kind, as a client's flush of cheap ops
BYTES = 64 << 20  # ... or fewer: the step's ops repeated while their results hold less
FIRST_ID = 1 << 40  # above every id the recorded steps use
LEFT_OUT = frozenset({"from_buffer"})


def _renamed(op: AnyOp, first: int) -> tuple[AnyOp, list[int]]:
    """``op`` writing new ids from ``first`` (an in-place op as it is), and those ids."""
    if op.inplace:
        return op, []
    outs = list(range(first, first + len(op.outputs())))
    update: dict[str, Any] = {"out": outs[0]}
    if isinstance(op, MultiOutputOp):
        update["more"] = tuple(outs[1:])
    return op.model_copy(update=update), outs


def kind_batch(ops: list[AnyOp], first: int, count: int) -> tuple[Batch, list[int]]:
    """``count`` ops: ``ops`` repeated, writing new ids from ``first``; and those ids."""
    made: list[AnyOp] = []
    created: list[int] = []
    while len(made) < count:
        for op in ops[: count - len(made)]:
            renamed, outs = _renamed(op, first + len(created))
            made.append(renamed)
            created += outs
    return Batch(ops=made), created


def _array(value: Stored | Failure) -> np.ndarray[Any, Any]:
    assert isinstance(value, Stored), value
    return value.array


def _numpy_alone(session: Session, ops: list[AnyOp]) -> float:
    """Seconds the executor's runners take for ``ops`` on the session's arrays (their results
    kept until all ran, as a session keeps them)."""
    store = session.store
    calls: list[Callable[[], object]] = []
    for op in ops:
        args = [_array(store.get(i)) for i in op.inputs()]
        if isinstance(op, SetItem):
            calls.append(partial(indexing.setitem, op, args, [], True))
        elif isinstance(op, InPlaceBinary | InPlaceBinaryScalar):
            calls.append(partial(elementwise.binary_inplace, op, args, [], True))
        else:
            calls.append(partial(executor.runner(op), op, args, []))
    start = time.thread_time()
    with np.errstate(all="ignore"):
        results = [call() for call in calls]
    spent = time.thread_time() - start
    del results
    return spent


def _count(session: Session, ops: list[AnyOp]) -> int:
    """How many ops a batch of ``ops`` repeated holds: :data:`OPS`, or fewer if their results
    would hold over :data:`BYTES` (at least ``ops`` once)."""
    store = session.store
    made = sum(0 if op.inplace else _array(store.get(op.out)).nbytes for op in ops)
    return max(len(ops), min(OPS, BYTES * len(ops) // max(made, 1)))


def _timed(session: Session, ops: list[AnyOp], first: int, decoding: bool) -> float:
    """Microseconds per op of a batch of ``ops`` (:func:`kind_batch`) on ``session``, decoded
    first with ``decoding``; the ids it made are freed after."""
    count = _count(session, ops)
    batch, created = kind_batch(ops, first, count)
    message = encoded(batch, [])
    start = time.thread_time()
    if decoding:
        run_encoded(session, message)
    else:
        run(session, batch, [])
    spent = time.thread_time() - start
    run(session, Batch(ops=[], frees=created), [])
    if session.store.failed:
        raise AssertionError(f"{session.store.failed} ops of a kind's batch failed")
    return spent / count * 1e6


Row = tuple[str, str, int, float, float, float]


def _kind_rows(rec: Recording, kinds: list[str], reps: int) -> list[Row]:
    session = rec.session(through_step=True)
    step_ops = rec.step_ops
    counts = Counter(kind(op) for op in step_ops)
    rows = []
    serial = iter(range(1, 1 << 20))
    for name in kinds:
        ops = [op for op in step_ops if kind(op) == name]
        whole = min(
            _timed(session, ops, FIRST_ID + (next(serial) << 20), True) for _ in range(reps)
        )
        alone = min(
            _timed(session, ops, FIRST_ID + (next(serial) << 20), False) for _ in range(reps)
        )
        numpy_ops = kind_batch(ops, FIRST_ID, _count(session, ops))[0].ops
        work = min(_numpy_alone(session, numpy_ops) for _ in range(reps)) / len(numpy_ops) * 1e6
        rows.append((rec.model, name, counts[name], whole, alone, work))
    return rows


def step_cost(rec: Recording, reps: int) -> float:
    """Server CPU (decode + check + run) of the recorded step's batches, in microseconds."""
    messages = [encoded(batch, buffers) for batch, buffers in rec.step_batches]

    def once() -> float:
        session = rec.session()
        start = time.thread_time()
        for message in messages:
            run_encoded(session, message)
        return (time.thread_time() - start) * 1e6

    return min(once() for _ in range(reps))


def main(reps: int) -> None:
    seen: set[str] = set(LEFT_OUT)
    rows = []
    steps = []
    for rec in recordings():
        kinds = sorted({kind(op) for op in rec.step_ops} - seen)
        seen.update(kinds)
        rows += _kind_rows(rec, kinds, reps)
        steps.append((rec.model, len(rec.step_ops), step_cost(rec, reps)))
    print("server CPU per op by kind, us/op (ops of that kind in the step):")
    print(
        f"  {'workload':12} {'kind':34} {'in step':>7} {'decode+check+run':>17} "
        f"{'check+run':>10} {'numpy':>8}"
    )
    for model, name, count, whole, alone, work in rows:
        print(f"  {model:12} {name:34} {count:7d} {whole:17.2f} {alone:10.2f} {work:8.2f}")
    print("server CPU per training step (decode + check + run):")
    for model, ops, micros in steps:
        print(f"  {model:12} {ops:5d} ops  {micros:9.0f} us/step  {micros / ops:6.2f} us/op")
