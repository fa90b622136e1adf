"""Reductions: sum, prod, mean, max, min, argmax, argmin, any, all, std, var.

``std`` and ``var`` of more than :data:`CHUNK` elements are computed a slice at a time: numpy
subtracts the mean from the whole input at once, a temporary of 8 bytes an element for an
integer input, that no count would see (bench/REASONS.md, 'Chunked var and std'). The sums
of a chunked result are grouped differently, so its last bits may differ from numpy's.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from protocol import from_numpy, to_numpy
from protocol.codec import Buffer
from protocol.ops import Reduce
from protocol.ops.rules import reduce_rule

from .base import Array, Runner

CHUNK = 1 << 20  # elements whose deviations std and var hold at a time (at least one slice)


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
        axes = tuple(range(x.ndim)) if op.axis is None else tuple(a % x.ndim for a in op.axis)
        if x.size <= CHUNK or not axes:
            return fn(x, axis=op.axis, keepdims=op.keepdims, ddof=op.correction)
        var = _variance(x, axes, op.correction)
        result = np.sqrt(var, out=var) if op.op == "std" else var
        return result if op.keepdims else np.squeeze(result, axis=axes)
    return fn(x, axis=op.axis, keepdims=op.keepdims)


def _variance(x: Array, axes: tuple[int, ...], correction: float) -> Array:
    """numpy's ``var(x, axes, keepdims=True, ddof=correction)``, its deviations computed a
    slice along ``x``'s longest axis at a time (about :data:`CHUNK` elements)."""
    calc = np.dtype(np.float64) if x.dtype.kind in "biu" else x.dtype  # as numpy's _var
    count = math.prod(x.shape[a] for a in axes)
    mean = np.sum(x, axis=axes, dtype=calc, keepdims=True)  # cast as it goes: no copy
    mean /= count
    squares = np.zeros(mean.shape, np.zeros((), calc).real.dtype)
    axis = max(range(x.ndim), key=lambda a: x.shape[a])
    step = max(1, CHUNK * x.shape[axis] // x.size)
    for start in range(0, x.shape[axis], step):
        part = (slice(None),) * axis + (slice(start, start + step),)
        deviation = np.subtract(x[part], mean if axis in axes else mean[part], dtype=calc)
        if deviation.dtype.kind == "c":
            square = np.multiply(deviation, np.conjugate(deviation), out=deviation).real
        else:
            square = np.multiply(deviation, deviation, out=deviation)
        summed = np.sum(square, axis=axes, keepdims=True)
        if axis in axes:
            squares += summed
        else:
            squares[part] = summed
    squares /= max(count - correction, 0)
    return squares


RUNNERS: dict[type, Runner] = {Reduce: reduce}
