"""Manipulation and indexing: reshape, permute_dims, getitem, setitem, take, joins, axes, roll,
moveaxis, broadcast_to, tile, repeat, tril/triu.

Rule: no runner mutates an input array, except :func:`setitem` when the session tells it that
the target's array is its own. Stored arrays may be read-only ``frombuffer`` views or views
shared by several tensors, so otherwise :func:`setitem` copies before it writes (copy-on-write).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from protocol.codec import Buffer
from protocol.ops import (
    Axes,
    BroadcastTo,
    GetItem,
    Join,
    MoveAxis,
    PermuteDims,
    Repeat,
    Reshape,
    Roll,
    SetItem,
    Take,
    Tile,
    Triangle,
)
from protocol.ops_index import numpy_key

Array = np.ndarray[Any, Any]


def reshape(op: Reshape, args: Sequence[Array], buffers: Sequence[Buffer]) -> Array:
    return np.reshape(args[0], op.shape)


def permute_dims(op: PermuteDims, args: Sequence[Array], buffers: Sequence[Buffer]) -> Array:
    return np.transpose(args[0], op.axes)


def getitem(op: GetItem, args: Sequence[Array], buffers: Sequence[Buffer]) -> Array:
    return np.asarray(args[0][numpy_key(op.key, args[1:])])


def setitem(
    op: SetItem, args: Sequence[Array], buffers: Sequence[Buffer], in_place: bool = False
) -> Array:
    """``target[key] = value``; writes into ``target`` only when ``in_place`` (the caller
    knows nothing shares it), else into a copy."""
    target, value, *index = args
    key = numpy_key(op.key, index)
    if op.key in (("...",), ()) and value.shape == target.shape:
        return value  # a whole replacement (``x += y``): rebind, copy nothing
    result = target if in_place and target.flags.writeable else target.copy()
    result[key] = value
    return result


def take(op: Take, args: Sequence[Array], buffers: Sequence[Buffer]) -> Array:
    x, indices = args
    if op.op == "take":
        return np.take(x, indices, axis=op.axis)
    return np.take_along_axis(x, indices, axis=op.axis)


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
