"""A checked graph made ready to replay (:class:`Plan`), and its replay: what ``run_graph``
costs per op is what :func:`replay` does per :class:`Step`.

Every graph id has a *slot* in a list: the inputs, the constants, then each op's outputs. A
step holds its op's runner (an in-place one bound to write into its target; one that elides
a temporary bound to write into the input that dies at it, ``server/elision.py``), the slots it
reads and writes, the shape and dtype each result must have, and the slots whose last use it
is, cleared after it so that numpy can reuse an intermediate's memory at once. The plan also
knows its cost (``executor.cost`` of each op, summed) and its scratch bytes (the graph's peak of
live bytes, :attr:`GraphCheck.peak_bytes`, less its inputs and constants, which are counted
already, plus the most scratch one op allocates beside its results, ``executor.scratch``).
Nothing here touches a store: ``server/graphs.py`` binds the inputs and keeps the outputs.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache, partial
from typing import Any

import numpy as np

from protocol import TensorMeta, to_numpy
from protocol.codec import Buffer
from protocol.graphs import GraphCheck, GraphDef
from protocol.ops import AnyOp
from protocol.ops.base import BaseOp

from . import executor
from .elision import elided_inputs
from .executor import elementwise
from .executor.base import Array, Runner

Expect = tuple[tuple[int, ...], np.dtype[Any]]  # a result's shape and numpy dtype
# The least cost a step counts for, whatever its arrays' sizes: a graph of over
# INLINE_COST / MIN_STEP_COST ops (1024) runs in a worker thread. (Below the loop's own time
# per step, in the cost model's unit: a bound on a graph's length, not a price; bench/REASONS.md,
# 'Inline slices of the event loop'.)
MIN_STEP_COST = 64
SHAPED_KEPT = 1024  # arrays of distinct metas kept by shaped_like, each some 100 bytes


@dataclass(frozen=True, slots=True)
class Step:
    """Op number ``index`` of a plan, ready to run on a replay's slots."""

    index: int
    op: BaseOp
    run: Runner
    reads: tuple[int, ...]
    writes: tuple[int, ...]
    expect: tuple[Expect, ...]
    frees: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Plan:
    """A registered graph, ready to replay (see the module docstring)."""

    signature: tuple[tuple[str, TensorMeta], ...]  # the declared inputs: name, meta
    outputs: tuple[TensorMeta, ...]
    slots: tuple[Array | None, ...]  # a replay's slots before its inputs are bound
    input_slots: tuple[int, ...]
    output_slots: tuple[int, ...]
    written: frozenset[int]  # positions of the inputs that an in-place op targets
    guarded: bool  # some op writes in place: inputs are made safe to write first
    steps: tuple[Step, ...]
    cost: int  # executor.cost of every op, summed
    largest_step: int  # the most one op costs: a registration over --max-op-cost is refused
    scratch: int  # bytes reserved per replay: the peak of live bytes less inputs, constants,
    # plus the most one op allocates beside its results
    slot_ids: tuple[int, ...]  # the graph's id held by each slot (a segment's run maps them)
    output_ids: tuple[int, ...]  # the graph's ids of its declared outputs, in order
    held_bytes: int  # what the registration holds: its constants, its structure (registration.py)
    op_counts: Counter[str]


class ReplayError(Exception):
    """A step raised ``exc`` (its cause)."""

    def __init__(self, step: Step, exc: Exception) -> None:
        op = step.op
        super().__init__(f"op {step.index} ({op.describe()}): {type(exc).__name__}: {exc}")
        self.step = step
        self.mismatch = isinstance(exc, executor.InferenceMismatch)


class Stopped(Exception):
    """The session closed (the per-op deadline, a drain) while its graph ran."""


def replay(
    plan: Plan,
    slots: list[Any],
    stopped: Callable[[], bool],
    ops: Mapping[int, BaseOp] | None = None,
) -> tuple[Array, ...]:
    """Run ``plan``'s steps on ``slots`` (inputs bound) and return its outputs, verified.
    ``stopped()`` is asked before each step: a closed session's replay ends there, so a long
    graph in a worker thread holds its slot no longer than its current step. ``ops``: the op
    a step runs instead of its own, by step index (a segment's values that vary, of the same
    inference). The caller holds ``np.errstate(all="ignore")``.

    Raises:
        ReplayError: a step raised, gave a result that is not the inferred one, or the
            session stopped (its cause is :class:`Stopped`).
    """
    step: Step | None = None
    try:
        for step in plan.steps:
            if stopped():
                raise Stopped("the session closed while its graph ran")
            op = step.op if ops is None else ops.get(step.index, step.op)
            raw = step.run(op, [slots[i] for i in step.reads], ())
            results = raw if type(raw) is tuple else (raw,)
            if len(results) != len(step.writes):
                raise executor.InferenceMismatch(f"{len(results)} results")
            for slot, result, (shape, dtype) in zip(step.writes, results, step.expect, strict=True):
                if type(result) is not np.ndarray:
                    result = np.asarray(result)  # a numpy scalar
                if result.shape != shape or result.dtype != dtype:
                    raise executor.InferenceMismatch(
                        f"gave {result.dtype}{list(result.shape)}, inferred {dtype}{list(shape)}"
                    )
                slots[slot] = result
            for slot in step.frees:
                slots[slot] = None  # its last use: numpy may reuse the memory now
    except Exception as exc:
        assert step is not None
        raise ReplayError(step, exc) from exc
    return tuple(slots[slot] for slot in plan.output_slots)


def constant_array(shape: tuple[int, ...], dtype: Any, buffer: Buffer) -> Array:
    """A read-only array of a copy of ``buffer``'s bytes (not of the message, which goes). Its
    memory is a ``bytes`` object, so a result that is a view of it is copied before it is
    stored (``Outcomes._owned``), and an in-place op on a view of it writes into a copy."""
    array: Array = np.frombuffer(bytes(buffer), dtype=to_numpy(dtype)).reshape(shape)
    return array


@lru_cache(maxsize=SHAPED_KEPT)
def shaped_like(meta: TensorMeta) -> Array:
    """An array of ``meta``'s shape and dtype that holds no memory, for ``executor.cost`` and
    ``executor.scratch`` (read-only: one serves every input of that meta, which numpy shapes
    in microseconds: a ``stack`` of a million inputs took seconds)."""
    return np.broadcast_to(np.zeros((), dtype=to_numpy(meta.dtype)), meta.shape)


def build_plan(
    graph: GraphDef,
    check: GraphCheck,
    constants: Sequence[Array],
    constant_bytes: int,
    held_bytes: int,
) -> Plan:
    """The :class:`Plan` of a checked ``graph`` whose constants are ``constants``."""
    declared = [t.id for t in graph.inputs] + [c.id for c in graph.constants]
    slot = {tensor_id: number for number, tensor_id in enumerate(declared)}
    for op in graph.ops:
        for out in () if op.inplace else op.outputs():
            slot[out] = len(slot)
    kept = {*declared, *(t.id for t in graph.outputs)}  # never cleared
    frees: dict[int, list[int]] = {}  # op index -> the slots whose last use it is
    for index, op in enumerate(graph.ops):
        for out in () if op.inplace else op.outputs():
            if out not in kept:
                frees.setdefault(check.last_use.get(out, index), []).append(slot[out])
    into = elided_inputs(graph.ops, check, kept)
    steps: list[Step] = []
    cost = largest_step = largest_scratch = 0
    for index, (op, metas) in enumerate(zip(graph.ops, check.op_metas, strict=True)):
        reads = tuple(slot[i] for i in op.inputs())
        run = _runner(op, into.get(index))
        expect = tuple((m.shape, to_numpy(m.dtype)) for m in metas)
        writes = tuple(slot[o] for o in op.outputs())
        steps.append(Step(index, op, run, reads, writes, expect, tuple(frees.get(index, ()))))
        # At least MIN_STEP_COST a step: ops on empty arrays cost nothing to numpy but not to
        # the loop, and a long enough graph of them must not run on it.
        shaped = [shaped_like(check.metas[i]) for i in op.inputs()]
        step_cost = executor.cost(op, metas[0], shaped)
        largest_step = max(largest_step, step_cost)
        largest_scratch = max(largest_scratch, executor.scratch(op, metas[0], shaped))
        cost += max(MIN_STEP_COST, step_cost)
    template: list[Array | None] = [None] * len(slot)
    for constant, array in zip(graph.constants, constants, strict=True):
        template[slot[constant.id]] = array
    targets = {op.out for op in graph.ops if op.inplace}
    held = sum(_nbytes(t.meta) for t in graph.inputs) + constant_bytes
    return Plan(
        signature=tuple((t.name, t.meta) for t in graph.inputs),
        outputs=tuple(t.meta for t in graph.outputs),
        slots=tuple(template),
        input_slots=tuple(slot[t.id] for t in graph.inputs),
        output_slots=tuple(slot[t.id] for t in graph.outputs),
        written=frozenset(i for i, t in enumerate(graph.inputs) if t.id in targets),
        guarded=bool(targets),
        steps=tuple(steps),
        cost=cost,
        largest_step=largest_step,
        scratch=max(0, check.peak_bytes - held) + largest_scratch,
        slot_ids=tuple(slot),
        output_ids=tuple(t.id for t in graph.outputs),
        held_bytes=held_bytes,
        op_counts=check.op_counts,
    )


def _runner(op: AnyOp, into: int | None) -> Runner:
    """What a step of ``op`` runs: an in-place op bound to write into its target; an op that
    elides a temporary (``server/elision.py``) bound to write into its input number ``into``;
    else the executor's runner."""
    if op.inplace:  # the session made every input safe to write first, and an intermediate
        return executor.IN_PLACE_RUNNERS[type(op)]  # is the graph's own
    if into is not None:
        return partial(elementwise.into_input, position=into)
    return executor.runner(op)


def _nbytes(meta: TensorMeta) -> int:
    return math.prod(meta.shape) * to_numpy(meta.dtype).itemsize
