"""The ONNX counterparts of the element-wise ops and the reductions, for
:func:`client.capture.onnx.to_onnx` (the other ops' are in :mod:`._onnx_shapes`).

Each converter reads its op's inputs as ONNX value names (:class:`Export`, in :mod:`._onnx_builder`,
holds the name each graph id has now), adds the nodes that compute what the server's numpy runner
computes (``server/executor/``) and binds the op's output id to the last node's value. numpy's dtype
rules are followed by casting: an element-wise op runs on the dtypes of the numpy loop that the
server's call would pick (``ufunc.resolve_dtypes``), a reduction on its result dtype. An op with no
exact counterpart raises :class:`NoCounterpart`, which the caller names the op in.

``onnx`` is imported where a node or a tensor is made (:class:`Export`), not here: the export
is optional, and this module loads without it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from protocol.dtypes import DType, from_numpy, is_floating, is_integer, to_numpy
from protocol.ops import (
    AsType,
    Binary,
    BinaryScalar,
    InPlaceBinary,
    InPlaceBinaryScalar,
    Reduce,
    TensorMeta,
    Unary,
    Where,
)
from protocol.ops.elementwise import operand_dtype
from protocol.ops.rules import elementwise_rule, reduce_rule
from protocol.scalars import Scalar, scalar_to_python

from ._onnx_builder import Converter, Export, NoCounterpart

# --- element-wise -----------------------------------------------------------------------------

_UNARY = {
    "abs": "Abs",
    "negative": "Neg",
    "exp": "Exp",
    "log": "Log",
    "sqrt": "Sqrt",
    "sin": "Sin",
    "cos": "Cos",
    "tan": "Tan",
    "asin": "Asin",
    "acos": "Acos",
    "atan": "Atan",
    "sinh": "Sinh",
    "cosh": "Cosh",
    "tanh": "Tanh",
    "asinh": "Asinh",
    "acosh": "Acosh",
    "atanh": "Atanh",
    "floor": "Floor",
    "ceil": "Ceil",
    "round": "Round",
    "sign": "Sign",
    "isnan": "IsNaN",
    "isinf": "IsInf",
    "reciprocal": "Reciprocal",
    "bitwise_invert": "BitwiseNot",
    "logical_not": "Not",
}
_BINARY = {
    "add": "Add",
    "subtract": "Sub",
    "multiply": "Mul",
    "divide": "Div",
    "pow": "Pow",
    "matmul": "MatMul",
    "maximum": "Max",
    "minimum": "Min",
    "equal": "Equal",
    "less": "Less",
    "less_equal": "LessOrEqual",
    "greater": "Greater",
    "greater_equal": "GreaterOrEqual",
    "logical_and": "And",
    "logical_or": "Or",
    "logical_xor": "Xor",
    "bitwise_and": "BitwiseAnd",
    "bitwise_or": "BitwiseOr",
    "bitwise_xor": "BitwiseXor",
}
# numpy's bool loops of arithmetic ops are logical ones; ONNX has them under those names
_BOOL_BINARY = {
    "add": "Or",
    "multiply": "And",
    "maximum": "Or",
    "minimum": "And",
    "bitwise_and": "And",
    "bitwise_or": "Or",
    "bitwise_xor": "Xor",
}
_LOGICAL = {"logical_not", "logical_and", "logical_or", "logical_xor"}
_ROUNDING = {"floor", "ceil", "trunc", "round"}


def numpy_loop(name: str, dtypes: tuple[DType, ...]) -> tuple[tuple[DType, ...], DType]:
    """The input dtypes and output dtype of the loop numpy runs for ``name`` on ``dtypes``,
    after the protocol's compute cast (``elementwise_rule``: float64 where numpy would make
    float16)."""
    out, compute = elementwise_rule(name, dtypes)
    if compute is not None:
        dtypes = (compute,) * len(dtypes)
    fn = getattr(np, name)
    if not isinstance(fn, np.ufunc):  # round, real, imag: numpy keeps the input's dtype
        return dtypes, out
    resolved = fn.resolve_dtypes((*(to_numpy(d) for d in dtypes), None))
    return tuple(from_numpy(d) for d in resolved[:-1]), from_numpy(resolved[-1])


def _cast_all(ex: Export, names: Sequence[str], have: Sequence[DType], want: DType) -> list[str]:
    return [ex.cast(n, h, want) for n, h in zip(names, have, strict=True)]


def _unary_value(ex: Export, name: str, x: str, dtype: DType) -> tuple[str, DType]:
    """``name`` applied to value ``x`` of ``dtype``: the result's value and dtype."""
    (loop_in,), loop_out = numpy_loop(name, (dtype,))
    if name in _ROUNDING and not is_floating(loop_in):
        return x, dtype  # numpy 2 rounds an integer to itself
    if name in _LOGICAL:
        loop_in = "bool"
    elif name in ("isnan", "isinf", "isfinite") and not is_floating(loop_in):
        loop_in = "float64"  # an integer is finite: the float64 loop says so too
    x = ex.cast(x, dtype, loop_in)
    if name in _UNARY:
        op_type = "Not" if name == "bitwise_invert" and loop_in == "bool" else _UNARY[name]
        return ex.node(op_type, [x]), loop_out
    if name == "positive" or (name in ("real", "conj") and not loop_in.startswith("complex")):
        return x, loop_out
    if name == "square":
        return ex.node("Mul", [x, x]), loop_out
    if name == "log1p":  # Note: ONNX has no log1p; log(1 + x) loses digits for |x| < ulp(1)
        return ex.node("Log", [ex.node("Add", [x, ex.scalar(1, loop_in)])]), loop_out
    if name in ("log2", "log10"):  # within an ulp or two of numpy's
        base = ex.scalar(math.log(2 if name == "log2" else 10), loop_in)
        return ex.node("Div", [ex.node("Log", [x]), base]), loop_out
    if name == "isfinite":
        either = ex.node("Or", [ex.node("IsNaN", [x]), ex.node("IsInf", [x])])
        return ex.node("Not", [either]), loop_out
    if name == "trunc":
        negative = ex.node("Less", [x, ex.scalar(0, loop_in)])
        return ex.node("Where", [negative, ex.node("Ceil", [x]), ex.node("Floor", [x])]), loop_out
    raise NoCounterpart("no counterpart")


def _binary_value(
    ex: Export, name: str, values: tuple[str, str], dtypes: tuple[DType, DType]
) -> tuple[str, DType]:
    """Binary ``name`` on two values: the result's value and dtype."""
    loop_in, loop_out = numpy_loop(name, dtypes)
    want = "bool" if name in _LOGICAL else loop_in[0]
    a, b = (ex.cast(v, have, want) for v, have in zip(values, dtypes, strict=True))
    if want == "bool" and name in _BOOL_BINARY:
        return ex.node(_BOOL_BINARY[name], [a, b]), loop_out
    if name in _BINARY:
        return ex.node(_BINARY[name], [a, b]), loop_out
    if name == "not_equal":
        return ex.node("Not", [ex.node("Equal", [a, b])]), loop_out
    if name == "remainder" and is_integer(want):  # Python's sign rule, numpy's for integers
        return ex.node("Mod", [a, b], fmod=0), loop_out
    raise NoCounterpart("no counterpart")


def _bind(ex: Export, tensor_id: int, value: str, have: DType) -> None:
    """Bind ``tensor_id`` to ``value``, cast to the dtype its op's inference rule gave."""
    ex.names[tensor_id] = ex.cast(value, have, ex.metas[tensor_id].dtype)


def _scalar_operand(ex: Export, scalar: Scalar, beside: DType) -> tuple[str, DType]:
    """A Python scalar of an op as the 0-d array numpy sees (``operand_dtype``)."""
    dtype = operand_dtype(scalar, beside)
    return ex.scalar(scalar_to_python(scalar), dtype), dtype


def unary(ex: Export, op: Unary) -> None:
    dtype = ex.metas[op.x].dtype
    _bind(ex, op.out, *_unary_value(ex, op.op, ex.value(op.x), dtype))


def binary(ex: Export, op: Binary) -> None:
    dtypes = (ex.metas[op.x1].dtype, ex.metas[op.x2].dtype)
    values = (ex.value(op.x1), ex.value(op.x2))
    _bind(ex, op.out, *_binary_value(ex, op.op, values, dtypes))


def binary_scalar(ex: Export, op: BinaryScalar) -> None:
    dtype = ex.metas[op.x].dtype
    scalar, scalar_type = _scalar_operand(ex, op.scalar, dtype)
    x = ex.value(op.x)
    if op.scalar_first:
        result = _binary_value(ex, op.op, (scalar, x), (scalar_type, dtype))
    else:
        result = _binary_value(ex, op.op, (x, scalar), (dtype, scalar_type))
    _bind(ex, op.out, *result)


def binary_inplace(ex: Export, op: InPlaceBinary | InPlaceBinaryScalar) -> None:
    """``out op= other``: numpy's loop on both, cast back to ``out``'s dtype (``same_kind``,
    checked by the inference rule), under a new value name for ``out``."""
    dtype = ex.metas[op.out].dtype
    if isinstance(op, InPlaceBinaryScalar):
        other, other_type = _scalar_operand(ex, op.scalar, dtype)
    else:
        other, other_type = ex.value(op.x2), ex.metas[op.x2].dtype
    result = _binary_value(ex, op.op, (ex.value(op.out), other), (dtype, other_type))
    _bind(ex, op.out, *result)


def where(ex: Export, op: Where) -> None:
    dtype = ex.metas[op.out].dtype
    branches = _cast_all(
        ex,
        [ex.value(op.x1), ex.value(op.x2)],
        [ex.metas[op.x1].dtype, ex.metas[op.x2].dtype],
        dtype,
    )
    ex.names[op.out] = ex.node("Where", [ex.value(op.condition), *branches])


def astype(ex: Export, op: AsType) -> None:
    have = ex.metas[op.x].dtype
    if have.startswith("complex") or op.dtype.startswith("complex"):
        raise NoCounterpart("no counterpart for complex casts")
    ex.names[op.out] = ex.node("Identity", [ex.cast(ex.value(op.x), have, op.dtype)])


# --- reductions -------------------------------------------------------------------------------

_REDUCE = {
    "sum": "ReduceSum",
    "prod": "ReduceProd",
    "mean": "ReduceMean",
    "max": "ReduceMax",
    "min": "ReduceMin",
}


def reduce(ex: Export, op: Reduce) -> None:
    meta = ex.metas[op.x]
    out_dtype, compute = reduce_rule(op.op, meta.dtype)
    ndim = len(meta.shape)
    axes = sorted(range(ndim) if op.axis is None else {a % ndim for a in op.axis})
    x = ex.value(op.x)
    if op.op in ("argmax", "argmin"):
        ex.names[op.out] = _arg_extreme(ex, op, x, meta)
        return
    if op.op in ("any", "all"):  # numpy's truth of each element, then the max or the min
        flags = ex.cast(ex.cast(x, meta.dtype, "bool"), "bool", "uint8")
        found = _reduce_node(ex, "ReduceMax" if op.op == "any" else "ReduceMin", flags, axes, op)
        ex.names[op.out] = ex.cast(found, "uint8", "bool")
        return
    work: DType = "uint8" if out_dtype == "bool" else compute or out_dtype  # bool max and min
    x = ex.cast(x, meta.dtype, work)
    if op.op in ("var", "std"):
        result = _variance(ex, x, work, [meta.shape[a] for a in axes], axes, op)
    else:
        result = _reduce_node(ex, _REDUCE[op.op], x, axes, op)
        if op.op in ("max", "min") and is_floating(work):
            seen = _nan_seen(ex, _nan_flags(ex, x), axes, op.keepdims)
            result = ex.node("Where", [seen, ex.scalar(math.nan, work), result])
    _bind(ex, op.out, result, work)


# Note: ONNX leaves NaN to the runtime, and onnxruntime's ReduceMax, ReduceMin, ArgMax and
# ArgMin skip it; numpy's max and min are NaN where a NaN is, argmax and argmin its index.
def _nan_flags(ex: Export, x: str) -> str:
    return ex.cast(ex.node("IsNaN", [x]), "bool", "uint8")


def _nan_seen(ex: Export, flags: str, axes: list[int], keepdims: bool) -> str:
    seen = ex.node(
        "ReduceMax", [flags, ex.ints(axes)], keepdims=int(keepdims), noop_with_empty_axes=1
    )
    return ex.cast(seen, "uint8", "bool")


def _reduce_node(ex: Export, op_type: str, x: str, axes: list[int], op: Reduce) -> str:
    # no axes is numpy's axis=() (or a 0-d array): nothing reduced, where ONNX's default is all
    return ex.node(op_type, [x, ex.ints(axes)], keepdims=int(op.keepdims), noop_with_empty_axes=1)


def _variance(
    ex: Export, x: str, dtype: DType, sizes: list[int], axes: list[int], op: Reduce
) -> str:
    """numpy's ``_var``: the mean (a sum divided by the count), the squared deviations summed
    and divided by ``max(count - correction, 0)``; ``std`` is its square root."""
    count = math.prod(sizes)
    kept = ex.node("ReduceSum", [x, ex.ints(axes)], keepdims=1, noop_with_empty_axes=1)
    deviation = ex.node("Sub", [x, ex.node("Div", [kept, ex.scalar(count, dtype)])])
    squares = ex.node("Mul", [deviation, deviation])
    total = _reduce_node(ex, "ReduceSum", squares, axes, op)
    variance = ex.node("Div", [total, ex.scalar(max(count - op.correction, 0), dtype)])
    return ex.node("Sqrt", [variance]) if op.op == "std" else variance


def _arg_extreme(ex: Export, op: Reduce, x: str, meta: TensorMeta) -> str:
    """ArgMax or ArgMin: along the one axis, or over the flattened array (axis None); the
    first NaN's index where there is one, as numpy gives."""
    op_type = "ArgMax" if op.op == "argmax" else "ArgMin"
    if meta.dtype == "bool":
        x = ex.cast(x, "bool", "uint8")
    if op.axis is None:
        x, axis, keepdims = ex.node("Reshape", [x, ex.ints([-1])]), 0, False
    else:
        axis, keepdims = op.axis[0] % len(meta.shape), op.keepdims
    kept = int(keepdims)
    index = ex.node(op_type, [x], axis=axis, keepdims=kept, select_last_index=0)
    if is_floating(meta.dtype):
        flags = _nan_flags(ex, x)
        first_nan = ex.node("ArgMax", [flags], axis=axis, keepdims=kept, select_last_index=0)
        seen = _nan_seen(ex, flags, [axis], keepdims)
        index = ex.node("Where", [seen, first_nan, index])
    shape = ex.metas[op.out].shape
    if op.axis is None and shape:  # keepdims: the flattened index in as many dimensions
        return ex.node("Reshape", [index, ex.ints(shape)])
    return index


ELEMENTWISE: dict[type, Converter] = {
    Unary: unary,
    Binary: binary,
    BinaryScalar: binary_scalar,
    InPlaceBinary: binary_inplace,
    InPlaceBinaryScalar: binary_inplace,
    Where: where,
    AsType: astype,
    Reduce: reduce,
}
