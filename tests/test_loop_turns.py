"""The event loop shared in turns (``server/receiving.py``, ``Session.step``): a batch's ops
run on the loop in one long first slice while no other connection's messages wait for it, so
that a lone client's batch runs whole, and in short slices while others' do, so that their
reads wait one short turn and not a whole batch (bench/REASONS.md, 'Turns of the event loop')."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import pytest

import server.session
from protocol import Batch
from protocol.graphs import GraphDef, GraphTensor, RegisterGraph
from protocol.ops import AnyOp, Binary, Full, RunGraph, Unary
from server.graphs import INLINE_STEPS
from server.session import FIRST_SLICE, INLINE_COST, INLINE_GRAPH_COST, INLINE_SLICE, Session

TICK = 0.0001  # seconds the fake clock moves at each reading


def _ops_in_first_slice(contended: bool, monkeypatch: pytest.MonkeyPatch) -> int:
    """How many of 1,000 cheap ops a batch's first inline step runs before it pauses, on a
    clock that moves :data:`TICK` each time it is read."""
    clock = itertools.count()
    fake_time = SimpleNamespace(monotonic=lambda: next(clock) * TICK)
    monkeypatch.setattr(server.session, "time", fake_time)  # the session's clock only
    session = Session("s", 0)
    ops: list[AnyOp] = [Full(out=1, shape=(2,), dtype="float64", value=1.0)]
    ops += [Binary(op="add", out=2 + i, x1=1, x2=1) for i in range(1000)]
    job = session.start(Batch(ops=ops), [])
    assert not session.step(job, inline=True, contended=contended)
    assert job.paused  # paused for the loop's sake, not for a costly op
    return job.next


def test_a_batch_runs_in_short_slices_only_while_other_connections_wait(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    alone = _ops_in_first_slice(False, monkeypatch)
    shared = _ops_in_first_slice(True, monkeypatch)
    # one reading of the clock per op: the slice's length in ticks, give or take the start's
    assert abs(alone - FIRST_SLICE / TICK) <= 2, alone
    assert abs(shared - INLINE_SLICE / TICK) <= 2, shared


def _graph_runs_inline(elements: int, alone: bool, steps: int = 1) -> bool:
    """Whether a batch's first inline step runs a registered graph of ``steps`` ``exp`` ops
    over ``elements`` float64 values (2 units each) on the loop, rather than leave it to a
    thread."""
    session = Session("s", 0)
    x = GraphTensor(name="x", id=0, shape=(elements,), dtype="float64")
    y = GraphTensor(name="y", id=steps, shape=(elements,), dtype="float64")
    ops: list[AnyOp] = [Unary(op="exp", out=i + 1, x=i) for i in range(steps)]
    graph = GraphDef(inputs=[x], ops=ops, outputs=[y])
    fill = Full(out=1, shape=(elements,), dtype="float64", value=0.5)
    setup = session.start(Batch(ops=[fill], graphs=[RegisterGraph(graph_id=7, graph=graph)]), [])
    while not session.step(setup, inline=False):
        pass
    job = session.start(Batch(ops=[RunGraph(out=2, graph=7, args=(1,))]), [])
    return session.step(job, inline=True, alone=alone)


def test_a_small_graph_runs_on_the_loop_only_for_a_connection_alone_there() -> None:
    """Over INLINE_COST, a graph goes to a worker thread, unless it is a batch's first and
    costs at most INLINE_GRAPH_COST while its connection is the loop's only one
    (bench/REASONS.md, 'Small graphs inline'; tests/test_inprocess.py for the sockets)."""
    small = INLINE_COST  # 2 units an element: between the two bounds
    assert INLINE_COST < 2 * small <= INLINE_GRAPH_COST
    assert _graph_runs_inline(small, alone=True)
    assert not _graph_runs_inline(small, alone=False)
    assert not _graph_runs_inline(INLINE_GRAPH_COST, alone=True)  # twice the bound
    # within the bound, but more steps than INLINE_STEPS, whose own time the cost leaves out
    per_step = 2 * INLINE_COST // INLINE_STEPS  # elements: the graph costs 4 x INLINE_COST
    assert not _graph_runs_inline(per_step, alone=True, steps=INLINE_STEPS + 1)
    assert _graph_runs_inline(per_step, alone=True, steps=INLINE_STEPS)
