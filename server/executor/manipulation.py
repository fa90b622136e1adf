"""Manipulation: reshape, permute_dims, joins, axes, roll, moveaxis, broadcast_to, tile, repeat,
tril/triu. Many results are views of their input (the session keeps them zero-copy)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from protocol.codec import Buffer
from protocol.ops import (
    Axes,
    BroadcastTo,
    Join,
    MoveAxis,
    PermuteDims,
    Repeat,
    Reshape,
    Roll,
    Tile,
    Triangle,
)

from .base import Array, Runner


def reshape(op: Reshape, args: Sequence[Array], buffers: Sequence[Buffer]) -> Array:
    return np.reshape(args[0], op.shape)


def permute_dims(op: PermuteDims, args: Sequence[Array], buffers: Sequence[Buffer]) -> Array:
    return np.transpose(args[0], op.axes)


def join(op: Join, args: Sequence[Array], buffers: Sequence[Buffer]) -> Array:
    if op.op == "stack":
        return np.stack(args, axis=op.axis or 0)
    return np.concatenate(args, axis=op.axis)


def axes(op: Axes, args: Sequence[Array], buffers: Sequence[Buffer]) -> Array:
    (x,) = args
    if op.op == "flip":
        return np.flip(x, axis=op.axis)
    if op.op == "squeeze":
        return np.squeeze(x, axis=op.axis)
    return np.expand_dims(x, axis=op.axis)  # type: ignore[arg-type]


def roll(op: Roll, args: Sequence[Array], buffers: Sequence[Buffer]) -> Array:
    shift: int | tuple[int, ...] = op.shift[0] if op.axis is None else op.shift
    if op.axis is not None and len(op.shift) == 1:
        shift = op.shift * len(op.axis)
    return np.roll(args[0], shift, axis=op.axis)


def moveaxis(op: MoveAxis, args: Sequence[Array], buffers: Sequence[Buffer]) -> Array:
    return np.moveaxis(args[0], op.source, op.destination)


def broadcast_to(op: BroadcastTo, args: Sequence[Array], buffers: Sequence[Buffer]) -> Array:
    return np.broadcast_to(args[0], op.shape)


def tile(op: Tile, args: Sequence[Array], buffers: Sequence[Buffer]) -> Array:
    return np.tile(args[0], op.reps)


def repeat(op: Repeat, args: Sequence[Array], buffers: Sequence[Buffer]) -> Array:
    repeats = args[1] if len(args) == 2 else op.repeats
    return np.repeat(args[0], repeats, axis=op.axis)  # type: ignore[arg-type]


def triangle(op: Triangle, args: Sequence[Array], buffers: Sequence[Buffer]) -> Array:
    fn = np.tril if op.op == "tril" else np.triu
    return fn(args[0], k=op.k)


RUNNERS: dict[type, Runner] = {
    Reshape: reshape,
    PermuteDims: permute_dims,
    Join: join,
    Axes: axes,
    Roll: roll,
    MoveAxis: moveaxis,
    BroadcastTo: broadcast_to,
    Tile: tile,
    Repeat: repeat,
    Triangle: triangle,
}
