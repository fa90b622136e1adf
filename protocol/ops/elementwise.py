"""Element-wise ops: ``unary`` and ``binary`` (by op name; ``matmul`` is a binary op),
``where`` and ``astype``."""

from __future__ import annotations

from typing import Literal

from ..dtypes import DType
from ..errors import OpDTypeError, OpShapeError
from .base import BaseOp, TensorId, TensorMeta, broadcast_shapes
from .rules import elementwise_rule, result_dtype

UnaryName = Literal[
    "abs", "negative", "positive", "exp", "expm1", "log", "log1p", "log2", "log10", "sqrt",
    "square", "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "tanh", "asinh",
    "acosh", "atanh", "floor", "ceil", "trunc", "round", "sign", "logical_not",
    "bitwise_invert", "isnan", "isinf", "isfinite", "real", "imag", "conj", "reciprocal",
    "signbit",
]  # fmt: skip

BinaryName = Literal[
    "add", "subtract", "multiply", "divide", "floor_divide", "remainder", "pow", "matmul",
    "maximum", "minimum", "equal", "not_equal", "less", "less_equal", "greater",
    "greater_equal", "logical_and", "logical_or", "logical_xor", "bitwise_and", "bitwise_or",
    "bitwise_xor", "bitwise_left_shift", "bitwise_right_shift", "atan2", "hypot", "copysign",
    "logaddexp", "nextafter",
]  # fmt: skip


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
        dtype = elementwise_rule(self.op, (a.dtype, b.dtype))[0]
        if self.op == "matmul":
            return TensorMeta(matmul_shape(a.shape, b.shape), dtype)
        return TensorMeta(broadcast_shapes(a.shape, b.shape), dtype)


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
