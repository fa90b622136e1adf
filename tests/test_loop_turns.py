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
from protocol.ops import AnyOp, Binary, Full
from server.session import FIRST_SLICE, INLINE_SLICE, Session

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
