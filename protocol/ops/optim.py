"""The optimizer extension: Adam's per-parameter update as two op kinds instead of eleven.

Adam's update of one parameter is a chain of element-wise ops on arrays of the parameter's
shape (``client/optim/adam.py``): three for the first moment, four for the second, four for
the step direction. Sent one by one, each is a message to build, key and run; these two op
kinds carry each chain whole, and the server runs the same numpy calls in the same order on
the same dtypes, so a parameter updated through them has the bits of one updated op by op:

- ``moment_update`` (in place on ``out``, a moment): ``out *= decay``, then
  ``out += scale * grad`` (``squared``: ``out += (scale * grad) * grad``), the gradient read
  before the moment is written (one that shares the moment's memory reads its old values);
- ``adam_direction`` (a new array): ``(step_size * exp_avg) / (sqrt(exp_avg_sq) + eps_term)``,
  ``step_size`` and ``eps_term`` 0-d arrays (the bias-corrected terms, computed on the device
  each step so that a replayed step needs no new scalar).

Every array of one op has one real floating dtype, and the moments the gradient's shape: a
parameter of another kind takes the ops one by one.
"""

from __future__ import annotations

import math
from typing import ClassVar, Literal

from ..dtypes import DType, is_floating
from ..errors import OpArgumentError, OpDTypeError, OpShapeError
from .base import BaseOp, TensorId, TensorMeta


def _one_floating(name: str, *metas: TensorMeta) -> DType:
    dtypes = {m.dtype for m in metas}
    dtype = metas[0].dtype
    if len(dtypes) != 1 or not is_floating(dtype):
        listed = ", ".join(m.dtype for m in metas)
        raise OpDTypeError(f"{name} needs arrays of one real floating dtype, not {listed}")
    return dtype


class MomentUpdate(BaseOp):
    """``out = decay * out + scale * grad`` (``squared``: ``+ scale * grad * grad``), in place,
    as ``out *= decay; out += scale * grad`` computes it (see the module docstring)."""

    kind: Literal["moment_update"] = "moment_update"
    inplace: ClassVar[bool] = True
    grad: TensorId
    decay: float
    scale: float
    squared: bool = False

    def inputs(self) -> tuple[int, ...]:
        return (self.out, self.grad)

    def infer(self, *args: TensorMeta) -> TensorMeta:
        moment, grad = args
        if self.grad == self.out:
            raise OpArgumentError(f"moment_update: #{self.out} is both the moment and the gradient")
        _one_floating("moment_update", moment, grad)
        if moment.shape != grad.shape:
            raise OpShapeError(f"moment_update: moment {moment.shape}, gradient {grad.shape}")
        if not (math.isfinite(self.decay) and math.isfinite(self.scale)):
            raise OpArgumentError(
                f"moment_update: decay and scale must be finite, not {self.decay}, {self.scale}"
            )
        return moment

    def describe(self) -> str:
        square = f" * #{self.grad}" if self.squared else ""
        return (
            f"moment_update(#{self.out} * {self.decay!r} + {self.scale!r} * #{self.grad}"
            f"{square}) -> #{self.out}"
        )


class AdamDirection(BaseOp):
    """``(step_size * exp_avg) / (sqrt(exp_avg_sq) + eps_term)``, a new array: what Adam
    subtracts from its parameter (see the module docstring)."""

    kind: Literal["adam_direction"] = "adam_direction"
    exp_avg: TensorId
    exp_avg_sq: TensorId
    step_size: TensorId
    eps_term: TensorId

    def inputs(self) -> tuple[int, ...]:
        return (self.exp_avg, self.exp_avg_sq, self.step_size, self.eps_term)

    def infer(self, *args: TensorMeta) -> TensorMeta:
        m, v, step_size, eps_term = args
        dtype = _one_floating("adam_direction", m, v, step_size, eps_term)
        if m.shape != v.shape or step_size.shape != () or eps_term.shape != ():
            raise OpShapeError(
                f"adam_direction: moments of one shape and 0-d terms, not {m.shape}, "
                f"{v.shape}, {step_size.shape}, {eps_term.shape}"
            )
        return TensorMeta(m.shape, dtype)
