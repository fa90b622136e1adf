"""Manipulation ops: joining, axes, rolling, broadcasting, tiling, repeating, triangles, linspace.

Rule: this module imports numpy, pydantic and ``protocol`` siblings only. No I/O.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from .dtypes import DType, from_numpy, is_integer, to_numpy
from .ops import (
    I64,
    UNKNOWN,
    Dim,
    OpDTypeError,
    OpShapeError,
    TensorId,
    TensorMeta,
    _check_shape,
    _normalize_axes,
    _normalize_axis,
    _Op,
    broadcast_shapes,
    numel,
)


def result_dtype(*dtypes: DType) -> DType:
    """numpy's promotion of array dtypes (the standard's table where it defines one)."""
    return from_numpy(np.result_type(*(to_numpy(d) for d in dtypes)))


class Join(_Op):
    """``concat(xs, axis)`` (``axis=None`` flattens first) and ``stack(xs, axis)``."""

    kind: Literal["join"] = "join"
    op: Literal["concat", "stack"]
    xs: tuple[TensorId, ...]
    axis: I64 | None = 0

    def inputs(self) -> tuple[int, ...]:
        return self.xs

    def infer(self, *args: TensorMeta) -> TensorMeta:
        if not args:
            raise OpShapeError(f"{self.op} needs at least one array")
        dtype = result_dtype(*(a.dtype for a in args))
        if self.op == "concat" and self.axis is None:
            return TensorMeta((sum(numel(a.shape) for a in args),), dtype)
        first = args[0].shape
        if self.op == "stack":
            if any(a.shape != first for a in args):
                raise OpShapeError("stack needs arrays of one shape")
            axis = _normalize_axis(self.axis or 0, len(first) + 1)
            return TensorMeta(_check_shape(first[:axis] + (len(args),) + first[axis:]), dtype)
        if not first:
            raise OpShapeError("concat does not take 0-dimensional arrays")
        axis = _normalize_axis(self.axis or 0, len(first))
        for a in args:
            if len(a.shape) != len(first) or any(
                d != e for i, (d, e) in enumerate(zip(a.shape, first, strict=True)) if i != axis
            ):
                raise OpShapeError(f"concat shapes {first} and {a.shape} differ off axis {axis}")
        size = sum(a.shape[axis] for a in args)
        return TensorMeta(first[:axis] + (size,) + first[axis + 1 :], dtype)


class Axes(_Op):
    """``expand_dims``, ``squeeze`` and ``flip`` along ``axis`` (None: every axis, for flip)."""

    kind: Literal["axes"] = "axes"
    op: Literal["expand_dims", "squeeze", "flip"]
    x: TensorId
    axis: tuple[I64, ...] | None = None

    def inputs(self) -> tuple[int, ...]:
        return (self.x,)

    def infer(self, *args: TensorMeta) -> TensorMeta:
        (x,) = args
        if self.op == "flip":
            _normalize_axes(self.axis, len(x.shape))
            return x
        if self.axis is None:
            raise OpShapeError(f"{self.op} needs an axis")
        if self.op == "squeeze":
            axes = _normalize_axes(self.axis, len(x.shape))
            if any(x.shape[a] != 1 for a in axes):
                raise OpShapeError(f"cannot squeeze axes {self.axis} of shape {x.shape}")
            return TensorMeta(tuple(d for i, d in enumerate(x.shape) if i not in axes), x.dtype)
        ndim = len(x.shape) + len(self.axis)
        axes = _normalize_axes(self.axis, ndim)
        it = iter(x.shape)
        shape = tuple(1 if i in axes else next(it) for i in range(ndim))
        return TensorMeta(_check_shape(shape), x.dtype)


class Roll(_Op):
    kind: Literal["roll"] = "roll"
    x: TensorId
    shift: tuple[I64, ...]
    axis: tuple[I64, ...] | None = None

    def inputs(self) -> tuple[int, ...]:
        return (self.x,)

    def infer(self, *args: TensorMeta) -> TensorMeta:
        (x,) = args
        if self.axis is not None:
            for a in self.axis:
                _normalize_axis(a, len(x.shape))
            if len(self.shift) not in (1, len(self.axis)):
                raise OpShapeError("roll needs one shift per axis")
        elif len(self.shift) != 1:
            raise OpShapeError("roll without axis takes a single shift")
        return x


class MoveAxis(_Op):
    kind: Literal["moveaxis"] = "moveaxis"
    x: TensorId
    source: tuple[I64, ...]
    destination: tuple[I64, ...]

    def inputs(self) -> tuple[int, ...]:
        return (self.x,)

    def infer(self, *args: TensorMeta) -> TensorMeta:
        (x,) = args
        ndim = len(x.shape)
        src, dst = _normalize_axes(self.source, ndim), _normalize_axes(self.destination, ndim)
        if len(src) != len(dst):
            raise OpShapeError("moveaxis needs as many sources as destinations")
        order = [a for a in range(ndim) if a not in src]
        for d, s in sorted(zip(dst, src, strict=True)):
            order.insert(d, s)
        return TensorMeta(tuple(x.shape[a] for a in order), x.dtype)


class BroadcastTo(_Op):
    kind: Literal["broadcast_to"] = "broadcast_to"
    x: TensorId
    shape: tuple[Dim, ...]

    def inputs(self) -> tuple[int, ...]:
        return (self.x,)

    def infer(self, *args: TensorMeta) -> TensorMeta:
        (x,) = args
        if len(x.shape) > len(self.shape) or broadcast_shapes(x.shape, self.shape) != self.shape:
            raise OpShapeError(f"cannot broadcast {x.shape} to {self.shape}")
        return TensorMeta(_check_shape(self.shape), x.dtype)


class Tile(_Op):
    kind: Literal["tile"] = "tile"
    x: TensorId
    reps: tuple[Dim, ...]

    def inputs(self) -> tuple[int, ...]:
        return (self.x,)

    def infer(self, *args: TensorMeta) -> TensorMeta:
        (x,) = args
        ndim = max(len(x.shape), len(self.reps))
        shape = (1,) * (ndim - len(x.shape)) + x.shape
        reps = (1,) * (ndim - len(self.reps)) + self.reps
        return TensorMeta(_check_shape(tuple(d * r for d, r in zip(shape, reps, strict=True))),
                          x.dtype)  # fmt: skip


class Repeat(_Op):
    """``repeat(x, repeats, axis)``: ``repeats`` an int, or a tensor (then the length along
    ``axis`` is data-dependent)."""

    kind: Literal["repeat"] = "repeat"
    x: TensorId
    repeats: Dim | None = None
    repeats_tensor: TensorId | None = None
    axis: I64 | None = None

    def inputs(self) -> tuple[int, ...]:
        return (self.x,) if self.repeats_tensor is None else (self.x, self.repeats_tensor)

    def infer(self, *args: TensorMeta) -> TensorMeta:
        x = args[0]
        shape = x.shape if self.axis is not None else (numel(x.shape),)
        axis = _normalize_axis(self.axis or 0, len(shape))
        if len(args) == 2:
            if not is_integer(args[1].dtype):
                raise OpDTypeError("repeat needs integer repeats")
            if args[1].shape not in ((), (1,), (shape[axis],)):
                raise OpShapeError(f"repeats of shape {args[1].shape} do not fit axis {axis}")
            n = UNKNOWN
        elif self.repeats is None:
            raise OpShapeError("repeat needs repeats")
        else:
            n = shape[axis] * self.repeats
        return TensorMeta(shape[:axis] + (n,) + shape[axis + 1 :], x.dtype)


class Triangle(_Op):
    kind: Literal["triangle"] = "triangle"
    op: Literal["tril", "triu"]
    x: TensorId
    k: I64 = 0

    def inputs(self) -> tuple[int, ...]:
        return (self.x,)

    def infer(self, *args: TensorMeta) -> TensorMeta:
        if len(args[0].shape) < 2:
            raise OpShapeError(f"{self.op} needs at least 2 dimensions")
        return args[0]


class Linspace(_Op):
    kind: Literal["linspace"] = "linspace"
    start: float
    stop: float
    start_imag: float = 0.0
    stop_imag: float = 0.0
    num: Dim
    endpoint: bool = True
    dtype: DType

    def infer(self, *args: TensorMeta) -> TensorMeta:
        if self.dtype == "bool" or is_integer(self.dtype):
            raise OpDTypeError(f"linspace does not produce {self.dtype}")
        return TensorMeta((self.num,), self.dtype)
