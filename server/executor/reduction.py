"""Reductions: sum, prod, mean, max, min, argmax, argmin, any, all, std, var."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from protocol import from_numpy, to_numpy
from protocol.codec import Buffer
from protocol.ops import Reduce
from protocol.ops.rules import reduce_rule

from .base import Array, Runner


def reduce(op: Reduce, args: Sequence[Array], buffers: Sequence[Buffer]) -> Array:
    (x,) = args
    _, compute = reduce_rule(op.op, from_numpy(x.dtype))
    if compute is not None:
        x = x.astype(to_numpy(compute))
    fn: Callable[..., Array] = getattr(np, op.op)
    if op.op in ("argmax", "argmin"):
        axis = None if op.axis is None else op.axis[0]
        return fn(x, axis=axis, keepdims=op.keepdims)
    if op.op in ("std", "var"):
        return fn(x, axis=op.axis, keepdims=op.keepdims, ddof=op.correction)
    return fn(x, axis=op.axis, keepdims=op.keepdims)


RUNNERS: dict[type, Runner] = {Reduce: reduce}
