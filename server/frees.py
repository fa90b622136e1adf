"""A batch's frees, planned and applied in parts, so that one batch of a million of them does not
hold the event loop (bench/REASONS.md, 'Frees at last use, in parts').

Frees of tensors that no op of the batch uses are applied before its first op, and the others
right after the last op that uses them (``Session.step``, ``Job.frees_after``), as numpy frees a
temporary: memory freed and allocated in one batch counts against the quota only once, and the
next result reuses the block while it is still in the cache (bench/REASONS.md, 'Frees at last
use, in parts'). Once the ops have run, every id of the batch is freed again
(frees are idempotent), so an id that an op made after its free does not outlive the batch.

Both are generators that yield after every :data:`PART` ids or ops; ``Session.step`` runs them
(``Job.chores``) within its slice of the loop's time, with :func:`run_chores`.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

from .outcome import Job
from .store import TensorStore

PART = 512  # ids or ops handled between two checks of the clock


def planned(store: TensorStore, job: Job) -> Iterator[None]:
    """Free what no op of ``job``'s batch uses, and plan the other frees after their last use
    (``job.frees_after``)."""
    batch = job.batch
    frees: set[int] = set()
    for first in range(0, len(batch.frees), PART):
        frees.update(batch.frees[first : first + PART])
        yield
    # An in-place op reads its target, so inputs() cover every use; a later index wins.
    last_use: dict[int, int] = {}
    ops = batch.ops
    for first in range(0, len(ops), PART):
        for index in range(first, min(first + PART, len(ops))):
            inputs = ops[index].inputs()
            if len(inputs) > PART:  # a wide op (a stack of a million): its ids a part at a time
                for start in range(0, len(inputs), PART):
                    last_use.update(
                        dict.fromkeys(frees.intersection(inputs[start : start + PART]), index)
                    )
                    yield
                continue
            for tensor_id in inputs:
                if tensor_id in frees:
                    last_use[tensor_id] = index
        yield
    ids = list(frees)
    for first in range(0, len(ids), PART):
        for tensor_id in ids[first : first + PART]:
            last = last_use.get(tensor_id)
            if last is None:
                store.free(tensor_id)
            else:
                job.frees_after.setdefault(last, []).append(tensor_id)
        yield


def freed_again(store: TensorStore, frees: list[int]) -> Iterator[None]:
    """Free every id of ``frees`` (once the batch's ops have run)."""
    for first in range(0, len(frees), PART):
        for tensor_id in frees[first : first + PART]:
            store.free(tensor_id)
        yield


def run_chores(job: Job, pause_at: float) -> bool:
    """Run ``job.chores`` until they are done (True), or pause (False, ``job.paused``) once
    ``time.monotonic()`` passes ``pause_at``; one part runs in any case."""
    assert job.chores is not None
    for _ in job.chores:
        if time.monotonic() > pause_at:
            job.paused = True
            return False
    job.chores = None
    return True


__all__ = ["PART", "freed_again", "planned", "run_chores"]
