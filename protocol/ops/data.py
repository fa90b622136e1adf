"""Sorting, searching, cumulative and set ops; several have data-dependent shapes or several
outputs.

An op with several outputs names the first in ``out`` and the others in ``more``; its
:meth:`infer_all` describes each. A dimension of :data:`~protocol.ops.base.UNKNOWN` is learnt
after the op ran (one round trip for the client).
"""

from __future__ import annotations

from typing import Literal

from ..errors import OpDTypeError, OpShapeError
from .base import I64, UNKNOWN, BaseOp, MultiOutputOp, TensorId, TensorMeta, normalize_axis
from .rules import reduce_rule, result_dtype


class Sort(BaseOp):
    kind: Literal["sort"] = "sort"
    op: Literal["sort", "argsort"]
    x: TensorId
    axis: I64 = -1
    descending: bool = False
    stable: bool = True

    def inputs(self) -> tuple[int, ...]:
        return (self.x,)

    def infer(self, *args: TensorMeta) -> TensorMeta:
        (x,) = args
        if x.dtype.startswith("complex"):
            raise OpDTypeError(f"{self.op} does not order complex numbers")
        normalize_axis(self.axis, len(x.shape))
        return TensorMeta(x.shape, "int64" if self.op == "argsort" else x.dtype)


class Cumulative(BaseOp):
    kind: Literal["cumulative"] = "cumulative"
    op: Literal["cumulative_sum", "cumulative_prod"]
    x: TensorId
    axis: I64 | None = None
    include_initial: bool = False

    def inputs(self) -> tuple[int, ...]:
        return (self.x,)

    def infer(self, *args: TensorMeta) -> TensorMeta:
        (x,) = args
        if not x.shape:
            raise OpShapeError(f"{self.op} needs at least one dimension")
        if self.axis is None and len(x.shape) > 1:
            raise OpShapeError(f"{self.op} of a multi-dimensional array needs an axis")
        axis = normalize_axis(0 if self.axis is None else self.axis, len(x.shape))
        shape = list(x.shape)
        shape[axis] += int(self.include_initial)
        dtype = reduce_rule("sum" if self.op == "cumulative_sum" else "prod", x.dtype)[0]
        return TensorMeta(tuple(shape), dtype)


class SearchSorted(BaseOp):
    kind: Literal["searchsorted"] = "searchsorted"
    x1: TensorId
    x2: TensorId
    side: Literal["left", "right"] = "left"

    def inputs(self) -> tuple[int, ...]:
        return (self.x1, self.x2)

    def infer(self, *args: TensorMeta) -> TensorMeta:
        x1, x2 = args
        if len(x1.shape) != 1:
            raise OpShapeError("searchsorted needs a 1-dimensional sorted array")
        if "complex" in (x1.dtype[:7], x2.dtype[:7]):
            raise OpDTypeError("searchsorted does not order complex numbers")
        result_dtype(x1.dtype, x2.dtype)
        return TensorMeta(x2.shape, "int64")


class Nonzero(MultiOutputOp):
    """``nonzero(x)``: one int64 index array per dimension, of data-dependent length."""

    kind: Literal["nonzero"] = "nonzero"
    x: TensorId

    def inputs(self) -> tuple[int, ...]:
        return (self.x,)

    def _infer_all(self, *args: TensorMeta) -> tuple[TensorMeta, ...]:
        (x,) = args
        if not x.shape:
            raise OpShapeError("nonzero of a 0-dimensional array")
        return tuple(TensorMeta((UNKNOWN,), "int64") for _ in x.shape)


UNIQUE_OUTPUTS = {
    "unique_all": ("values", "indices", "inverse_indices", "counts"),
    "unique_counts": ("values", "counts"),
    "unique_inverse": ("values", "inverse_indices"),
    "unique_values": ("values",),
}


class Unique(MultiOutputOp):
    """The ``unique_*`` family; outputs in the standard's order (:data:`UNIQUE_OUTPUTS`)."""

    kind: Literal["unique"] = "unique"
    op: Literal["unique_all", "unique_counts", "unique_inverse", "unique_values"]
    x: TensorId

    def inputs(self) -> tuple[int, ...]:
        return (self.x,)

    def _infer_all(self, *args: TensorMeta) -> tuple[TensorMeta, ...]:
        (x,) = args
        metas = {
            "values": TensorMeta((UNKNOWN,), x.dtype),
            "indices": TensorMeta((UNKNOWN,), "int64"),
            "inverse_indices": TensorMeta(x.shape, "int64"),
            "counts": TensorMeta((UNKNOWN,), "int64"),
        }
        return tuple(metas[name] for name in UNIQUE_OUTPUTS[self.op])
