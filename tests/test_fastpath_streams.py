"""Random op streams of the fast path's keyed ops (hypothesis) leave exactly what the general
path leaves: ops on random ids (stored, failed, unknown, freed, taken), views of views,
in-place writes into shared memory, with reads between batches whose pending replies make
the writes move their targets first (``tests/test_fastpath_kinds.py`` has the state compared)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocol import Batch, Read
from protocol.ops import (
    AnyOp,
    AsType,
    Axes,
    Binary,
    BroadcastTo,
    GetItem,
    InPlaceBinary,
    InPlaceBinaryScalar,
    Join,
    PermuteDims,
    Reduce,
    Reshape,
    SetItem,
    SliceSpec,
    Take,
    Where,
)
from server.session import Session

from .test_fastpath_kinds import SETUP, _disable, _run, _snapshot

FIRST = 100  # the stream's own ids: FIRST + its op's number
IDS = st.integers(1, FIRST + 40)  # SETUP's ids, the stream's own, and unknown ones
Build = Callable[[int, int, int], AnyOp]
BUILDERS: list[Build] = [
    lambda out, a, b: Binary(op="matmul", out=out, x1=a, x2=b),
    lambda out, a, b: Reduce(op="sum", out=out, x=a, axis=(b % 2,)),
    lambda out, a, b: Reduce(op="max", out=out, x=a),
    lambda out, a, b: Where(out=out, condition=6, x1=a, x2=b),
    lambda out, a, b: Take(op="take", out=out, x=a, indices=5, axis=b % 2),
    lambda out, a, b: Reshape(out=out, x=a, shape=(-1,)),
    lambda out, a, b: Reshape(out=out, x=a, shape=(6, 4)),
    lambda out, a, b: PermuteDims(out=out, x=a, axes=(1, 0)),
    lambda out, a, b: Axes(op="expand_dims", out=out, x=a, axis=(0,)),
    lambda out, a, b: BroadcastTo(out=out, x=a, shape=(2, 4, 6)),
    lambda out, a, b: GetItem(out=out, x=a, key=(SliceSpec(start=b % 3), "...")),
    lambda out, a, b: AsType(out=out, x=a, dtype="float64" if b % 2 else "float32"),
    lambda out, a, b: Join(op="concat", out=out, xs=(a, b), axis=0),
    lambda out, a, b: InPlaceBinary(op="add", out=a, x2=b),
    lambda out, a, b: InPlaceBinaryScalar(op="multiply", out=a, scalar=0.5 if b % 2 else 3),
    lambda out, a, b: SetItem(out=a, key=(SliceSpec(stop=2),), value=b),
    lambda out, a, b: Reshape(out=b, x=a, shape=(24,)),  # often a taken id
]
STEP = st.tuples(st.integers(0, len(BUILDERS) - 1), IDS, IDS, st.booleans())


def _stream(steps: list[tuple[int, int, int, bool]]) -> list[tuple[list[AnyOp], Any, list[int]]]:
    """Batches of the stream's ops: a batch ends where a step says so, with a read of its
    last op's first input (its reply kept pending, so that a later write moves that memory)
    and a free of its first op's other inputs."""
    batches: list[tuple[list[AnyOp], Any, list[int]]] = []
    ops: list[AnyOp] = []
    for number, (builder, a, b, ends) in enumerate(steps):
        op = BUILDERS[builder](FIRST + number, a, b)
        ops.append(op)
        if ends or number == len(steps) - 1:
            read = Read(request_id=len(batches) + 1, tensor=op.inputs()[0])
            batches.append((ops, read, list(ops[0].inputs()[1:])))
            ops = []
    return batches


def _state(fast: bool, monkeypatch: pytest.MonkeyPatch, steps: list[Any]) -> list[Any]:
    with monkeypatch.context() as patch:
        if not fast:
            _disable(patch)
        session = Session("s", 0)
        replies = _run(session, SETUP)
        for ops, read, frees in _stream(steps):
            replies += _run(session, ops, read)  # kept: their bytes still to send
            job = session.start(Batch(ops=[], frees=frees), [])
            while not session.step(job, inline=True):
                session.step(job, inline=False)
        return _snapshot(session, replies, ids=FIRST + 60)


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.lists(STEP, min_size=1, max_size=30))
def test_random_streams_leave_the_same_state_on_both_paths(
    monkeypatch: pytest.MonkeyPatch, steps: list[tuple[int, int, int, bool]]
) -> None:
    assert _state(True, monkeypatch, steps) == _state(False, monkeypatch, steps)
