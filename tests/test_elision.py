"""Temporary elision in replayed graphs (``server/elision.py``): which steps write their result
into an input that dies at them, and that a replay computes exactly what the same ops run one
by one compute (each result a new array), views of intermediates and in-place ops included."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.graphs import GraphDef, GraphTensor, check_graph
from protocol.ops import (
    Binary,
    BinaryScalar,
    InPlaceBinary,
    PermuteDims,
    Reduce,
    Reshape,
    Unary,
)
from protocol.ops.base import BaseOp
from server import executor
from server.elision import elided_inputs
from server.executor.elementwise import writes_into
from server.plans import build_plan, replay

SHAPE = (3, 3)  # square: a transposed intermediate has the shape of the others


def _graph(
    inputs: dict[int, str], ops: list[Any], outputs: list[int], shape: tuple[int, ...] = SHAPE
) -> GraphDef:
    """Inputs ``{id: dtype}`` of ``shape``; outputs by id, their metas from the check."""
    declared = [
        GraphTensor(name=f"in{i}", id=i, shape=shape, dtype=d)  # type: ignore[arg-type]
        for i, d in inputs.items()
    ]
    draft = GraphDef(inputs=declared, ops=ops, outputs=[])
    metas = check_graph(draft).metas
    named = [
        GraphTensor(name=f"out{i}", id=i, shape=metas[i].shape, dtype=metas[i].dtype)
        for i in outputs
    ]
    return GraphDef(inputs=declared, ops=ops, outputs=named)


def _elided(graph: GraphDef) -> dict[int, int]:
    kept = {t.id for t in graph.inputs} | {t.id for t in graph.outputs}
    return elided_inputs(graph.ops, check_graph(graph), kept)


def _replayed(graph: GraphDef, values: dict[int, np.ndarray]) -> list[np.ndarray]:
    plan = build_plan(graph, check_graph(graph), [], 0, 0)
    slots = list(plan.slots)
    for slot, tensor in zip(plan.input_slots, graph.inputs, strict=True):
        slots[slot] = values[tensor.id].copy()
    with np.errstate(all="ignore"):
        return list(replay(plan, slots, lambda: False))


def _one_by_one(graph: GraphDef, values: dict[int, np.ndarray]) -> list[np.ndarray]:
    """The reference: every op through ``executor.run``, each result a new array."""
    arrays = {i: v.copy() for i, v in values.items()}
    check = check_graph(graph)
    for op, metas in zip(graph.ops, check.op_metas, strict=True):
        results = executor.run(op, [arrays[i] for i in op.inputs()], (), metas, in_place=True)
        arrays.update(zip(op.outputs(), results, strict=True))
    return [arrays[t.id] for t in graph.outputs]


def _values(inputs: dict[int, str], seed: int = 0) -> dict[int, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {i: rng.uniform(0.5, 2.0, SHAPE).astype(d) for i, d in inputs.items()}


def _assert_same(graph: GraphDef, inputs: dict[int, str]) -> None:
    values = _values(inputs)
    for got, want in zip(_replayed(graph, values), _one_by_one(graph, values), strict=True):
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got, want, strict=True)
        # the same layout too: a reduction sums in memory order, so its bits follow it
        assert got.strides == want.strides


# --- which steps elide ----------------------------------------------------------------------


def test_adams_second_moment_writes_its_product_into_the_dying_temporary() -> None:
    """``v = 0.999 * v + 0.001 * g * g``: ``(0.001 * g) * g`` lands in ``0.001 * g``."""
    ops = [
        BinaryScalar(op="multiply", out=2, x=1, scalar=0.001, scalar_first=True),
        Binary(op="multiply", out=3, x1=2, x2=1),
        InPlaceBinary(op="add", out=0, x2=3),
    ]
    graph = _graph({0: "float32", 1: "float32"}, ops, [])
    assert _elided(graph) == {1: 0}
    _assert_same(_graph({0: "float32", 1: "float32"}, ops, [3]), {0: "float32", 1: "float32"})


def test_a_chain_writes_each_result_into_the_one_before() -> None:
    ops = [
        Unary(op="exp", out=1, x=0),
        BinaryScalar(op="add", out=2, x=1, scalar=1.0),
        Unary(op="sqrt", out=3, x=2),
        Binary(op="multiply", out=4, x1=0, x2=3),
    ]
    graph = _graph({0: "float64"}, ops, [4])
    assert _elided(graph) == {1: 0, 2: 0, 3: 1}
    _assert_same(graph, {0: "float64"})


@pytest.mark.parametrize(
    ("why", "inputs", "ops", "outputs"),
    [
        ("a graph input dies", {0: "float64"}, [Unary(op="exp", out=1, x=0)], [1]),
        (
            "an output is never written over",
            {0: "float64"},
            [Unary(op="exp", out=1, x=0), Unary(op="sqrt", out=2, x=1)],
            [1, 2],
        ),
        (
            "a view of it may outlive it",
            {0: "float64"},
            [
                Unary(op="exp", out=1, x=0),
                Reshape(out=2, x=1, shape=SHAPE),
                Unary(op="sqrt", out=3, x=1),
            ],
            [2, 3],
        ),
        (
            "a transposed view of it",
            {0: "float64"},
            [
                Unary(op="exp", out=1, x=0),
                PermuteDims(out=2, x=1, axes=(0, 1)),
                Unary(op="sqrt", out=3, x=1),
            ],
            [2, 3],
        ),
        (
            "it is itself a view",
            {0: "float64"},
            [
                Unary(op="exp", out=1, x=0),
                Reshape(out=2, x=1, shape=SHAPE),
                Unary(op="sqrt", out=3, x=2),
            ],
            [1, 3],
        ),
        (
            "the result is another dtype",
            {0: "float32", 1: "float64"},
            [Unary(op="exp", out=2, x=0), Binary(op="add", out=3, x1=2, x2=1)],
            [3],
        ),
        (
            "the result is bool",
            {0: "float64"},
            [Unary(op="exp", out=1, x=0), BinaryScalar(op="less", out=2, x=1, scalar=1.0)],
            [2],
        ),
        (
            "matmul cannot write into an input",
            {0: "float64"},
            [
                Unary(op="exp", out=1, x=0),
                PermuteDims(out=2, x=0, axes=(1, 0)),
                Binary(op="matmul", out=3, x1=1, x2=2),
            ],
            [3],
        ),
        (
            "float floor_divide has a fix-up after numpy",
            {0: "float64"},
            [Unary(op="exp", out=1, x=0), BinaryScalar(op="floor_divide", out=2, x=1, scalar=0.5)],
            [2],
        ),
        (
            "complex tanh has a fix-up after numpy",
            {0: "complex128"},
            [Unary(op="exp", out=1, x=0), Unary(op="tanh", out=2, x=1)],
            [2],
        ),
        (
            "real returns a view",
            {0: "complex128"},
            [Unary(op="real", out=1, x=0), Unary(op="exp", out=2, x=1)],
            [2],
        ),
        (
            "a reduction reads it (not known to copy)",
            {0: "float64"},
            [
                Unary(op="exp", out=1, x=0),
                Reduce(op="sum", out=2, x=1),
                Unary(op="sqrt", out=3, x=1),
            ],
            [2, 3],
        ),
    ],
)
def test_no_elision_where_it_could_change_a_result(
    why: str, inputs: dict[int, str], ops: list[BaseOp], outputs: list[int]
) -> None:
    graph = _graph(inputs, ops, outputs)
    assert _elided(graph) == {}, why


def test_only_one_exact_ufunc_call_may_write_into_an_input() -> None:
    assert writes_into(Unary(op="exp", out=1, x=0), ["float32"])
    assert writes_into(BinaryScalar(op="pow", out=1, x=0, scalar=2.0), ["float64"])
    assert not writes_into(Unary(op="sqrt", out=1, x=0), ["int8"])  # numpy's float16: float64
    assert not writes_into(Binary(op="pow", out=2, x1=0, x2=1), ["int64", "int64"])
    assert not writes_into(Binary(op="matmul", out=2, x1=0, x2=1), ["float64", "float64"])
    assert not writes_into(Unary(op="round", out=1, x=0), ["float64"])  # not a ufunc


def test_a_result_keeps_the_layout_numpy_gives_it() -> None:
    """``exp(x.T)`` is Fortran-ordered; ``exp(x.T) + y`` with ``y`` C-ordered is C-ordered in
    numpy, so it is not written into the Fortran-ordered temporary (a reduction of it would
    sum in another order)."""
    ops = [
        PermuteDims(out=2, x=0, axes=(1, 0)),
        Unary(op="exp", out=3, x=2),
        Binary(op="add", out=4, x1=3, x2=1),
        Reduce(op="sum", out=5, x=4, axis=(1,)),
    ]
    _assert_same(_graph({0: "float64", 1: "float64"}, ops, [4, 5]), {0: "float64", 1: "float64"})


def test_a_0d_temporary_is_left_alone() -> None:
    ops = [Unary(op="exp", out=1, x=0), Unary(op="sqrt", out=2, x=1)]
    graph = _graph({0: "float64"}, ops, [2], shape=())
    assert _elided(graph) == {}


def test_a_result_lands_in_the_memory_of_the_input_it_elides() -> None:
    ops = [Unary(op="exp", out=1, x=0), BinaryScalar(op="add", out=2, x=1, scalar=1.0)]
    graph = _graph({0: "float64"}, ops, [2])
    plan = build_plan(graph, check_graph(graph), [], 0, 0)
    slots = list(plan.slots)
    slots[plan.input_slots[0]] = np.ones(SHAPE)
    seen: list[np.ndarray] = []
    first = plan.steps[0]
    run = first.run

    def keep(op: Any, args: Any, buffers: Any) -> Any:
        seen.append(run(op, args, buffers))
        return seen[-1]

    object.__setattr__(first, "run", keep)  # the test watches the first step's result
    (result,) = replay(plan, slots, lambda: False)
    assert result is seen[0]
    np.testing.assert_array_equal(result, np.e + 1.0)


# --- replays equal op-by-op runs -------------------------------------------------------------

_UNARY = ["negative", "exp", "sqrt", "abs", "tanh", "square", "sin", "log1p"]
_BINARY = [
    "add",
    "subtract",
    "multiply",
    "divide",
    "maximum",
    "minimum",
    "pow",
    "hypot",
    "floor_divide",
    "remainder",
]


@st.composite
def graphs(draw: st.DrawFn) -> tuple[GraphDef, dict[int, str]]:
    """Random graphs over two inputs of one shape: ufuncs, scalar ops, views of intermediates
    (a reshape or a permutation to the same shape) and in-place ops on intermediates, with a
    random set of outputs; mixed float32/float64, so some results change dtype."""
    inputs = {0: draw(st.sampled_from(["float32", "float64"])), 1: "float64"}
    live, made, ops = [0, 1], [], []
    next_id = 2
    for _ in range(draw(st.integers(1, 12))):
        kind = draw(st.sampled_from(["unary", "binary", "scalar", "view", "inplace"]))
        x = draw(st.sampled_from(live))
        if kind == "inplace":
            if not made:
                continue
            target = draw(st.sampled_from(made))
            op: BaseOp = InPlaceBinary(
                op=draw(st.sampled_from(["add", "multiply"])), out=target, x2=x
            )
            try:
                check_graph(GraphDef(inputs=_declared(inputs), ops=[*ops, op], outputs=[]))
            except Exception:  # noqa: BLE001 - a dtype the in-place rule refuses: draw again
                continue
            ops.append(op)
            continue
        if kind == "unary":
            op = Unary(op=draw(st.sampled_from(_UNARY)), out=next_id, x=x)
        elif kind == "binary":
            op = Binary(
                op=draw(st.sampled_from(_BINARY)), out=next_id, x1=x, x2=draw(st.sampled_from(live))
            )
        elif kind == "scalar":
            op = BinaryScalar(
                op=draw(st.sampled_from(_BINARY)),
                out=next_id,
                x=x,
                scalar=draw(st.sampled_from([0.5, 2.0, 3])),
                scalar_first=draw(st.booleans()),
            )
        else:
            op = draw(
                st.sampled_from(
                    [
                        Reshape(out=next_id, x=x, shape=SHAPE),
                        PermuteDims(out=next_id, x=x, axes=(0, 1)),
                        PermuteDims(out=next_id, x=x, axes=(1, 0)),
                    ]
                )
            )
        ops.append(op)
        live.append(next_id)
        made.append(next_id)
        next_id += 1
    outputs = draw(st.lists(st.sampled_from(made), unique=True, min_size=1)) if made else []
    if not outputs:
        ops.append(Unary(op="negative", out=next_id, x=0))
        outputs = [next_id]
    return _graph(inputs, ops, outputs), inputs


def _declared(inputs: dict[int, str]) -> list[GraphTensor]:
    return [
        GraphTensor(name=f"in{i}", id=i, shape=SHAPE, dtype=d)  # type: ignore[arg-type]
        for i, d in inputs.items()
    ]


@settings(max_examples=600, deadline=None)
@given(graphs())
def test_a_replay_equals_the_ops_run_one_by_one(drawn: tuple[GraphDef, dict[int, str]]) -> None:
    graph, inputs = drawn
    _assert_same(graph, inputs)
