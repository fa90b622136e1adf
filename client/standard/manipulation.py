"""Manipulation functions: shapes, axes, joins, repeats and broadcasting (``transpose`` is
numpy's, kept beside the standard's ``permute_dims``)."""

from __future__ import annotations

import builtins
import operator
from collections.abc import Sequence

from protocol.ops import Axes, BroadcastTo, Join, MoveAxis, Repeat, Roll, Tile, broadcast_shapes

from .._building import apply
from .._handle import ints, opt_int, opt_ints
from ..array import RemoteArray, astype, permute_dims, reshape


class ManipulationFunctions:
    """Mixed into :class:`~client.namespace.Namespace`."""

    @staticmethod
    def reshape(
        x: RemoteArray, /, shape: Sequence[int], *, copy: builtins.bool | None = None
    ) -> RemoteArray:
        """A view of ``x`` where numpy can make one (writes reach ``x``), else a copy;
        ``copy=True``: always a copy. (``copy=False`` cannot be refused here: the client does
        not know the server's strides, so it means None.)"""
        return reshape(astype(x, x.dtype) if copy else x, shape)  # a copy's reshape: a view

    @staticmethod
    def permute_dims(x: RemoteArray, /, axes: Sequence[int]) -> RemoteArray:
        return permute_dims(x, axes)

    @staticmethod
    def transpose(x: RemoteArray, /, axes: Sequence[int] | None = None) -> RemoteArray:
        """numpy's ``transpose``: reverses the axes unless ``axes`` is given."""
        return permute_dims(x, tuple(reversed(range(x.ndim))) if axes is None else axes)

    @staticmethod
    def concat(arrays: Sequence[RemoteArray], /, *, axis: int | None = 0) -> RemoteArray:
        axis = opt_int(axis)
        ids = tuple(a.tensor_id for a in arrays)
        return apply(lambda out: Join(out=out, op="concat", xs=ids, axis=axis), *arrays)

    @staticmethod
    def stack(arrays: Sequence[RemoteArray], /, *, axis: int = 0) -> RemoteArray:
        axis = operator.index(axis)
        ids = tuple(a.tensor_id for a in arrays)
        return apply(lambda out: Join(out=out, op="stack", xs=ids, axis=axis), *arrays)

    @staticmethod
    def expand_dims(x: RemoteArray, /, axis: int | Sequence[int] = 0) -> RemoteArray:
        axes = ints(axis)
        return apply(lambda out: Axes(out=out, op="expand_dims", x=x.tensor_id, axis=axes), x)

    @staticmethod
    def squeeze(x: RemoteArray, /, axis: int | Sequence[int]) -> RemoteArray:
        axes = ints(axis)
        return apply(lambda out: Axes(out=out, op="squeeze", x=x.tensor_id, axis=axes), x)

    @staticmethod
    def flip(x: RemoteArray, /, *, axis: int | Sequence[int] | None = None) -> RemoteArray:
        axes = opt_ints(axis)
        return apply(lambda out: Axes(out=out, op="flip", x=x.tensor_id, axis=axes), x)

    @staticmethod
    def roll(
        x: RemoteArray, /, shift: int | Sequence[int], *, axis: int | Sequence[int] | None = None
    ) -> RemoteArray:
        shifts, axes = ints(shift), opt_ints(axis)
        return apply(lambda out: Roll(out=out, x=x.tensor_id, shift=shifts, axis=axes), x)

    @staticmethod
    def moveaxis(
        x: RemoteArray, source: int | Sequence[int], destination: int | Sequence[int], /
    ) -> RemoteArray:
        src, dst = ints(source), ints(destination)
        return apply(lambda out: MoveAxis(out=out, x=x.tensor_id, source=src, destination=dst), x)

    @staticmethod
    def broadcast_to(x: RemoteArray, /, shape: Sequence[int]) -> RemoteArray:
        dims = ints(shape)
        return apply(lambda out: BroadcastTo(out=out, x=x.tensor_id, shape=dims), x)

    @staticmethod
    def broadcast_arrays(*arrays: RemoteArray) -> list[RemoteArray]:
        shape = broadcast_shapes(*(a.shape for a in arrays))
        return [ManipulationFunctions.broadcast_to(a, shape) for a in arrays]

    @staticmethod
    def tile(x: RemoteArray, repetitions: Sequence[int], /) -> RemoteArray:
        reps = ints(repetitions)
        return apply(lambda out: Tile(out=out, x=x.tensor_id, reps=reps), x)

    @staticmethod
    def repeat(
        x: RemoteArray, repeats: int | RemoteArray, /, *, axis: int | None = None
    ) -> RemoteArray:
        """An array ``repeats`` costs one round trip: the output's length is data-dependent."""
        axis = opt_int(axis)
        if isinstance(repeats, RemoteArray):
            r = repeats
            return apply(
                lambda out: Repeat(out=out, x=x.tensor_id, repeats_tensor=r.tensor_id, axis=axis),
                x,
                r,
            )
        n = operator.index(repeats)
        return apply(lambda out: Repeat(out=out, x=x.tensor_id, repeats=n, axis=axis), x)

    @staticmethod
    def unstack(x: RemoteArray, /, *, axis: int = 0) -> tuple[RemoteArray, ...]:
        if x.ndim == 0:
            raise ValueError("unstack needs at least one dimension")
        axis = axis % x.ndim if -x.ndim <= axis < x.ndim else axis
        if not 0 <= axis < x.ndim:
            raise ValueError(f"axis {axis} is out of bounds")
        lead = (slice(None),) * axis
        return tuple(x[(*lead, i, ...)] for i in range(x.shape[axis]))
