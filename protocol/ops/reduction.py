"""Reductions: ``sum``, ``prod``, ``mean``, ``max``, ``min``, ``argmax``, ``argmin``, ``any``,
``all``, ``std``, ``var``, along ``axis`` (None: every axis)."""

from __future__ import annotations

from typing import Literal

from ..errors import OpShapeError
from .base import I64, BaseOp, TensorId, TensorMeta, normalize_axes, reduced_shape
from .rules import reduce_rule

ReduceName = Literal[
    "sum", "prod", "mean", "max", "min", "argmax", "argmin", "any", "all", "std", "var"
]
_NO_IDENTITY = {"max", "min", "argmax", "argmin"}


class Reduce(BaseOp):
    kind: Literal["reduce"] = "reduce"
    op: ReduceName
    x: TensorId
    axis: tuple[I64, ...] | None = None
    keepdims: bool = False
    correction: float = 0.0  # std and var: degrees of freedom removed (numpy's ddof)

    def inputs(self) -> tuple[int, ...]:
        return (self.x,)

    def infer(self, *args: TensorMeta) -> TensorMeta:
        (x,) = args
        if self.op in ("argmax", "argmin") and self.axis is not None and len(self.axis) != 1:
            raise OpShapeError(f"{self.op} takes a single axis or None")
        axes = normalize_axes(self.axis, len(x.shape))
        if self.op in _NO_IDENTITY and any(x.shape[a] == 0 for a in axes):
            raise OpShapeError(f"{self.op} of an empty axis has no identity")
        if self.op in ("argmax", "argmin") and self.axis is None and not self.keepdims:
            shape: tuple[int, ...] = ()
        else:
            shape = reduced_shape(x.shape, axes, self.keepdims)
        return TensorMeta(shape, reduce_rule(self.op, x.dtype)[0])
