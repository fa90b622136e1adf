"""``run_segment``: ops that the client sent one by one before, run again by the plan of the
graph it registered for them (``client/_segments.py`` recognises them), leaving the session as
those ops sent one by one would.

A segment is a registered graph read another way (``protocol.ops.RunSegment``): its inputs
``0 .. m - 1`` are the run's ``args``, any other graph id ``g`` is the tensor id
``out + g - m``, its declared outputs are the tensors the client still holds and the rest are
intermediates the client already freed (their frees travel in the batch all the same: frees
are idempotent). So every op's output has the id it had when it came alone.

The plan runs (``server/plans.py``: no decoding, checks made once at registration) when the
run can be shown to do exactly what the ops would: every input stored and not failed, with
the registered metas; no output id in use; the batch not refused; its scratch reserved. Its
outputs are stored in op order, so that one that is a view of another (or of an input) is kept
as a view, counted once, as when its op came alone; each op counts as run (metrics).

Anything else runs op by op (:meth:`Segments._one_by_one`): each op renumbered to its real ids
and run by the session's own path (``Session.run_one``), with its own checks, errors,
inherited failures and reservations; an intermediate is freed after the last op that reads it,
as the batch's frees would free it. A step of the plan that raises at op k leaves the results
of the ops before it (those still read, and the outputs) stored under their ids, fails op k
with the error its op alone gets (``Outcomes.run_failed``), and runs the ops after it one by
one. A segment's fallback runs in a worker thread, as an op too costly for the loop does.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import cast

import numpy as np

from protocol import ErrorCode, TensorMeta, from_numpy
from protocol.graphs import renumber
from protocol.ops import AnyOp, BaseOp, RunSegment
from protocol.ops.graph import varies

from .errors import StoreError
from .executor.base import Array
from .graphs import Graphs
from .outcome import Job, Outcomes
from .plans import Plan, ReplayError, Stopped, replay
from .roots import root_of
from .store import Failure, Stored

RunOne = Callable[[AnyOp, Job], None]
Ops = dict[int, BaseOp]  # a run's ops in place of its plan's, by step index (values that vary)


class Segments:
    """One session's runs of registered segments, over its registered graphs."""

    def __init__(
        self,
        graphs: Graphs,
        outcomes: Outcomes,
        run_one: RunOne,
        stopped: Callable[[], bool],
    ) -> None:
        self._graphs = graphs
        self._outcomes = outcomes
        self._store = outcomes.store
        self._run_one = run_one
        self._stopped = stopped
        self._varying: dict[int, tuple[Plan, tuple[int, ...]]] = {}  # graph: its ops that vary

    def run(self, op: RunSegment, job: Job, inline: bool, most: int) -> bool:
        """Run ``op`` (see the module docstring). False: it is too costly to run ``inline``
        (``Graphs.fits_inline``, ``most``: nothing changed). The caller
        holds ``np.errstate(all="ignore")``."""
        plan = self._graphs.plan(op.graph)
        ops = None if plan is None else self._varied(op, plan)
        if plan is None or ops is None or not _laid_out(op, plan):
            self._outcomes.fail(
                op,
                ErrorCode.UNKNOWN_GRAPH,
                f"graph #{op.graph} is not registered in this session as a segment of "
                f"{len(op.args)} inputs and {len(op.scalars)} values that vary",
                job,
            )
            return True
        args = self._bound(op, plan, job)
        if inline and (args is None or not self._graphs.fits_inline(op, plan, most)):
            return False  # a worker thread runs it
        if args is None:
            self._one_by_one(op, plan, job, ops, 0)
        else:
            self._replay(op, plan, job, ops, args)
        return True

    def _varied(self, op: RunSegment, plan: Plan) -> dict[int, BaseOp] | None:
        """The ops whose values ``op`` gives (``protocol.ops.graph.varies``), by step index;
        None if it gives some, but not one for each of them."""
        cached = self._varying.get(op.graph)
        if cached is None or cached[0] is not plan:
            cached = self._varying[op.graph] = (
                plan,
                tuple(step.index for step in plan.steps if varies(step.op)),
            )
        indices = cached[1]
        if not op.scalars:
            return {}
        if len(op.scalars) != len(indices):
            return None
        steps = plan.steps
        return {
            i: steps[i].op.model_copy(update={"value": value})
            for i, value in zip(indices, op.scalars, strict=True)
        }

    def _bound(self, op: RunSegment, plan: Plan, job: Job) -> list[Array] | None:
        """The input arrays when the plan may run ``op``; None when it must go op by op."""
        if job.rejected is not None:
            return None
        store, first = self._store, op.out - len(op.args)
        for graph_id in plan.slot_ids[len(op.args) :]:
            if first + graph_id in store:
                return None
        arrays: list[Array] = []
        for tensor_id, (_, meta) in zip(op.args, plan.signature, strict=True):
            if tensor_id not in store:
                return None
            value = store.get(tensor_id)
            if isinstance(value, Failure) or value.meta != meta:
                return None
            arrays.append(value.array)
        return arrays

    def _replay(self, op: RunSegment, plan: Plan, job: Job, ops: Ops, arrays: list[Array]) -> None:
        """Run ``plan`` for ``op`` on its input ``arrays`` and store its outputs, or go op by
        op where it cannot."""
        store = self._store
        try:
            if plan.guarded:  # made safe to write, which may move them
                arrays = self._graphs.guard(op, plan)
            store.reserve(plan.scratch)
        except StoreError:  # the ops alone say which one has no room, and how
            self._one_by_one(op, plan, job, ops, 0)
            return
        slots = list(plan.slots)
        for slot, array in zip(plan.input_slots, arrays, strict=True):
            slots[slot] = array

        def stopped() -> bool:  # each step is an op, for the per-op deadline
            job.op_started = time.monotonic()
            return self._stopped()

        try:
            results = replay(plan, slots, stopped, ops or None)
        except ReplayError as exc:
            store.cancel(plan.scratch)
            if not isinstance(exc.__cause__, Stopped):
                self._after_failure(op, plan, job, ops, exc, slots)
            return
        store.cancel(plan.scratch)
        self._keep(op, plan, job, ops, dict(zip(plan.output_slots, results, strict=True)))
        self._outcomes.ops_run += len(plan.steps)
        self._outcomes.op_counts.update(plan.op_counts)

    def _keep(
        self, op: RunSegment, plan: Plan, job: Job, ops: Ops, slots: dict[int, Array]
    ) -> None:
        """Store each made tensor of ``slots`` (slot: array) under its id, in op order: a view
        of a tensor stored before is kept as a view (its root counted once); a fresh root is
        counted whole, as the op that made it alone would have it counted."""
        store, ids = self._store, _ids(op, plan)
        for slot in sorted(slots):
            array = slots[slot]
            root = root_of(array)
            held = store.holds(root)
            if not held and root.base is not None:  # not numpy's own memory: copied
                array = root = np.array(array, order="C")
            need = 0 if held else root.nbytes
            meta = TensorMeta(array.shape, from_numpy(array.dtype))
            try:
                store.reserve(need)
            except StoreError as exc:
                self._outcomes.fail(_maker(plan, ops, slot, ids), exc.code, str(exc), job)
                continue
            store.put(ids[plan.slot_ids[slot]], Stored(array, meta), reserved=need)  # id: free

    def _after_failure(
        self,
        op: RunSegment,
        plan: Plan,
        job: Job,
        ops: Ops,
        exc: ReplayError,
        slots: list[Array | None],
    ) -> None:
        """Step ``exc.step`` raised: keep what the steps before it made and is still read or
        declared, fail its op as alone, and run the ops after it one by one."""
        failed = exc.step.index
        ids = _ids(op, plan)
        read_later = {s for step in plan.steps[failed:] for s in step.reads}
        keep = read_later | set(plan.output_slots)
        made: dict[int, Array] = {}
        for step in plan.steps[:failed]:
            for slot in () if step.op.inplace else step.writes:
                array = slots[slot]
                if slot in keep and array is not None:
                    made[slot] = array
        self._keep(op, plan, job, ops, made)
        self._outcomes.ops_run += failed
        cause = exc.__cause__
        assert isinstance(cause, Exception)
        self._outcomes.run_failed(_real(plan, ops, failed, ids), cause, 0, job)
        self._one_by_one(op, plan, job, ops, failed + 1)

    def _one_by_one(self, op: RunSegment, plan: Plan, job: Job, ops: Ops, start: int) -> None:
        """Run the segment's ops from ``start`` on, each as if it came alone; free each
        intermediate after the last op that reads it."""
        ids = _ids(op, plan)
        declared = set(plan.output_slots)
        first_input = len(op.args)
        last_read: dict[int, int] = {}
        for step in plan.steps[start:]:
            for slot in step.reads:
                if slot >= first_input and slot not in declared:
                    last_read[slot] = step.index
        frees: dict[int, list[int]] = {}
        for slot, index in last_read.items():
            frees.setdefault(index, []).append(ids[plan.slot_ids[slot]])
        for step in plan.steps[start:]:
            if self._stopped():
                return
            self._run_one(_real(plan, ops, step.index, ids), job)
            for tensor_id in frees.get(step.index, ()):
                self._store.free(tensor_id)


def _laid_out(op: RunSegment, plan: Plan) -> bool:
    """Whether ``plan`` is a segment's graph for ``op``: inputs ``0 .. m - 1`` bound to its
    args, and every id it makes within tensor ids."""
    count = len(op.args)
    if plan.slot_ids[:count] != tuple(range(count)) or len(plan.input_slots) != count:
        return False
    return op.out + max(plan.slot_ids, default=0) - count < 2**63


def _maker(plan: Plan, ops: Ops, slot: int, ids: dict[int, int]) -> AnyOp:
    """The op that made ``slot``, with its real ids."""
    step = next(step for step in plan.steps if slot in step.writes and not step.op.inplace)
    return _real(plan, ops, step.index, ids)


def _real(plan: Plan, ops: Ops, index: int, ids: dict[int, int]) -> AnyOp:
    """Op ``index`` of the segment as its run sends it (``ops``: the values that vary), with
    its real ids."""
    return renumber(cast(AnyOp, ops.get(index, plan.steps[index].op)), ids)


def _ids(op: RunSegment, plan: Plan) -> dict[int, int]:
    """The real tensor id of each of the graph's ids."""
    count = len(op.args)
    ids = dict(enumerate(op.args))
    for graph_id in plan.slot_ids[count:]:
        ids[graph_id] = op.out + graph_id - count
    return ids
