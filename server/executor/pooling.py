"""Max and average pooling with numpy, and their gradient (``protocol/ops/nn.py``,
``Pool`` and ``PoolBackward``), and what each allocates beside its result.

Both loop over the kernel's taps, each a strided slice of the padded input combined into the
output (``np.maximum``, ``np.add``): measured against reducing the windows of a
``sliding_window_view`` and against ``argmax`` over copied windows
(``python -m bench.conv_formulations``; bench/REASONS.md, 'Convolution formulation').
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from protocol import TensorMeta
from protocol.codec import Buffer
from protocol.ops import Pool, PoolBackward
from protocol.ops.nn import conv_length

from .base import Array
from .convolution import pad_spatial, tap_slices, ufunc_buffers


def pooled_lengths(x: Array, op: Pool | PoolBackward) -> list[int]:
    return [
        conv_length(m, k, s, (p, p), 1)
        for m, k, s, p in zip(x.shape[2:], op.kernel, op.stride, op.padding, strict=True)
    ]


def pool_input(x: Array, op: Pool | PoolBackward) -> tuple[Array, list[int]]:
    """``x`` padded (with -inf for max pooling, zeros for average pooling) and the pooled
    lengths."""
    fill = -np.inf if op.op == "max" else 0.0
    return pad_spatial(x, [(p, p) for p in op.padding], fill), pooled_lengths(x, op)


def pool_taps(op: Pool | PoolBackward, out: Sequence[int]) -> Iterator[tuple[slice, ...]]:
    """Each tap's strided slice of the padded input, all of its axes."""
    ones = (1,) * len(op.kernel)
    for at in tap_slices(op.kernel, ones, out, op.stride):
        yield (slice(None), slice(None), *at)


def _combined(padded: Array, op: Pool | PoolBackward, out: Sequence[int], combine: Any) -> Array:
    """The taps of every window combined by the ufunc ``combine``, into a fresh array."""
    taps = pool_taps(op, out)
    y = padded[next(taps)].copy()
    for at in taps:
        combine(y, padded[at], out=y)
    return y


def _divisor(x: Array, op: Pool | PoolBackward, out: Sequence[int]) -> Array | float:
    """What each average window is divided by: the kernel's size, or, without
    ``count_include_pad``, the number of its positions inside ``x``."""
    if op.count_include_pad or not any(op.padding):
        return float(math.prod(op.kernel))
    ones = np.ones((1, 1, *x.shape[2:]), dtype=x.dtype)
    return _combined(pad_spatial(ones, [(p, p) for p in op.padding]), op, out, np.add)


def run_pool(op: Pool, args: Sequence[Array], buffers: Sequence[Buffer]) -> Array:
    (x,) = args
    padded, out = pool_input(x, op)
    if op.op == "max":
        return _combined(padded, op, out, np.maximum)
    y = _combined(padded, op, out, np.add)
    y /= _divisor(x, op, out)
    return y


def run_pool_backward(op: PoolBackward, args: Sequence[Array], buffers: Sequence[Buffer]) -> Array:
    """Each tap's share of the gradient added into its strided slice of the padded input's
    gradient, then cropped. Max pooling gives a window's gradient to its first element equal
    to the window's maximum (its first NaN, in a window that holds one), as ``argmax`` would."""
    x, grad = args
    padding = [(p, p) for p in op.padding]
    full = np.zeros(
        (*x.shape[:2], *(m + 2 * p for m, p in zip(x.shape[2:], op.padding, strict=True))),
        dtype=x.dtype,
    )
    if op.op == "max":
        _max_backward(pad_spatial(x, padding, -np.inf), grad, op, full)
    else:
        out = pooled_lengths(x, op)
        share = grad / _divisor(x, op, out)
        for at in pool_taps(op, out):
            full[at] += share
    crop = tuple(slice(p, p + m) for p, m in zip(op.padding, x.shape[2:], strict=True))
    return np.ascontiguousarray(full[(slice(None), slice(None), *crop)])


def _max_backward(padded: Array, grad: Array, op: PoolBackward, full: Array) -> None:
    """Adds each window's gradient into ``full`` (``padded``'s shape) at the window's first
    largest element, tap by tap: those equal to the window's maximum, in windows not given
    their gradient yet. A finite gradient is masked by a product (exact: times 1 or 0), which
    numpy makes several times faster than ``np.where``; one with an infinity or a NaN, whose
    product by 0 is NaN, by ``np.where``."""
    top = _combined(padded, op, grad.shape[2:], np.maximum)
    nan = bool(np.isnan(top).any())
    finite = bool(np.isfinite(grad).all())
    open_ = np.ones(top.shape, dtype=bool)  # windows whose gradient is not given yet
    hit, is_nan = np.empty(top.shape, dtype=bool), np.empty(top.shape, dtype=bool)
    share = np.empty(grad.shape, dtype=grad.dtype)
    for at in pool_taps(op, grad.shape[2:]):
        np.equal(padded[at], top, out=hit)
        if nan:
            hit |= np.isnan(padded[at], out=is_nan)
        hit &= open_
        open_ ^= hit
        if finite:
            full[at] += np.multiply(grad, hit, out=share)
        else:
            full[at] += np.where(hit, grad, 0)


def pool_scratch(op: Pool | PoolBackward, meta: TensorMeta, args: Sequence[Array]) -> int:
    """The most bytes :func:`run_pool` or :func:`run_pool_backward` allocates beside its
    result: with padding, the padded input (which the gradient of average pooling does not
    read) and for the gradient the padded gradient before its crop, and, without
    ``count_include_pad``, each window's count of positions inside the input; for the
    gradient, the pooled maxima, three masks of windows and a tap's share (max) or the shares
    (average); and numpy's buffers."""
    x = args[0]
    n_c = int(x.shape[0]) * int(x.shape[1])
    padded = math.prod(int(m) + 2 * p for m, p in zip(x.shape[2:], op.padding, strict=True))
    pooled = math.prod(pooled_lengths(x, op))
    elements = 0
    if any(op.padding):
        copies = 2 if isinstance(op, PoolBackward) and op.op == "max" else 1
        elements += copies * n_c * padded
        if not op.count_include_pad and op.op == "avg":
            elements += padded + pooled
    masks = 0
    if isinstance(op, PoolBackward):
        elements += (2 if op.op == "max" else 1) * n_c * pooled
        masks = 3 * n_c * pooled if op.op == "max" else 0
    return int(x.dtype.itemsize) * (elements + ufunc_buffers()) + masks
