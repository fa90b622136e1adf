"""The ``linalg`` extension: one op family, with a shape rule per function."""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

from ..dtypes import is_complex, is_floating
from ..errors import OpDTypeError, OpShapeError
from .base import (
    I64,
    MultiOutputOp,
    TensorId,
    TensorMeta,
    broadcast_shapes,
    normalize_axes,
    reduced_shape,
)
from .rules import float_dtype, real_dtype, reduce_rule, result_dtype

LinalgName = Literal[
    "cholesky",
    "det",
    "inv",
    "eigh",
    "eigvalsh",
    "qr",
    "svd",
    "svdvals",
    "slogdet",
    "solve",
    "matrix_power",
    "matrix_rank",
    "pinv",
    "matrix_norm",
    "vector_norm",
    "diagonal",
    "trace",
    "cross",
    "outer",
    "tensordot",
    "vecdot",
]


def _matrix(x: TensorMeta, square: bool = False) -> tuple[tuple[int, ...], int, int]:
    if len(x.shape) < 2:
        raise OpShapeError("a matrix function needs at least 2 dimensions")
    *batch, m, n = x.shape
    if square and m != n:
        raise OpShapeError(f"a square matrix is needed, not {m}x{n}")
    return tuple(batch), m, n


class Linalg(MultiOutputOp):
    """One function of ``linalg``; each keyword applies only to the functions that take it."""

    kind: Literal["linalg"] = "linalg"
    op: LinalgName
    xs: tuple[TensorId, ...]
    upper: bool = False  # cholesky
    mode: Literal["reduced", "complete"] = "reduced"  # qr
    full_matrices: bool = True  # svd
    n: I64 = 1  # matrix_power
    offset: I64 = 0  # diagonal, trace
    ord: float | Literal["fro", "nuc"] | None = None  # matrix_norm, vector_norm
    axis: tuple[I64, ...] | None = None  # vector_norm; cross uses axis[0]
    keepdims: bool = False  # matrix_norm, vector_norm
    rtol: float | None = None  # matrix_rank, pinv
    axes1: tuple[I64, ...] = ()  # tensordot
    axes2: tuple[I64, ...] = ()

    def inputs(self) -> tuple[int, ...]:
        return self.xs

    def _infer_all(self, *args: TensorMeta) -> tuple[TensorMeta, ...]:
        expected = 2 if self.op in ("solve", "cross", "outer", "tensordot", "vecdot") else 1
        if self.op in ("pinv", "matrix_rank") and len(args) == 2:  # an array rtol
            if is_complex(args[1].dtype) or args[1].dtype == "bool":
                raise OpDTypeError(f"linalg.{self.op} needs a real rtol")
            (out,) = _LINALG[self.op](self, args[0])
            batch = args[0].shape[:-2]
            shape = broadcast_shapes(batch, args[1].shape)
            if self.op == "matrix_rank":  # one rank per rtol, as numpy and array-api-strict do
                return (TensorMeta(shape, out.dtype),)
            if shape != batch:  # numpy fails on it, after the SVD
                raise OpShapeError(
                    f"linalg.pinv: rtol of shape {args[1].shape} does not broadcast to the "
                    f"batch shape {batch}"
                )
            return (out,)
        if len(args) != expected:
            raise OpShapeError(f"linalg.{self.op} takes {expected} arrays")
        return _LINALG[self.op](self, *args)


def _same_square(op: Linalg, x: TensorMeta) -> tuple[TensorMeta, ...]:
    _matrix(x, square=op.op != "pinv")
    if op.op == "matrix_power" and op.n < 0 and not (is_floating(x.dtype) or is_complex(x.dtype)):
        raise OpDTypeError("negative matrix powers need a floating dtype")
    dtype = x.dtype if op.op == "matrix_power" else float_dtype(x.dtype)
    if op.op == "pinv":
        return (TensorMeta(x.shape[:-2] + (x.shape[-1], x.shape[-2]), dtype),)
    return (TensorMeta(x.shape, dtype),)


def _batch_scalar(op: Linalg, x: TensorMeta) -> tuple[TensorMeta, ...]:
    batch, _, _ = _matrix(x, square=op.op in ("det", "slogdet"))
    f = float_dtype(x.dtype)
    if op.op == "det":
        return (TensorMeta(batch, f),)
    if op.op == "slogdet":
        return TensorMeta(batch, f), TensorMeta(batch, real_dtype(x.dtype))
    if op.op == "matrix_rank":
        return (TensorMeta(batch, "int64"),)
    if op.op == "trace":
        return (TensorMeta(batch, reduce_rule("sum", x.dtype)[0]),)
    shape = batch + (1, 1) if op.keepdims else batch  # matrix_norm
    return (TensorMeta(shape, real_dtype(x.dtype)),)


def _decomposition(op: Linalg, x: TensorMeta) -> tuple[TensorMeta, ...]:
    batch, m, n = _matrix(x, square=op.op in ("eigh", "eigvalsh"))
    f, r, k = float_dtype(x.dtype), real_dtype(x.dtype), min(m, n)
    if op.op == "eigh":
        return TensorMeta(batch + (m,), r), TensorMeta(x.shape, f)
    if op.op == "eigvalsh":
        return (TensorMeta(batch + (m,), r),)
    if op.op == "svdvals":
        return (TensorMeta(batch + (k,), r),)
    if op.op == "qr":
        q = m if op.mode == "complete" else k
        return TensorMeta(batch + (m, q), f), TensorMeta(batch + (q, n), f)
    u, v = (m, n) if op.full_matrices else (k, k)
    return TensorMeta(batch + (m, u), f), TensorMeta(batch + (k,), r), TensorMeta(batch + (v, n), f)


def _solve(op: Linalg, a: TensorMeta, b: TensorMeta) -> tuple[TensorMeta, ...]:
    batch, m, _ = _matrix(a, square=True)
    dtype = float_dtype(result_dtype(a.dtype, b.dtype))
    if len(b.shape) == 1:
        if b.shape[0] != m:
            raise OpShapeError(f"solve: b of length {b.shape[0]} does not fit {m}x{m}")
        return (TensorMeta(a.shape[:-1], dtype),)
    bbatch, bm, k = _matrix(b)
    if bm != m:
        raise OpShapeError(f"solve: b of shape {b.shape} does not fit {m}x{m}")
    return (TensorMeta(broadcast_shapes(batch, bbatch) + (m, k), dtype),)


def _vector_norm(op: Linalg, x: TensorMeta) -> tuple[TensorMeta, ...]:
    axes = normalize_axes(op.axis, len(x.shape))
    return (TensorMeta(reduced_shape(x.shape, axes, op.keepdims), real_dtype(x.dtype)),)


def _diagonal(op: Linalg, x: TensorMeta) -> tuple[TensorMeta, ...]:
    batch, m, n = _matrix(x)
    k = op.offset
    size = max(0, min(m, n - k)) if k >= 0 else max(0, min(m + k, n))
    return (TensorMeta(batch + (size,), x.dtype),)


def _cross(op: Linalg, a: TensorMeta, b: TensorMeta) -> tuple[TensorMeta, ...]:
    axis = op.axis[0] if op.axis else -1
    if axis >= 0:
        raise OpShapeError("cross takes a negative axis")
    shape = broadcast_shapes(a.shape, b.shape)
    if len(a.shape) < -axis or len(b.shape) < -axis:
        raise OpShapeError(f"cross axis {axis} is out of bounds")
    if a.shape[axis] != 3 or b.shape[axis] != 3:
        raise OpShapeError("cross needs vectors of 3 elements along axis")
    return (TensorMeta(shape, result_dtype(a.dtype, b.dtype)),)


def _vecdot(op: Linalg, a: TensorMeta, b: TensorMeta) -> tuple[TensorMeta, ...]:
    axis = op.axis[0] if op.axis else -1
    if not a.shape or not b.shape:
        raise OpShapeError("vecdot needs at least one dimension")
    if axis >= 0 or len(a.shape) < -axis or len(b.shape) < -axis:
        raise OpShapeError(f"vecdot axis {axis} must be negative and within both arrays")
    if a.shape[axis] != b.shape[axis]:
        raise OpShapeError(f"vecdot needs equal lengths along axis {axis}")
    shape = list(broadcast_shapes(a.shape, b.shape))
    del shape[axis]
    return (TensorMeta(tuple(shape), result_dtype(a.dtype, b.dtype)),)


def _outer(op: Linalg, a: TensorMeta, b: TensorMeta) -> tuple[TensorMeta, ...]:
    if len(a.shape) != 1 or len(b.shape) != 1:
        raise OpShapeError("outer needs 1-dimensional arrays")
    return (TensorMeta(a.shape + b.shape, result_dtype(a.dtype, b.dtype)),)


def _tensordot(op: Linalg, a: TensorMeta, b: TensorMeta) -> tuple[TensorMeta, ...]:
    ax1, ax2 = normalize_axes(op.axes1, len(a.shape)), normalize_axes(op.axes2, len(b.shape))
    if len(ax1) != len(ax2) or any(a.shape[i] != b.shape[j] for i, j in zip(ax1, ax2, strict=True)):
        raise OpShapeError(f"tensordot axes {op.axes1} and {op.axes2} do not match")
    shape = tuple(d for i, d in enumerate(a.shape) if i not in ax1) + tuple(
        d for i, d in enumerate(b.shape) if i not in ax2
    )
    return (TensorMeta(shape, result_dtype(a.dtype, b.dtype)),)


_LINALG: dict[str, Callable[..., tuple[TensorMeta, ...]]] = {
    "cholesky": _same_square,
    "inv": _same_square,
    "matrix_power": _same_square,
    "pinv": _same_square,
    "det": _batch_scalar,
    "slogdet": _batch_scalar,
    "matrix_rank": _batch_scalar,
    "trace": _batch_scalar,
    "matrix_norm": _batch_scalar,
    "eigh": _decomposition,
    "eigvalsh": _decomposition,
    "svdvals": _decomposition,
    "qr": _decomposition,
    "svd": _decomposition,
    "solve": _solve,
    "vector_norm": _vector_norm,
    "diagonal": _diagonal,
    "cross": _cross,
    "vecdot": _vecdot,
    "outer": _outer,
    "tensordot": _tensordot,
}
