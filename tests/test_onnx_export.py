"""Graphs exported to ONNX compute what the server computes: each graph here is built by hand
(graph-relative ids, as a capture records them: ``tests/onnx_graphs.py``), exported with
``client.capture.onnx.to_onnx``, run by onnxruntime, and compared with the server's numpy
runners (``server.executor``) on the same inputs, and for the MLP with numpy written out by
hand."""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
import pytest

from client.capture.onnx import OnnxExportError, to_onnx
from protocol.dtypes import DType
from protocol.ops import (
    FFT,
    Arange,
    ArrayIndex,
    AsType,
    Axes,
    Binary,
    BinaryScalar,
    BroadcastTo,
    Cumulative,
    Eye,
    Full,
    GetItem,
    InPlaceBinary,
    InPlaceBinaryScalar,
    Join,
    Linalg,
    Linspace,
    MoveAxis,
    PermuteDims,
    Reduce,
    Repeat,
    Reshape,
    Roll,
    SetItem,
    SliceSpec,
    Sort,
    Take,
    Tile,
    Triangle,
    Unary,
    Where,
)
from protocol.ops.base import BaseOp

from .onnx_graphs import Builder, assert_same, export_and_compare, floats, run_onnx

# --- an MLP's forward pass --------------------------------------------------------------------


def _log_softmax(b: Builder, z: int, dtype: DType) -> int:
    """As client.autodiff's log_softmax computes it: shifted by the finite row maximum."""
    m = b.op(lambda o: Reduce(op="max", out=o, x=z, axis=(-1,), keepdims=True))
    finite = b.op(lambda o: Unary(op="isfinite", out=o, x=m))
    zero = b.op(lambda o: Full(out=o, shape=(), dtype=dtype, value=0.0))
    shift = b.op(lambda o: Where(out=o, condition=finite, x1=m, x2=zero))
    shifted = b.op(lambda o: Binary(op="subtract", out=o, x1=z, x2=shift))
    e = b.op(lambda o: Unary(op="exp", out=o, x=shifted))
    total = b.op(lambda o: Reduce(op="sum", out=o, x=e, axis=(-1,), keepdims=True))
    log_total = b.op(lambda o: Unary(op="log", out=o, x=total))
    return b.op(lambda o: Binary(op="subtract", out=o, x1=shifted, x2=log_total))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_an_mlp_forward_pass_matches_numpy(dtype: DType) -> None:
    x_value = floats(16, 10, dtype=dtype)
    w1, w2 = floats(10, 32, dtype=dtype) / math.sqrt(10), floats(32, 4, dtype=dtype) / math.sqrt(32)
    b1, b2 = floats(32, dtype=dtype), floats(4, dtype=dtype)
    b = Builder()
    x = b.input("x", x_value)
    c_w1, c_b1, c_w2, c_b2 = (b.constant(a) for a in (w1, b1, w2, b2))
    h = b.op(lambda o: Binary(op="matmul", out=o, x1=x, x2=c_w1))
    h = b.op(lambda o: Binary(op="add", out=o, x1=h, x2=c_b1))
    h = b.op(lambda o: BinaryScalar(op="maximum", out=o, x=h, scalar=0))  # relu
    z = b.op(lambda o: Binary(op="matmul", out=o, x1=h, x2=c_w2))
    z = b.op(lambda o: Binary(op="add", out=o, x1=z, x2=c_b2))
    logits = np.maximum(x_value @ w1 + b1, 0) @ w2 + b2  # numpy, written out
    # the last subtraction cancels: its error is relative to the logits, not to the result
    scale = float(np.abs(logits).max())
    model = export_and_compare(b, scale, log_probs=_log_softmax(b, z, dtype), logits=z)

    shifted = logits - logits.max(axis=-1, keepdims=True)
    expected = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    got = run_onnx(model, {"x": x_value})
    assert got["log_probs"].dtype == np.dtype(dtype)
    assert_same(got["log_probs"], expected.astype(dtype), scale * 10)
    assert [i.name for i in model.graph.input] == ["x"]
    assert len(model.graph.initializer) >= 4


# --- element-wise -----------------------------------------------------------------------------

UNARY = (
    "abs negative positive exp log log1p log2 log10 sqrt square sin cos tanh floor ceil trunc "
    "round sign reciprocal isnan isinf isfinite"
).split()
# onnxruntime's CPU kernels of these are float32 only (the export is the same for float64)
UNARY_FLOAT32 = ["tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh"]


@pytest.mark.parametrize(
    ("name", "dtype"),
    [(n, d) for n in UNARY for d in ("float32", "float64")]
    + [(n, "float32") for n in UNARY_FLOAT32],
)
def test_unary_ops_match_numpy(name: str, dtype: DType) -> None:
    value = floats(3, 4, dtype=dtype, low=0.1, high=0.9)
    value[0, 0], value[0, 1] = -0.5, 2.5  # negatives where defined; round's half to even
    if name in ("log", "log1p", "log2", "log10", "sqrt", "asin", "acos", "atanh"):
        value = np.abs(value) % 1
    if name == "acosh":
        value = np.abs(value) + 1
    b = Builder()
    x = b.input("x", value)
    export_and_compare(b, y=b.op(lambda o: Unary(op=name, out=o, x=x)))


@pytest.mark.parametrize(
    "name",
    [
        "exp",
        "sqrt",
        "floor",
        "abs",
        "isnan",
        "logical_not",
        "bitwise_invert",
        "square",
        "negative",
        "sign",
    ],
)
def test_unary_ops_on_integers_follow_numpy_dtypes(name: str) -> None:
    """exp of int32 is float64, floor of an integer itself, logical_not of an int a bool."""
    b = Builder()
    x = b.input("x", np.array([[-3, 0, 2], [5, 1, -1]], dtype=np.int32))
    export_and_compare(b, y=b.op(lambda o: Unary(op=name, out=o, x=x)))


BINARY = (
    "add subtract multiply divide maximum minimum equal not_equal less less_equal greater "
    "greater_equal logical_and logical_or logical_xor"
).split()


@pytest.mark.parametrize(
    "dtypes",
    [("float32", "float32"), ("float64", "float32"), ("int32", "float32"), ("int64", "int32")],
)
@pytest.mark.parametrize("name", BINARY)
def test_binary_ops_match_numpy_with_promotion(name: str, dtypes: tuple[str, str]) -> None:
    """Mixed dtypes promote as numpy does (int32 and float32 give float64, int / int float64);
    the second operand broadcasts."""
    b = Builder()
    x1 = b.input("a", (floats(3, 4) * 4).astype(dtypes[0]))
    x2 = b.input("b", (floats(4, low=0.5, high=3) * 2).astype(dtypes[1]))
    export_and_compare(b, y=b.op(lambda o: Binary(op=name, out=o, x1=x1, x2=x2)))


@pytest.mark.parametrize(
    ("name", "dtype"),
    [
        ("pow", "float64"),
        ("remainder", "int64"),
        ("bitwise_and", "int32"),
        ("bitwise_xor", "uint8"),
        ("add", "bool"),
        ("multiply", "bool"),
        ("matmul", "int64"),
    ],
)
def test_more_binary_ops(name: str, dtype: str) -> None:
    b = Builder()
    if dtype == "bool":  # every pair of truth values
        x1 = b.input("a", np.array([[True, True], [False, False]]))
        x2 = b.input("b", np.array([[True, False], [True, False]]))
    else:
        x1 = b.input("a", (floats(3, 3, low=-3, high=5)).astype(dtype))
        x2 = b.input("b", (floats(3, 3, low=1, high=3)).astype(dtype))
    export_and_compare(b, y=b.op(lambda o: Binary(op=name, out=o, x1=x1, x2=x2)))


@pytest.mark.parametrize(
    ("name", "scalar", "scalar_first", "dtype"),
    [
        ("add", 1.5, False, "float32"),
        ("subtract", 1, True, "float32"),
        ("divide", 3, False, "int32"),
        ("pow", 2, False, "float64"),
        ("multiply", 2, True, "int8"),
        ("maximum", 0, False, "int64"),
        ("less", 0.5, False, "int16"),
        ("pow", 2.0, True, "float32"),
        ("logical_and", True, False, "bool"),
        ("add", 0.25, False, "uint8"),
    ],
)
def test_scalar_ops_take_numpys_operand_dtype(
    name: str, scalar: bool | int | float, scalar_first: bool, dtype: str
) -> None:
    """A Python scalar takes the array's dtype where its kind fits (an int beside int8 is an
    int8), else its kind's default (a float beside uint8 is float64)."""
    b = Builder()
    x = b.input("x", (floats(2, 5, low=0, high=4)).astype(dtype))
    y = b.op(lambda o: BinaryScalar(op=name, out=o, x=x, scalar=scalar, scalar_first=scalar_first))
    export_and_compare(b, y=y)


def test_in_place_ops_become_new_values() -> None:
    """``t += u`` (float64 into float32, cast back), ``t *= 0.5`` and ``t[1:, ::2] = v`` write
    the same id; what read ``t`` before still sees the old value, what reads it after the new."""
    b = Builder()
    x, u = b.input("x", floats(3, 4)), b.input("u", floats(4, dtype="float64"))
    t = b.op(lambda o: Unary(op="exp", out=o, x=x))
    before = b.op(lambda o: Unary(op="negative", out=o, x=t))
    b.inplace(InPlaceBinary(op="add", out=t, x2=u))
    b.inplace(InPlaceBinaryScalar(op="multiply", out=t, scalar=0.5))
    v = b.input("v", floats(2, 1))
    key = (SliceSpec(start=1), SliceSpec(step=2))
    b.inplace(SetItem(out=t, key=key, value=v))
    seven = b.op(lambda o: Full(out=o, shape=(), dtype="float32", value=7.0))
    b.inplace(SetItem(out=t, key=(0, -1), value=seven))
    after = b.op(lambda o: BinaryScalar(op="add", out=o, x=t, scalar=1.0))
    model = export_and_compare(b, t=t, before=before, after=after)
    assert [o.name for o in model.graph.output] == ["t", "before", "after"]


def test_where_and_astype() -> None:
    b = Builder()
    x, y = b.input("x", floats(4, 3)), b.input("y", np.arange(3, dtype=np.int64))
    condition = b.op(lambda o: BinaryScalar(op="greater", out=o, x=x, scalar=0.0))
    chosen = b.op(lambda o: Where(out=o, condition=condition, x1=x, x2=y))
    as_int = b.op(lambda o: AsType(out=o, x=x, dtype="int32"))
    as_bool = b.op(lambda o: AsType(out=o, x=x, dtype="bool"))
    export_and_compare(b, chosen=chosen, as_int=as_int, as_bool=as_bool)


# --- reductions -------------------------------------------------------------------------------


@pytest.mark.parametrize("keepdims", [False, True])
@pytest.mark.parametrize("axis", [None, (0,), (1, 2), (-1,), (0, -1), ()])
@pytest.mark.parametrize("name", ["sum", "mean", "max", "min", "prod", "var", "std"])
def test_reductions_with_axes_and_keepdims(
    name: str, axis: tuple[int, ...] | None, keepdims: bool
) -> None:
    b = Builder()
    x = b.input("x", floats(2, 3, 4, dtype="float64", low=0.5, high=1.5))
    y = b.op(lambda o: Reduce(op=name, out=o, x=x, axis=axis, keepdims=keepdims))
    export_and_compare(b, y=y)


@pytest.mark.parametrize(
    ("name", "dtype", "axis"),
    [
        ("sum", "int32", (1,)),
        ("prod", "int8", None),
        ("mean", "int64", (0,)),
        ("max", "bool", (1,)),
        ("var", "int32", None),
        ("std", "float32", (1,)),
        ("argmax", "float32", (1,)),
        ("argmin", "int32", None),
        ("any", "float32", (0,)),
        ("all", "int64", None),
        ("sum", "bool", None),
        ("mean", "float32", (0, 1)),
    ],
)
@pytest.mark.parametrize("keepdims", [False, True])
def test_reductions_follow_numpy_dtypes(
    name: str, dtype: str, axis: tuple[int, ...] | None, keepdims: bool
) -> None:
    """int32 sums to int64, an int's mean and var are float64, bool's max is a bool."""
    b = Builder()
    value = (floats(3, 4, low=-2, high=3)).astype(dtype)
    value[1, 2] = 0
    x = b.input("x", value)
    y = b.op(lambda o: Reduce(op=name, out=o, x=x, axis=axis, keepdims=keepdims))
    export_and_compare(b, y=y)


@pytest.mark.parametrize("keepdims", [False, True])
@pytest.mark.parametrize("axis", [None, (1,), (0,)])
@pytest.mark.parametrize("name", ["max", "min", "argmax", "argmin"])
def test_extremes_see_nan_as_numpy_does(
    name: str, axis: tuple[int, ...] | None, keepdims: bool
) -> None:
    """numpy's max is NaN where a NaN is, its argmax the first NaN's index; onnxruntime's
    ReduceMax and ArgMax skip NaNs, so the export says it itself."""
    value = np.array([[1.0, np.nan, 3.0, np.nan], [4.0, -np.inf, 2.0, 0.5]], dtype=np.float32)
    b = Builder()
    x = b.input("x", value)
    y = b.op(lambda o: Reduce(op=name, out=o, x=x, axis=axis, keepdims=keepdims))
    export_and_compare(b, y=y)


def test_variance_with_a_correction() -> None:
    b = Builder()
    x = b.input("x", floats(5, 6, dtype="float64"))
    var = b.op(lambda o: Reduce(op="var", out=o, x=x, axis=(1,), correction=1.0))
    std = b.op(lambda o: Reduce(op="std", out=o, x=x, axis=None, correction=1.5))
    export_and_compare(b, var=var, std=std)


# --- moving elements --------------------------------------------------------------------------


def test_reshape_transpose_expand_and_squeeze() -> None:
    b = Builder()
    x = b.input("x", floats(2, 3, 4))
    flat = b.op(lambda o: Reshape(out=o, x=x, shape=(-1, 4)))
    nothing = b.op(lambda o: Full(out=o, shape=(0, 3), dtype="int8", value=1))
    empty = b.op(lambda o: Reshape(out=o, x=nothing, shape=(3, 0)))  # a 0 is a 0, not "keep"
    turned = b.op(lambda o: PermuteDims(out=o, x=x, axes=(2, 0, -2)))
    moved = b.op(lambda o: MoveAxis(out=o, x=x, source=(0,), destination=(-1,)))
    wide = b.op(lambda o: Axes(op="expand_dims", out=o, x=x, axis=(0, -1)))
    narrow = b.op(lambda o: Axes(op="squeeze", out=o, x=wide, axis=(0, 4)))
    flipped = b.op(lambda o: Axes(op="flip", out=o, x=x, axis=(0, 2)))
    column = b.op(lambda o: Reshape(out=o, x=x, shape=(2, 1, 3, 4)))
    spread = b.op(lambda o: BroadcastTo(out=o, x=column, shape=(5, 2, 6, 3, 4)))
    export_and_compare(
        b,
        flat=flat,
        empty=empty,
        turned=turned,
        moved=moved,
        wide=wide,
        narrow=narrow,
        flipped=flipped,
        spread=spread,
    )


def test_zero_dimensional_and_empty_arrays() -> None:
    """A 0-d input (numpy's axis=() and None are the same there) and an empty axis."""
    b = Builder()
    x, e = b.input("x", np.array(2.5, dtype=np.float32)), b.input("e", floats(0, 3))
    doubled = b.op(lambda o: BinaryScalar(op="multiply", out=o, x=x, scalar=2))
    total = b.op(lambda o: Reduce(op="sum", out=o, x=x))
    arg = b.op(lambda o: Reduce(op="argmax", out=o, x=x))
    var = b.op(lambda o: Reduce(op="var", out=o, x=x))
    lifted = b.op(lambda o: Axes(op="expand_dims", out=o, x=x, axis=(0,)))
    empty_sum = b.op(lambda o: Reduce(op="sum", out=o, x=e, axis=(0,)))
    reversed_rows = b.op(lambda o: GetItem(out=o, x=e, key=(SliceSpec(step=-1),)))
    rolled = b.op(lambda o: Roll(out=o, x=e, shift=(2,), axis=(0,)))
    outputs = dict(doubled=doubled, total=total, arg=arg, var=var, lifted=lifted)
    export_and_compare(b, **outputs, empty_sum=empty_sum, reversed=reversed_rows, rolled=rolled)


def test_assignments_with_an_ellipsis_and_new_axes() -> None:
    b = Builder()
    x, v = b.input("x", floats(3, 4, 2)), b.input("v", floats(2))
    t = b.op(lambda o: Unary(op="exp", out=o, x=x))
    b.inplace(SetItem(out=t, key=("...", 1, None, SliceSpec()), value=v))
    b.inplace(SetItem(out=t, key=(SliceSpec(step=-2), -1), value=v))
    export_and_compare(b, t=t)


def test_concat_and_stack() -> None:
    b = Builder()
    x, y = b.input("x", floats(2, 3)), b.input("y", np.ones((2, 5), dtype=np.int64))
    z = b.input("z", floats(2, 3, dtype="float64"))
    along = b.op(lambda o: Join(op="concat", out=o, xs=(x, y), axis=-1))
    flat = b.op(lambda o: Join(op="concat", out=o, xs=(x, y, z), axis=None))
    stacked = b.op(lambda o: Join(op="stack", out=o, xs=(x, z, x), axis=-1))
    stacked0 = b.op(lambda o: Join(op="stack", out=o, xs=(x, x), axis=0))
    export_and_compare(b, along=along, flat=flat, stacked=stacked, stacked0=stacked0)


def test_take_and_take_along_axis() -> None:
    b = Builder()
    x = b.input("x", floats(4, 5))
    rows = b.input("rows", np.array([3, -1, 0, 0], dtype=np.int32))
    picked = b.op(lambda o: Take(op="take", out=o, x=x, indices=rows, axis=0))
    along_cols = b.input("cols", np.array([[4], [0], [2], [-2]], dtype=np.int64))
    along = b.op(lambda o: Take(op="take_along_axis", out=o, x=x, indices=along_cols, axis=1))
    one_row = b.input("one_row", np.array([[1, 3, 0, 2, 2]], dtype=np.int64))  # broadcast
    down = b.op(lambda o: Take(op="take_along_axis", out=o, x=x, indices=one_row, axis=0))
    export_and_compare(b, picked=picked, along=along, down=down)


@pytest.mark.parametrize(
    "key",
    [
        (1,),
        (-1, SliceSpec(step=2)),
        (SliceSpec(start=1, stop=-1), None, 2),
        ("...", SliceSpec(step=-1)),
        (SliceSpec(start=-2, step=-2), "...", None),
        (None, 0, SliceSpec(start=5)),
        (SliceSpec(),),
        (),
        (0, 1, 2),
        (SliceSpec(stop=-10, step=-1),),
    ],
)
def test_basic_indexing(key: tuple[Any, ...]) -> None:
    b = Builder()
    x = b.input("x", floats(3, 4, 5))
    export_and_compare(b, y=b.op(lambda o: GetItem(out=o, x=x, key=key)))


def test_indexing_with_one_integer_array() -> None:
    b = Builder()
    x = b.input("x", floats(3, 4, 5))
    i = b.input("i", np.array([[0, -1], [2, 2]], dtype=np.int16))
    key = (SliceSpec(), ArrayIndex(tensor=i))
    export_and_compare(b, y=b.op(lambda o: GetItem(out=o, x=x, key=key)))


def test_roll_tile_repeat_and_triangles() -> None:
    b = Builder()
    x = b.input("x", floats(3, 4))
    rolled = b.op(lambda o: Roll(out=o, x=x, shift=(1, -5), axis=(0, 1)))
    rolled_flat = b.op(lambda o: Roll(out=o, x=x, shift=(5,)))
    tiled = b.op(lambda o: Tile(out=o, x=x, reps=(2, 1, 3)))
    tiled_short = b.op(lambda o: Tile(out=o, x=x, reps=(2,)))
    repeated = b.op(lambda o: Repeat(out=o, x=x, repeats=3, axis=1))
    repeated_flat = b.op(lambda o: Repeat(out=o, x=x, repeats=2))
    lower = b.op(lambda o: Triangle(op="tril", out=o, x=x, k=-1))
    upper = b.op(lambda o: Triangle(op="triu", out=o, x=x, k=1))
    export_and_compare(
        b,
        rolled=rolled,
        rolled_flat=rolled_flat,
        tiled=tiled,
        tiled_short=tiled_short,
        repeated=repeated,
        repeated_flat=repeated_flat,
        lower=lower,
        upper=upper,
    )


def test_sorting_keeps_ties_in_order_and_cumulative_sums() -> None:
    b = Builder()
    x = b.input("x", np.array([[3, 1, 3, 2, 1], [0, 0, 5, 5, 0]], dtype=np.int32))
    ascending = b.op(lambda o: Sort(op="sort", out=o, x=x, axis=1))
    order = b.op(lambda o: Sort(op="argsort", out=o, x=x))
    descending = b.op(lambda o: Sort(op="argsort", out=o, x=x, axis=-1, descending=True))
    down = b.op(lambda o: Sort(op="sort", out=o, x=x, axis=0, descending=True))
    sums = b.op(lambda o: Cumulative(op="cumulative_sum", out=o, x=x, axis=1))
    initial = b.op(
        lambda o: Cumulative(op="cumulative_sum", out=o, x=x, axis=0, include_initial=True)
    )
    export_and_compare(
        b,
        ascending=ascending,
        order=order,
        descending=descending,
        down=down,
        sums=sums,
        initial=initial,
    )


def test_creation_ops_are_constants() -> None:
    b = Builder()
    x = b.input("x", floats(7))
    full = b.op(lambda o: Full(out=o, shape=(2, 3), dtype="int16", value=-4))
    steps = b.op(lambda o: Arange(out=o, start=0.5, stop=2.0, step=0.25, dtype="float32"))
    none = b.op(lambda o: Arange(out=o, start=5, stop=0, dtype="int64"))
    eye = b.op(lambda o: Eye(out=o, n_rows=3, n_cols=4, k=1, dtype="float64"))
    grid = b.op(lambda o: Linspace(out=o, start=0.0, stop=1.0, num=7, dtype="float32"))
    used = b.op(lambda o: Binary(op="multiply", out=o, x1=x, x2=grid))
    export_and_compare(b, full=full, steps=steps, none=none, eye=eye, grid=grid, used=used)


# --- what cannot be exported, and the file ----------------------------------------------------


def test_an_op_without_counterpart_is_named() -> None:
    b = Builder()
    x = b.input("x", floats(3, 3))
    y = b.op(lambda o: Unary(op="exp", out=o, x=x))
    inv = b.op(lambda o: Linalg(op="inv", out=o, xs=(y,)))
    with pytest.raises(
        OnnxExportError,
        match=rf"cannot export op 1 \(inv\(#{y}\) -> #{inv}\) "
        r"to ONNX: no counterpart",
    ):
        to_onnx(b.graph(y=inv), b.arrays)


@pytest.mark.parametrize(
    "make",
    [
        lambda x, o: FFT(op="fft", out=o, x=x),
        lambda x, o: Unary(op="expm1", out=o, x=x),
        lambda x, o: Cumulative(op="cumulative_prod", out=o, x=x, axis=0),
        lambda x, o: Binary(op="atan2", out=o, x1=x, x2=x),
    ],
)
def test_other_ops_without_counterpart(make: Callable[[int, int], BaseOp]) -> None:
    b = Builder()
    x = b.input("x", floats(4))
    y = b.op(lambda o: make(x, o))
    with pytest.raises(OnnxExportError, match=r"cannot export op 0 \(.*\) to ONNX"):
        to_onnx(b.graph(y=y), b.arrays)


def test_a_dtype_the_counterpart_lacks_names_the_op() -> None:
    """numpy negates uint8 (modulo 256); ONNX's Neg has no uint8: the checker's refusal names
    the op it is about."""
    b = Builder()
    x = b.input("x", np.arange(3, dtype=np.uint8))
    y = b.op(lambda o: Unary(op="negative", out=o, x=x))
    with pytest.raises(
        OnnxExportError,
        match=r"cannot export op 0 \(negative\(#0\) -> #1\) "
        r"to ONNX: its nodes fail ONNX's checker: .*uint8",
    ):
        to_onnx(b.graph(y=y), b.arrays)


def test_an_input_and_an_output_cannot_share_a_name() -> None:
    b = Builder()
    x = b.input("y", floats(2))
    with pytest.raises(OnnxExportError, match="'y' names both an input and an output"):
        to_onnx(b.graph(y=b.op(lambda o: Unary(op="exp", out=o, x=x))), b.arrays)


def test_a_write_through_a_view_is_refused() -> None:
    """``v = t[0:2]; v += 1`` changes ``t`` on the server, which ONNX values cannot show."""
    b = Builder()
    x = b.input("x", floats(3, 4))
    t = b.op(lambda o: Unary(op="exp", out=o, x=x))
    v = b.op(lambda o: GetItem(out=o, x=t, key=(SliceSpec(stop=2),)))
    b.inplace(InPlaceBinaryScalar(op="add", out=v, scalar=1.0))
    with pytest.raises(OnnxExportError, match=rf"op 2 .* into memory that #{t}, read afterwards,"):
        to_onnx(b.graph(t=t, v=v), b.arrays)
    export_and_compare(b, v=v)  # t read no more: the write is the view's alone


def test_a_write_seen_through_an_earlier_view_is_refused() -> None:
    """``v = t.T; t *= 2; v`` reads the doubled values on the server; a view made after the
    write needs nothing (``w`` below)."""
    b = Builder()
    t = b.op(lambda o: Full(out=o, shape=(2, 3), dtype="float64", value=1.5))
    v = b.op(lambda o: PermuteDims(out=o, x=t, axes=(1, 0)))
    b.inplace(InPlaceBinaryScalar(op="multiply", out=t, scalar=2.0))
    w = b.op(lambda o: PermuteDims(out=o, x=t, axes=(1, 0)))
    with pytest.raises(OnnxExportError, match=rf"op 2 .* memory that #{v}, read afterwards,"):
        to_onnx(b.graph(v=v, w=w), b.arrays)
    export_and_compare(b, t=t, w=w)


@pytest.mark.parametrize("through_view", [False, True])
def test_a_write_into_an_input_is_refused(through_view: bool) -> None:
    b = Builder()
    x = b.input("x", floats(3, 4))
    target = b.op(lambda o: Reshape(out=o, x=x, shape=(4, 3))) if through_view else x
    b.inplace(InPlaceBinaryScalar(op="multiply", out=target, scalar=2.0))
    y = b.op(lambda o: Unary(op="negative", out=o, x=target))
    with pytest.raises(OnnxExportError, match="into memory that input 'x' shares"):
        to_onnx(b.graph(y=y), b.arrays)


def test_constants_must_match_the_graph() -> None:
    b = Builder()
    c = b.constant(floats(3))
    y = b.op(lambda o: Unary(op="exp", out=o, x=c))
    graph = b.graph(y=y)
    with pytest.raises(OnnxExportError, match="declares 1 constants; 0 were given"):
        to_onnx(graph, [])
    with pytest.raises(OnnxExportError, match=r"declared \(3,\) float32, given \(3,\) float64"):
        to_onnx(graph, [np.zeros(3)])


def test_the_saved_file_loads(tmp_path: Any) -> None:
    b = Builder()
    x = b.input("x", floats(2, 3))
    c = b.constant(floats(3))
    y = b.op(lambda o: Binary(op="add", out=o, x1=x, x2=c))
    path = tmp_path / "graph.onnx"
    model = to_onnx(b.graph(y=y), b.arrays, path)
    loaded = onnx.load(str(path))
    onnx.checker.check_model(loaded, full_check=True)
    assert loaded == model
    assert loaded.opset_import[0].version == 18
    assert loaded.ir_version == onnx.helper.find_min_ir_version_for(list(loaded.opset_import))
    got = run_onnx(loaded, b.feeds)["y"]
    assert_same(got, b.feeds["x"] + b.arrays[0])
    assert to_onnx(b.graph(y=y), b.arrays, opset=onnx.defs.onnx_opset_version())


def test_an_opset_out_of_range_is_refused() -> None:
    b = Builder()
    x = b.input("x", floats(2))
    graph = b.graph(y=b.op(lambda o: Unary(op="exp", out=o, x=x)))
    with pytest.raises(ValueError, match="opset 17 is out of range"):
        to_onnx(graph, [], opset=17)


def test_without_onnx_the_error_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    b = Builder()
    x = b.input("x", floats(2))
    graph = b.graph(y=b.op(lambda o: Unary(op="exp", out=o, x=x)))
    monkeypatch.setitem(sys.modules, "onnx", None)  # import onnx raises ImportError
    with pytest.raises(ImportError, match=r"pip install 'tensorwire\[onnx\]'"):
        to_onnx(graph, [])


def test_log_constants_are_exact_enough() -> None:
    """log2 and log10 are a log divided by a constant: within a few ulps of numpy's."""
    values = np.array([2.0**-30, 0.5, 8.0, 1000.0, 1e300])
    b = Builder()
    x = b.input("x", values)
    y2 = b.op(lambda o: Unary(op="log2", out=o, x=x))
    y10 = b.op(lambda o: Unary(op="log10", out=o, x=x))
    got = run_onnx(to_onnx(b.graph(y2=y2, y10=y10), []), b.feeds)
    np.testing.assert_array_max_ulp(got["y2"], np.log2(values), maxulp=2)
    np.testing.assert_array_max_ulp(got["y10"], np.log10(values), maxulp=2)
    assert math.isclose(got["y2"][2], 3.0, rel_tol=1e-15)
