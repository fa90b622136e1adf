"""Manipulation: reshape, permute_dims, joins, axes, roll, moveaxis, broadcast_to, tile, repeat,
tril/triu. Many results are views of their input (the session keeps them zero-copy)."""

from __future__ import annotations

import functools
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

CHUNK = 1 << 20  # repeats summed at a time (a temporary of 8 MiB at most)
JOIN_CHUNK = 4096  # inputs of a join given to one numpy call (see join)


def reshape(op: Reshape, args: Sequence[Array], buffers: Sequence[Buffer]) -> Array:
    return np.reshape(args[0], op.shape)


def permute_dims(op: PermuteDims, args: Sequence[Array], buffers: Sequence[Buffer]) -> Array:
    return np.transpose(args[0], op.axes)


def join(op: Join, args: Sequence[Array], buffers: Sequence[Buffer]) -> Array:
    """``stack`` or ``concat``; of more than :data:`JOIN_CHUNK` inputs, a chunk at a time into
    the result (numpy holds the GIL through one call: one over a million inputs would stop
    every other thread, the event loop's included, for as long as it runs)."""
    if len(args) > JOIN_CHUNK:
        return _join_by_chunks(op, args)
    if op.op == "stack":
        return np.stack(args, axis=op.axis or 0)
    return np.concatenate(args, axis=op.axis)


def _join_by_chunks(op: Join, args: Sequence[Array]) -> Array:
    chunks = [args[i : i + JOIN_CHUNK] for i in range(0, len(args), JOIN_CHUNK)]
    dtype = functools.reduce(np.result_type, [np.result_type(*chunk) for chunk in chunks])
    if op.op == "stack":
        axis = (op.axis or 0) % (args[0].ndim + 1)  # in range: the op's inference checked it
        lengths = [len(chunk) for chunk in chunks]
        shape = (*args[0].shape[:axis], len(args), *args[0].shape[axis:])
    elif op.axis is None:  # each input flattened
        axis = 0
        lengths = [sum(a.size for a in chunk) for chunk in chunks]
        shape = (sum(lengths),)
    else:
        axis = op.axis % args[0].ndim
        lengths = [sum(a.shape[axis] for a in chunk) for chunk in chunks]
        shape = (*args[0].shape[:axis], sum(lengths), *args[0].shape[axis + 1 :])
    out = np.empty(shape, dtype)
    start = 0
    for chunk, length in zip(chunks, lengths, strict=True):
        part = out[(slice(None),) * axis + (slice(start, start + length),)]
        if op.op == "stack":
            np.stack(chunk, axis=axis, out=part)
        else:
            np.concatenate(chunk, axis=op.axis, out=part)
        start += length
    return out


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


def repeat_length(op: Repeat, x: Array, repeats: Array) -> int | None:
    """The length of ``repeat(x, repeats)`` along its axis: the sum of ``repeats`` (a 1-element
    tensor repeats every element), an exact Python int; None if one is negative (numpy
    refuses it). Summed a chunk at a time, in two 32-bit halves so that no sum overflows, never
    as a Python list (bench/REASONS.md, 'Chunked repeat lengths')."""
    length = x.size if op.axis is None else x.shape[op.axis % x.ndim]
    flat = repeats.reshape(-1)  # repeats have at most one dimension: a view
    if flat.size == 1:
        count = int(flat[0])
        return None if count < 0 else length * count
    total = 0
    for start in range(0, flat.size, CHUNK):
        part = flat[start : start + CHUNK]
        if part.min() < 0:
            return None
        wide = part.astype(np.uint64)
        high, low = np.sum(wide >> 32, dtype=np.uint64), np.sum(wide & 0xFFFFFFFF, dtype=np.uint64)
        total += (int(high) << 32) + int(low)
    return total


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
