"""Element-wise ops: ``unary`` and ``binary`` (by op name; ``matmul`` is a binary op),
``binary_scalar`` (``x + 1.0``: the Python scalar travels in the op), the in-place
``binary_inplace`` (``x += y``) and ``binary_inplace_scalar`` (``x *= 0.9``), ``where`` and
``astype``."""

from __future__ import annotations

from functools import lru_cache
from typing import ClassVar, Literal

import numpy as np

from ..dtypes import DType, to_numpy
from ..errors import OpDTypeError, OpShapeError
from ..scalars import Scalar, check_fits, scalar_dtype, scalar_to_python
from .base import BaseOp, TensorId, TensorMeta, broadcast_shapes
from .rules import elementwise_rule, result_dtype

UnaryName = Literal[
    "abs",
    "negative",
    "positive",
    "exp",
    "expm1",
    "log",
    "log1p",
    "log2",
    "log10",
    "sqrt",
    "square",
    "sin",
    "cos",
    "tan",
    "asin",
    "acos",
    "atan",
    "sinh",
    "cosh",
    "tanh",
    "asinh",
    "acosh",
    "atanh",
    "floor",
    "ceil",
    "trunc",
    "round",
    "sign",
    "logical_not",
    "bitwise_invert",
    "isnan",
    "isinf",
    "isfinite",
    "real",
    "imag",
    "conj",
    "reciprocal",
    "signbit",
]

BinaryName = Literal[
    "add",
    "subtract",
    "multiply",
    "divide",
    "floor_divide",
    "remainder",
    "pow",
    "matmul",
    "maximum",
    "minimum",
    "equal",
    "not_equal",
    "less",
    "less_equal",
    "greater",
    "greater_equal",
    "logical_and",
    "logical_or",
    "logical_xor",
    "bitwise_and",
    "bitwise_or",
    "bitwise_xor",
    "bitwise_left_shift",
    "bitwise_right_shift",
    "atan2",
    "hypot",
    "copysign",
    "logaddexp",
    "nextafter",
]


class Unary(BaseOp):
    kind: Literal["unary"] = "unary"
    op: UnaryName
    x: TensorId

    def inputs(self) -> tuple[int, ...]:
        return (self.x,)

    def infer(self, *args: TensorMeta) -> TensorMeta:
        (x,) = args
        return TensorMeta(x.shape, elementwise_rule(self.op, (x.dtype,))[0])


class Binary(BaseOp):
    kind: Literal["binary"] = "binary"
    op: BinaryName
    x1: TensorId
    x2: TensorId

    def inputs(self) -> tuple[int, ...]:
        return (self.x1, self.x2)

    def infer(self, *args: TensorMeta) -> TensorMeta:
        a, b = args
        return binary_meta(self.op, a, b)


def binary_meta(op: BinaryName, a: TensorMeta, b: TensorMeta) -> TensorMeta:
    """The result of binary ``op`` on ``a`` and ``b``."""
    dtype = elementwise_rule(op, (a.dtype, b.dtype))[0]
    if op == "matmul":
        return TensorMeta(matmul_shape(a.shape, b.shape), dtype)
    return TensorMeta(broadcast_shapes(a.shape, b.shape), dtype)


class BinaryScalar(BaseOp):
    """``x op scalar`` (``scalar op x`` when ``scalar_first``): a binary op whose other operand
    is a Python scalar carried in the op, as in ``x + 1.0``, ``lr * g`` or ``2 ** x``, so that a
    scalar costs no op of its own. The scalar takes the standard's dtype beside ``x``
    (:func:`~protocol.scalars.scalar_dtype`); the op is the binary op on ``x`` and a 0-d array
    of that dtype, with its result and errors.
    """

    kind: Literal["binary_scalar"] = "binary_scalar"
    op: BinaryName
    x: TensorId
    scalar: Scalar
    scalar_first: bool = False

    def inputs(self) -> tuple[int, ...]:
        return (self.x,)

    def infer(self, *args: TensorMeta) -> TensorMeta:
        (x,) = args
        kind = type(self.scalar)
        if (kind is float or kind is bool) and self.op != "matmul":
            return _scalar_result(self.op, kind is float, self.scalar_first, x)  # value: no part
        dtype = operand_dtype(self.scalar, x.dtype)
        if self.op == "matmul":  # refused: a scalar is 0-dimensional
            s = TensorMeta((), dtype)
            return binary_meta(self.op, s, x) if self.scalar_first else binary_meta(self.op, x, s)
        # binary_meta's result without building the scalar's meta and broadcasting it (a 0-d
        # operand keeps x's shape): this runs per op built (bench/REASONS.md, 'Scalar op
        # inference')
        pair = (dtype, x.dtype) if self.scalar_first else (x.dtype, dtype)
        return TensorMeta(x.shape, elementwise_rule(self.op, pair)[0])

    def describe(self) -> str:
        value = repr(scalar_to_python(self.scalar))
        args = f"{value}, #{self.x}" if self.scalar_first else f"#{self.x}, {value}"
        return f"{self.op}({args}) -> #{self.out}"


@lru_cache(maxsize=1024)
def _scalar_result(op: BinaryName, is_float: bool, scalar_first: bool, x: TensorMeta) -> TensorMeta:
    """:meth:`BinaryScalar.infer` for a float or bool scalar, whose value neither changes the
    result nor can fail to fit (:func:`~protocol.scalars.check_fits`), so it is cached: the
    client infers every op it builds (bench/REASONS.md, 'Scalar op inference')."""
    dtype = scalar_dtype(0.0 if is_float else False, x.dtype)
    pair = (dtype, x.dtype) if scalar_first else (x.dtype, dtype)
    return TensorMeta(x.shape, elementwise_rule(op, pair)[0])


def operand_dtype(scalar: Scalar, dtype: DType) -> DType:
    """The dtype of the 0-d array a Python scalar becomes beside an array of ``dtype``.

    Raises:
        OpOverflowError, OpDTypeError: the scalar does not fit that dtype (numpy 2 refuses it).
    """
    value = scalar_to_python(scalar)
    result = scalar_dtype(value, dtype)
    check_fits(value, result)
    return result


class InPlaceBinary(BaseOp):
    """``out op= x2`` (``x += y``, ``x @= y``): the tensor ``out`` keeps its id, shape and dtype
    and is written in its memory, so its views see the update, as in numpy.

    ``out op x2`` must have ``out``'s shape, and a dtype that casts to ``out``'s within its
    kind (the standard's rule for in-place operators: ``int /= 2`` is refused).
    """

    kind: Literal["binary_inplace"] = "binary_inplace"
    inplace: ClassVar[bool] = True
    op: BinaryName
    x2: TensorId

    def inputs(self) -> tuple[int, ...]:
        return (self.out, self.x2)

    def infer(self, *args: TensorMeta) -> TensorMeta:
        x, other = args
        return inplace_meta(self.op, x, other)


class InPlaceBinaryScalar(BaseOp):
    """``out op= scalar`` (``x *= 0.9``): :class:`InPlaceBinary` with a Python scalar carried in
    the op, which takes the standard's dtype beside ``out`` as in :class:`BinaryScalar`."""

    kind: Literal["binary_inplace_scalar"] = "binary_inplace_scalar"
    inplace: ClassVar[bool] = True
    op: BinaryName
    scalar: Scalar

    def inputs(self) -> tuple[int, ...]:
        return (self.out,)

    def infer(self, *args: TensorMeta) -> TensorMeta:
        (x,) = args
        return inplace_meta(self.op, x, TensorMeta((), operand_dtype(self.scalar, x.dtype)))

    def describe(self) -> str:
        return f"{self.op}(#{self.out}, {scalar_to_python(self.scalar)!r}) -> #{self.out}"


def inplace_meta(op: BinaryName, x: TensorMeta, other: TensorMeta) -> TensorMeta:
    """``x`` itself, when ``x op= other`` can keep its shape and dtype.

    Raises:
        OpShapeError: ``x op other`` has another shape.
        OpDTypeError: its dtype does not cast back to ``x``'s within its kind.
    """
    result = binary_meta(op, x, other)
    if result.shape != x.shape:
        raise OpShapeError(f"in-place {op} would change the shape {x.shape} to {result.shape}")
    if result.dtype != x.dtype and not np.can_cast(
        to_numpy(result.dtype), to_numpy(x.dtype), casting="same_kind"
    ):
        raise OpDTypeError(  # numpy's words first: libraries' tests match them
            f"Cannot cast ufunc '{op}' output from dtype('{result.dtype}') to "
            f"dtype('{x.dtype}') with casting rule 'same_kind': in-place {op} cannot store "
            f"{result.dtype} into {x.dtype}"
        )
    return x


def matmul_shape(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    if not a or not b:
        raise OpShapeError("matmul does not take 0-dimensional operands")
    a2 = a if len(a) >= 2 else (1, *a)
    b2 = b if len(b) >= 2 else (*b, 1)
    if a2[-1] != b2[-2]:
        raise OpShapeError(f"matmul shapes {a} and {b} do not align ({a2[-1]} != {b2[-2]})")
    out = (*broadcast_shapes(a2[:-2], b2[:-2]), a2[-2], b2[-1])
    if len(a) == 1:
        out = out[:-2] + out[-1:]
    if len(b) == 1:
        out = out[:-1]
    return out


class Where(BaseOp):
    kind: Literal["where"] = "where"
    condition: TensorId
    x1: TensorId
    x2: TensorId

    def inputs(self) -> tuple[int, ...]:
        return (self.condition, self.x1, self.x2)

    def infer(self, *args: TensorMeta) -> TensorMeta:
        c, a, b = args
        if c.dtype != "bool":
            raise OpDTypeError(f"where needs a bool condition, not {c.dtype}")
        return TensorMeta(
            broadcast_shapes(c.shape, a.shape, b.shape), result_dtype(a.dtype, b.dtype)
        )


class AsType(BaseOp):
    kind: Literal["astype"] = "astype"
    x: TensorId
    dtype: DType

    def inputs(self) -> tuple[int, ...]:
        return (self.x,)

    def infer(self, *args: TensorMeta) -> TensorMeta:
        return TensorMeta(args[0].shape, self.dtype)
