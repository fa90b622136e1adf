"""Indexing: getitem (basic, integer-array and boolean-mask), setitem, take, take_along_axis.

Note: :func:`setitem` is the one runner that writes into an input array: into its target's
memory, which the target's views share (as numpy's ``x[key] = v`` does), when the session says
it may (``in_place``); into a copy of the target otherwise (a read-only view).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from protocol.codec import Buffer
from protocol.ops import GetItem, SetItem, Take
from protocol.ops.indexing import numpy_key

from .base import Array, Runner


def getitem(op: GetItem, args: Sequence[Array], buffers: Sequence[Buffer]) -> Array:
    return np.asarray(args[0][numpy_key(op.key, args[1:])])


def setitem(
    op: SetItem, args: Sequence[Array], buffers: Sequence[Buffer], in_place: bool = False
) -> Array:
    """``target[key] = value``; writes into ``target`` when ``in_place`` (the store made its
    memory safe to write), else into a copy."""
    target, value, *index = args
    key = numpy_key(op.key, index)
    result = target if in_place and target.flags.writeable else target.copy()
    result[key] = value
    return result


def take(op: Take, args: Sequence[Array], buffers: Sequence[Buffer]) -> Array:
    x, indices = args
    if op.op == "take":
        return np.take(x, indices, axis=op.axis)
    return np.take_along_axis(x, indices, axis=op.axis)


RUNNERS: dict[type, Runner] = {GetItem: getitem, SetItem: setitem, Take: take}
