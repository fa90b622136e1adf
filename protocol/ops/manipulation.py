"""Manipulation ops: reshaping, permuting, joining, axes, rolling, broadcasting, tiling,
repeating, triangles."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from ..dtypes import is_integer
from ..errors import OpDTypeError, OpShapeError
from .base import (
    I64,
    MAX_NDIM,
    UNKNOWN,
    BaseOp,
    Dim,
    TensorId,
    TensorMeta,
    broadcast_shapes,
    check_shape,
    normalize_axes,
    normalize_axis,
    numel,
)
from .rules import result_dtype


class Reshape(BaseOp):
    kind: Literal["reshape"] = "reshape"
    x: TensorId
    shape: tuple[Annotated[int, Field(ge=-1, lt=2**63)], ...]

    def inputs(self) -> tuple[int, ...]:
        return (self.x,)

    def infer(self, *args: TensorMeta) -> TensorMeta:
        (x,) = args
        size = numel(x.shape)
        unknown = [i for i, d in enumerate(self.shape) if d == -1]
        if len(unknown) > 1:
            raise OpShapeError("reshape takes at most one -1")
        known = numel(tuple(d for d in self.shape if d != -1))
        shape = list(self.shape)
        if unknown:
            if known == 0 or size % known:
                raise OpShapeError(f"cannot reshape {x.shape} into {self.shape}")
            shape[unknown[0]] = size // known
        elif known != size:
            raise OpShapeError(f"cannot reshape {x.shape} ({size} elements) into {self.shape}")
        return TensorMeta(check_shape(tuple(shape)), x.dtype)


class PermuteDims(BaseOp):
    kind: Literal["permute_dims"] = "permute_dims"
    x: TensorId
    axes: tuple[I64, ...]

    def inputs(self) -> tuple[int, ...]:
        return (self.x,)

    def infer(self, *args: TensorMeta) -> TensorMeta:
        (x,) = args
        if len(self.axes) != len(x.shape):
            raise OpShapeError(f"axes {self.axes} do not match {len(x.shape)} dimensions")
        axes = normalize_axes(self.axes, len(x.shape))
        return TensorMeta(tuple(x.shape[a] for a in axes), x.dtype)


class Join(BaseOp):
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
            axis = normalize_axis(self.axis or 0, len(first) + 1)
            return TensorMeta(check_shape(first[:axis] + (len(args),) + first[axis:]), dtype)
        if not first:
            raise OpShapeError("concat does not take 0-dimensional arrays")
        axis = normalize_axis(self.axis or 0, len(first))
        for a in args:
            if len(a.shape) != len(first) or any(
                d != e for i, (d, e) in enumerate(zip(a.shape, first, strict=True)) if i != axis
            ):
                raise OpShapeError(f"concat shapes {first} and {a.shape} differ off axis {axis}")
        size = sum(a.shape[axis] for a in args)
        return TensorMeta(first[:axis] + (size,) + first[axis + 1 :], dtype)


class Axes(BaseOp):
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
            normalize_axes(self.axis, len(x.shape))
            return x
        if self.axis is None:
            raise OpShapeError(f"{self.op} needs an axis")
        if self.op == "squeeze":
            axes = normalize_axes(self.axis, len(x.shape))
            if any(x.shape[a] != 1 for a in axes):
                raise OpShapeError(f"cannot squeeze axes {self.axis} of shape {x.shape}")
            return TensorMeta(tuple(d for i, d in enumerate(x.shape) if i not in axes), x.dtype)
        ndim = len(x.shape) + len(self.axis)
        if ndim > MAX_NDIM:  # refused before any loop over ndim: the axes are the header's
            raise OpShapeError(f"{ndim} dimensions exceed the limit of {MAX_NDIM}")
        new = frozenset(normalize_axes(self.axis, ndim))
        it = iter(x.shape)
        return TensorMeta(tuple(1 if i in new else next(it) for i in range(ndim)), x.dtype)


class Roll(BaseOp):
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
                normalize_axis(a, len(x.shape))
            if len(self.shift) not in (1, len(self.axis)):
                raise OpShapeError("roll needs one shift per axis")
        elif len(self.shift) != 1:
            raise OpShapeError("roll without axis takes a single shift")
        return x


class MoveAxis(BaseOp):
    kind: Literal["moveaxis"] = "moveaxis"
    x: TensorId
    source: tuple[I64, ...]
    destination: tuple[I64, ...]

    def inputs(self) -> tuple[int, ...]:
        return (self.x,)

    def infer(self, *args: TensorMeta) -> TensorMeta:
        (x,) = args
        ndim = len(x.shape)
        src, dst = normalize_axes(self.source, ndim), normalize_axes(self.destination, ndim)
        if len(src) != len(dst):
            raise OpShapeError("moveaxis needs as many sources as destinations")
        order = [a for a in range(ndim) if a not in src]
        for d, s in sorted(zip(dst, src, strict=True)):
            order.insert(d, s)
        return TensorMeta(tuple(x.shape[a] for a in order), x.dtype)


class BroadcastTo(BaseOp):
    kind: Literal["broadcast_to"] = "broadcast_to"
    x: TensorId
    shape: tuple[Dim, ...]

    def inputs(self) -> tuple[int, ...]:
        return (self.x,)

    def infer(self, *args: TensorMeta) -> TensorMeta:
        (x,) = args
        if len(x.shape) > len(self.shape) or broadcast_shapes(x.shape, self.shape) != self.shape:
            raise OpShapeError(
                f"operands could not be broadcast together: cannot broadcast {x.shape} to "
                f"{self.shape}"
            )
        return TensorMeta(check_shape(self.shape), x.dtype)


class Tile(BaseOp):
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
        return TensorMeta(
            check_shape(tuple(d * r for d, r in zip(shape, reps, strict=True))), x.dtype
        )


class Repeat(BaseOp):
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
        axis = normalize_axis(self.axis or 0, len(shape))
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


class Triangle(BaseOp):
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
