"""The neural-network extension, with numpy: convolutions, pooling, batch normalization,
softmax and random numbers (``protocol/ops/nn.py`` says what each computes).

These functions are also the ``ndarray``'s and local numpy's definition of the ops: the
client's numpy extension (``client/extension.py``) calls them, so that a model gives the same
numbers locally, on the ``ndarray`` device and on a server.

The formulations were chosen by measurement (``python -m bench.conv_formulations``;
bench/REASONS.md, 'Convolution formulation'):

- a convolution and its weight gradient copy the input's windows into one matrix per group
  (im2col: channels and kernel taps by samples and output positions) and make one BLAS product
  of it; the transpose makes one product of the input with the weight for every tap at once,
  then adds each tap's part into a strided slice of the output (col2im). The batch is taken a
  chunk at a time, so that a chunk's window matrix stays under :data:`COLUMNS_BYTES` (one
  sample's, if that is more);
- pooling and its gradient loop over the kernel's taps, each a strided slice of the padded
  input combined into the output (``np.maximum``, ``np.add``).

What a runner allocates beside its result, its *scratch*, is :func:`scratch_bytes`: the session
reserves it with the output before numpy runs (``server/session.py``), so that a small input
whose window matrix would be huge is refused like any other op too large.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from protocol import TensorMeta
from protocol.codec import Buffer
from protocol.ops import BatchNorm, Conv, Pool, PoolBackward, Random, Softmax
from protocol.ops.nn import conv_length

from .base import Array, Runner

# The most bytes a chunk of the batch copies its windows into (one sample's, if more).
COLUMNS_BYTES = 1 << 25


def pad_spatial(x: Array, padding: Sequence[tuple[int, int]], value: float = 0.0) -> Array:
    """``x`` (N, C, *L) padded by ``(before, after)`` per spatial dimension (``x`` itself
    when there is none)."""
    if not any(lo or hi for lo, hi in padding):
        return x
    return np.pad(x, ((0, 0), (0, 0), *padding), constant_values=value)


def conv_lengths(lengths: Sequence[int], kernel: Sequence[int], op: Conv) -> list[int]:
    """A convolution's output lengths for input ``lengths`` (the op was checked: each fits)."""
    return [
        conv_length(*a)
        for a in zip(lengths, kernel, op.stride, op.padding, op.dilation, strict=True)
    ]


def _chunk(n: int, per_sample: int) -> int:
    """How many of a batch's ``n`` samples a chunk takes: as many as keep ``per_sample`` bytes
    each under :data:`COLUMNS_BYTES`, at least one."""
    return max(1, min(n, COLUMNS_BYTES // max(1, per_sample)))


def _batches(n: int, per_sample: int) -> list[slice]:
    step = _chunk(n, per_sample)
    return [slice(start, start + step) for start in range(0, n, step)]


def windows(x: Array, kernel: Sequence[int], op: Conv, out: Sequence[int]) -> Array:
    """A view of ``x`` (N, C, *L, already padded) as (N, C, *out, *kernel): each output
    position's window."""
    dims = len(kernel)
    spans = tuple(d * (k - 1) + 1 for k, d in zip(kernel, op.dilation, strict=True))
    view = sliding_window_view(x, spans, axis=tuple(range(2, 2 + dims)))
    picks = tuple(slice(0, o * s, s) for o, s in zip(out, op.stride, strict=True))
    taps = tuple(slice(None, None, d) for d in op.dilation)
    return view[(slice(None), slice(None), *picks, *taps)]


def _columns(x: Array, kernel: Sequence[int], op: Conv, out: Sequence[int]) -> Array:
    """The windows of ``x`` (N, C, *L, before padding) copied into one matrix per group:
    (groups, C/groups * taps, N * positions), a channel's taps in consecutive rows."""
    n, c = x.shape[:2]
    dims = len(kernel)
    view = windows(pad_spatial(x, op.padding), kernel, op, out)
    view = view.reshape(n, op.groups, c // op.groups, *out, *kernel)
    order = (1, 2, *range(3 + dims, 3 + 2 * dims), 0, *range(3, 3 + dims))
    rows = c // op.groups * math.prod(kernel)
    return np.ascontiguousarray(view.transpose(order)).reshape(op.groups, rows, n * math.prod(out))


def conv(x: Array, w: Array, op: Conv) -> Array:
    """The forward convolution: the weight (groups, C_out/groups, C_in/groups * taps) times
    the window matrix, a chunk of the batch at a time."""
    n, c = x.shape[:2]
    g, c_out, kernel = op.groups, w.shape[0], w.shape[2:]
    out = conv_lengths(x.shape[2:], kernel, op)
    positions, taps = math.prod(out), math.prod(kernel)
    y = np.empty((n, c_out, *out), dtype=x.dtype)
    by_group = y.reshape(n, g, c_out // g, positions)  # a view of y
    wg = w.reshape(g, c_out // g, c // g * taps)
    for part in _batches(n, c * taps * positions * x.itemsize):
        product = wg @ _columns(x[part], kernel, op, out)  # (g, C_out/g, m * positions)
        m = product.shape[-1] // positions
        by_group[part] = np.moveaxis(product.reshape(g, c_out // g, m, positions), 2, 0)
    return y


def conv_weight_grad(x: Array, grad: Array, op: Conv) -> Array:
    """The weight's gradient of :func:`conv`: the output gradient (groups, C_out/groups,
    N * positions) times the window matrix's transpose, summed over the batch's chunks."""
    n, c = x.shape[:2]
    g, c_out, kernel = op.groups, grad.shape[1], op.kernel
    out = grad.shape[2:]
    positions, taps = math.prod(out), math.prod(kernel)
    gw = np.zeros((g, c_out // g, c // g * taps), dtype=x.dtype)
    for part in _batches(n, c * taps * positions * x.itemsize):
        cols = _columns(x[part], kernel, op, out)
        m = cols.shape[-1] // positions
        gg = grad[part].reshape(m, g, c_out // g, positions).transpose(1, 2, 0, 3)
        gw += gg.reshape(g, c_out // g, m * positions) @ cols.transpose(0, 2, 1)
    return gw.reshape(c_out, c // g, *kernel)


def transpose_frame(
    lengths: Sequence[int], kernel: Sequence[int], op: Conv
) -> tuple[list[int], tuple[slice, ...]]:
    """A transposed convolution's full scatter: its lengths (grown where ``output_padding``
    reaches past it), and the crop of it that is the output."""
    full = [
        (m - 1) * s + d * (k - 1) + 1
        for m, s, d, k in zip(lengths, op.stride, op.dilation, kernel, strict=True)
    ]
    extra = op.output_padding or (0,) * len(kernel)
    ends = [f - hi + e for f, (_, hi), e in zip(full, op.padding, extra, strict=True)]
    size = [max(f, end) for f, end in zip(full, ends, strict=True)]
    return size, tuple(slice(lo, end) for (lo, _), end in zip(op.padding, ends, strict=True))


def conv_transpose(x: Array, w: Array, op: Conv) -> Array:
    """The adjoint of :func:`conv`: the weight's transpose times the input for every tap at
    once, then each tap's part added into its strided slice of the full output (col2im),
    which is cropped by the padding; a chunk of the batch at a time."""
    n, c_in = x.shape[:2]
    g, kernel, lengths = op.groups, w.shape[2:], x.shape[2:]
    per_group, taps, positions = w.shape[1], math.prod(kernel), math.prod(lengths)
    size, crop = transpose_frame(lengths, kernel, op)
    y = np.empty((n, per_group * g, *(c.stop - c.start for c in crop)), dtype=x.dtype)
    by_group = y.reshape(n, g, per_group, *y.shape[2:])  # a view of y
    wt = w.reshape(g, c_in // g, per_group * taps).transpose(0, 2, 1)
    for part in _batches(n, per_group * g * taps * positions * x.itemsize):
        xc = x[part]
        m = xc.shape[0]
        xt = xc.reshape(m, g, c_in // g, positions).transpose(1, 2, 0, 3)
        cols = wt @ xt.reshape(g, c_in // g, m * positions)
        cols = cols.reshape(g, per_group, taps, m, *lengths)
        full = np.zeros((g, per_group, m, *size), dtype=x.dtype)
        for t, at in enumerate(tap_slices(kernel, op.dilation, lengths, op.stride)):
            full[(slice(None), slice(None), slice(None), *at)] += cols[:, :, t]
        by_group[part] = np.moveaxis(full[(slice(None), slice(None), slice(None), *crop)], 2, 0)
    return y


def tap_slices(
    kernel: Sequence[int], dilation: Sequence[int], out: Sequence[int], stride: Sequence[int]
) -> Iterator[tuple[slice, ...]]:
    """For each kernel tap in order, the strided slice of a (padded) input that it meets for
    every one of ``out`` output positions."""
    for taps in itertools.product(*(range(k) for k in kernel)):
        yield tuple(
            slice(t * d, t * d + (o - 1) * s + 1, s)
            for t, d, o, s in zip(taps, dilation, out, stride, strict=True)
        )


def run_conv(op: Conv, args: Sequence[Array], buffers: Sequence[Buffer]) -> Array:
    x, w = args
    if op.op == "conv":
        return conv(x, w, op)
    if op.op == "conv_transpose":
        return conv_transpose(x, w, op)
    return conv_weight_grad(x, w, op)


def conv_scratch(op: Conv, meta: TensorMeta, args: Sequence[Array]) -> int:
    """The most bytes :func:`run_conv` allocates beside its result (``args`` may be arrays of
    the inputs' shapes and dtypes only): a chunk's padded input, window matrix and product; for
    the transpose a chunk's input copied, product for every tap, and full output."""
    x, w = args
    n, c, *lengths = (int(d) for d in x.shape)
    inner = tuple(int(d) for d in w.shape[2:])  # the kernel, or the gradient's lengths
    itemsize = int(x.dtype.itemsize)
    if op.op == "conv_transpose":
        taps, positions, c_out = math.prod(inner), math.prod(lengths), meta.shape[1]
        size = math.prod(transpose_frame(lengths, inner, op)[0])
        m = _chunk(n, c_out * taps * positions * itemsize)
        return itemsize * m * (c * positions + c_out * taps * positions + c_out * size)
    if op.op == "conv":
        kernel, out, c_out = inner, meta.shape[2:], meta.shape[1]
    else:  # the weight's gradient
        kernel, out, c_out = op.kernel, inner, meta.shape[0]
    positions, taps = math.prod(out), math.prod(kernel)
    padded = math.prod(m + lo + hi for m, (lo, hi) in zip(lengths, op.padding, strict=True))
    m = _chunk(n, c * taps * positions * itemsize)
    partial = math.prod(meta.shape) if op.op == "conv_weight_grad" else 0
    return itemsize * (m * (c * padded + c * taps * positions + c_out * positions) + partial)


def pool_input(x: Array, op: Pool | PoolBackward) -> tuple[Array, list[int]]:
    """``x`` padded (with -inf for max pooling, zeros for average pooling) and the pooled
    lengths."""
    fill = -np.inf if op.op == "max" else 0.0
    pads = [(p, p) for p in op.padding]
    out = [
        conv_length(m, k, s, pad, 1)
        for m, k, s, pad in zip(x.shape[2:], op.kernel, op.stride, pads, strict=True)
    ]
    return pad_spatial(x, pads, fill), out


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
    padded, out = pool_input(x, op)
    full = np.zeros(padded.shape, dtype=x.dtype)
    if op.op == "max":
        top = _combined(padded, op, out, np.maximum)
        nan = bool(np.isnan(top).any())
        open_ = np.ones(top.shape, dtype=bool)  # windows whose gradient is not given yet
        for at in pool_taps(op, out):
            hit = padded[at] == top
            if nan:
                hit |= np.isnan(padded[at])
            hit &= open_
            open_ ^= hit
            full[at] += np.where(hit, grad, 0)
    else:
        share = grad / _divisor(x, op, out)
        for at in pool_taps(op, out):
            full[at] += share
    crop = tuple(slice(p, p + m) for p, m in zip(op.padding, x.shape[2:], strict=True))
    return np.ascontiguousarray(full[(slice(None), slice(None), *crop)])


def pool_scratch(op: Pool | PoolBackward, meta: TensorMeta, args: Sequence[Array]) -> int:
    """The most bytes :func:`run_pool` or :func:`run_pool_backward` allocates beside its
    result: the padded input; for the gradient its padded copy, and the windows' maxima and
    masks (or the average's shares)."""
    x = args[0]
    padded = math.prod(int(m) + 2 * p for m, p in zip(x.shape, (0, 0, *op.padding), strict=True))
    itemsize = int(x.dtype.itemsize)
    if isinstance(op, Pool):
        return itemsize * padded
    pooled = int(args[1].size)
    return itemsize * (2 * padded + 3 * pooled) + 3 * pooled


def run_batch_norm(op: BatchNorm, args: Sequence[Array], buffers: Sequence[Buffer]) -> Array:
    x, mean, var, *affine = args
    shape = (1, x.shape[1]) + (1,) * (x.ndim - 2)
    scale = 1.0 / np.sqrt(var + x.dtype.type(op.eps))
    if op.weight is not None:
        scale = scale * affine[0]
    y = (x - mean.reshape(shape)) * scale.reshape(shape)
    if op.bias is not None:
        y += affine[-1].reshape(shape)
    return np.asarray(y, dtype=x.dtype)


def run_softmax(op: Softmax, args: Sequence[Array], buffers: Sequence[Buffer]) -> Array:
    (x,) = args
    shifted = x - x.max(axis=op.axis, keepdims=True) if x.size else x
    if op.op == "log_softmax":
        return np.asarray(shifted - np.log(np.exp(shifted).sum(axis=op.axis, keepdims=True)))
    e = np.exp(shifted)
    e /= e.sum(axis=op.axis, keepdims=True)
    return np.asarray(e)


def generator(state: Array) -> np.random.Generator:
    """The numpy generator a ``random`` op draws from: Philox keyed by ``[seed, offset]``."""
    seed, offset = (int(v) for v in state)
    return np.random.Generator(np.random.Philox(key=np.array([seed, offset], dtype=np.uint64)))


def run_random(op: Random, args: Sequence[Array], buffers: Sequence[Buffer]) -> Array:
    gen = generator(args[0])
    dtype: Any = np.dtype(op.dtype)
    if op.op == "uniform":
        return np.asarray(gen.random(op.shape, dtype=dtype))
    return np.asarray(gen.standard_normal(op.shape, dtype=dtype))


RUNNERS: dict[type, Runner] = {
    Conv: run_conv,
    Pool: run_pool,
    PoolBackward: run_pool_backward,
    BatchNorm: run_batch_norm,
    Softmax: run_softmax,
    Random: run_random,
}

Scratch = Callable[[Any, TensorMeta, Sequence[Array]], int]
SCRATCH: dict[type, Scratch] = {Conv: conv_scratch, Pool: pool_scratch, PoolBackward: pool_scratch}
