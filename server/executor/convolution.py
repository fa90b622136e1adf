"""Convolutions with numpy: the forward convolution, its transpose (also its input's
gradient) and its weight's gradient (``protocol/ops/nn.py``, ``Conv``, says what each
computes), and what each allocates beside its result.

The formulations were chosen by measurement (``python -m bench.conv_formulations``;
bench/REASONS.md, 'Convolution formulation'):

- a convolution and its weight gradient copy the input's windows into one matrix per group
  (im2col: channels and kernel taps by samples and output positions) and make one BLAS
  product of it;
- the transpose loops over blocks of the kernel's taps: the block's weights times the input,
  one BLAS product per group of at least :data:`PRODUCT_ROWS` rows where the taps allow, each
  tap's part added into its strided slice of the output.

The batch is taken a chunk at a time, so that what a chunk allocates beside the result stays
under :data:`CHUNK_BYTES` (one sample's, if that is more). What a runner allocates, its
*scratch*, is :func:`conv_scratch`: the session reserves it with the output before numpy runs
(``server/session.py``), so that a small input whose window matrix would be huge is refused
like any other op too large.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from protocol import TensorMeta
from protocol.codec import Buffer
from protocol.ops import Conv
from protocol.ops.nn import conv_length

from .base import Array

# The most scratch bytes one chunk of the batch allocates (one sample's, if that is more).
CHUNK_BYTES = 1 << 25
# The rows a product of the transpose takes at least, taps permitting: fewer run BLAS far
# below its speed, as the output channels of a first layer's input gradient would
PRODUCT_ROWS = 32
# The operands a ufunc may buffer at once (numpy's own buffers, of np.getbufsize() elements
# each, for strided, broadcast or cast operands)
BUFFERED_OPERANDS = 3


def ufunc_buffers() -> int:
    """The elements numpy's own buffers may hold while a ufunc runs (counted in scratch)."""
    return BUFFERED_OPERANDS * int(np.getbufsize())


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


def windows(x: Array, kernel: Sequence[int], op: Conv, out: Sequence[int]) -> Array:
    """A view of ``x`` (N, C, *L, already padded) as (N, C, *out, *kernel): each output
    position's window."""
    dims = len(kernel)
    spans = tuple(d * (k - 1) + 1 for k, d in zip(kernel, op.dilation, strict=True))
    view = sliding_window_view(x, spans, axis=tuple(range(2, 2 + dims)))
    picks = tuple(slice(0, o * s, s) for o, s in zip(out, op.stride, strict=True))
    taps = tuple(slice(None, None, d) for d in op.dilation)
    return view[(slice(None), slice(None), *picks, *taps)]


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


def _scratch_elements(
    op: Conv, x: Sequence[int], w: Sequence[int], out: Sequence[int]
) -> tuple[int, int]:
    """What :func:`run_conv` allocates beside its result for inputs of shapes ``x`` and
    ``w`` and a result of shape ``out``, in elements: per sample of a chunk, and once.

    - ``conv``: the padded input, its window matrix, the product;
    - ``conv_weight_grad``: the same, the output gradient copied, and one chunk's product;
    - ``conv_transpose``: the input copied, a block of taps' product, the uncropped output;
      the weight rearranged, once."""
    c, lengths = x[1], x[2:]
    if op.op == "conv_transpose":
        positions, c_out = math.prod(lengths), out[1]
        size = math.prod(transpose_frame(lengths, w[2:], op)[0])
        block = taps_at_once(math.prod(w[2:]), w[1])
        return c * positions + c_out * (block * positions + size), math.prod(w)
    if op.op == "conv":
        kernel, positions, c_out, once = w[2:], math.prod(out[2:]), out[1], 0
    else:
        kernel, positions, c_out, once = op.kernel, math.prod(w[2:]), out[0], math.prod(out)
    padded = math.prod(m + lo + hi for m, (lo, hi) in zip(lengths, op.padding, strict=True))
    padded = padded if any(lo or hi for lo, hi in op.padding) else 0  # unpadded: a view
    columns = c * math.prod(kernel) * positions
    copied = c_out * positions if op.op == "conv_weight_grad" else 0
    return c * padded + columns + c_out * positions + copied, once


def _chunk(op: Conv, x: Array, w: Array, out: Sequence[int]) -> int:
    """How many samples a chunk of the batch takes: as many as keep their scratch under
    :data:`CHUNK_BYTES`, at least one. ``x`` and ``w`` may be arrays of the inputs' shapes and
    dtypes only."""
    per_sample = _scratch_elements(op, x.shape, w.shape, out)[0] * int(x.dtype.itemsize)
    return max(1, min(int(x.shape[0]), CHUNK_BYTES // max(1, per_sample)))


def _batches(op: Conv, x: Array, w: Array, out: Sequence[int]) -> list[slice]:
    step = _chunk(op, x, w, out)
    return [slice(start, start + step) for start in range(0, x.shape[0], step)]


def conv_scratch(op: Conv, meta: TensorMeta, args: Sequence[Array]) -> int:
    """The most bytes :func:`run_conv` allocates beside its result (``args`` may be arrays of
    the inputs' shapes and dtypes only): a chunk's scratch, what it allocates once, and
    numpy's buffers."""
    x, w = args
    per_sample, once = _scratch_elements(op, x.shape, w.shape, meta.shape)
    chunk = _chunk(op, x, w, meta.shape) if x.shape[0] else 0
    return int(x.dtype.itemsize) * (chunk * per_sample + once + ufunc_buffers())


def _product(a: Array, b: Array) -> Array:
    """``a @ b`` over stacks of matrices; where the inner length is 1, an outer product by
    broadcasting, which gives the same numbers and which BLAS makes far slower."""
    return a * b if a.shape[-1] == 1 else a @ b


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
    positions = math.prod(out)
    y = np.empty((n, c_out, *out), dtype=x.dtype)
    by_group = y.reshape(n, g, c_out // g, positions)  # a view of y
    wg = w.reshape(g, c_out // g, c // g * math.prod(kernel))
    for part in _batches(op, x, w, y.shape):
        product = _product(wg, _columns(x[part], kernel, op, out))  # (g, C_out/g, m * positions)
        m = product.shape[-1] // positions
        by_group[part] = np.moveaxis(product.reshape(g, c_out // g, m, positions), 2, 0)
    return y


def conv_weight_grad(x: Array, grad: Array, op: Conv) -> Array:
    """The weight's gradient of :func:`conv`: the output gradient (groups, C_out/groups,
    N * positions) times the window matrix's transpose, summed over the batch's chunks."""
    c = x.shape[1]
    g, c_out, kernel = op.groups, grad.shape[1], op.kernel
    out = grad.shape[2:]
    positions = math.prod(out)
    gw = np.zeros((g, c_out // g, c // g * math.prod(kernel)), dtype=x.dtype)
    for part in _batches(op, x, grad, (c_out, c // g, *kernel)):
        cols = _columns(x[part], kernel, op, out)
        m = cols.shape[-1] // positions
        gg = grad[part].reshape(m, g, c_out // g, positions).transpose(1, 2, 0, 3)
        gw += _product(gg.reshape(g, c_out // g, m * positions), cols.transpose(0, 2, 1))
    return gw.reshape(c_out, c // g, *kernel)


def taps_at_once(taps: int, per_group: int) -> int:
    """How many kernel taps one product of the transpose takes: enough for
    :data:`PRODUCT_ROWS` rows (each tap gives ``per_group`` of them), at most all."""
    return max(1, min(taps, -(-PRODUCT_ROWS // max(1, per_group))))


def conv_transpose(x: Array, w: Array, op: Conv) -> Array:
    """The adjoint of :func:`conv`: the weight's transpose for a block of kernel taps times
    the input, each tap's part added into its strided slice of the full output, which is then
    cropped by the padding; a chunk of the batch at a time."""
    n, c_in = x.shape[:2]
    g, kernel, lengths = op.groups, w.shape[2:], x.shape[2:]
    per_group, positions = w.shape[1], math.prod(lengths)
    size, crop = transpose_frame(lengths, kernel, op)
    y = np.empty((n, per_group * g, *(c.stop - c.start for c in crop)), dtype=x.dtype)
    by_group = y.reshape(n, g, per_group, *y.shape[2:])  # a view of y
    # (groups, taps * C_out/groups, C_in/groups): a tap's rows together, the taps in order
    wt = np.ascontiguousarray(w.reshape(g, c_in // g, per_group, -1).transpose(0, 3, 2, 1))
    wt = wt.reshape(g, -1, c_in // g)
    slices = list(tap_slices(kernel, op.dilation, lengths, op.stride))
    block = taps_at_once(len(slices), per_group)
    for part in _batches(op, x, w, y.shape):
        m = x[part].shape[0]
        by_sample = x[part].reshape(m, g, c_in // g, positions).transpose(1, 2, 0, 3)
        xt = by_sample.reshape(g, c_in // g, m * positions)  # a copy
        full = np.zeros((g, per_group, m, *size), dtype=x.dtype)
        for first in range(0, len(slices), block):
            rows = slice(first * per_group, (first + block) * per_group)
            # (groups, taps, C_out/groups, m, *L), freed before the next block's is made
            parts = _product(wt[:, rows], xt).reshape(g, -1, per_group, m, *lengths)
            _scatter(full, parts, slices[first:][:block])
            del parts
        by_group[part] = np.moveaxis(full[(slice(None), slice(None), slice(None), *crop)], 2, 0)
    return y


def _scatter(full: Array, parts: Array, slices: Sequence[tuple[slice, ...]]) -> None:
    """Adds ``parts[:, t]`` (groups, C_out/groups, m, *L) into ``full``'s ``slices[t]``."""
    for t, at in enumerate(slices):
        full[(slice(None), slice(None), slice(None), *at)] += parts[:, t]


def run_conv(op: Conv, args: Sequence[Array], buffers: Sequence[Buffer]) -> Array:
    x, w = args
    if op.op == "conv":
        return conv(x, w, op)
    if op.op == "conv_transpose":
        return conv_transpose(x, w, op)
    return conv_weight_grad(x, w, op)
