"""The neural-network extension, with numpy: convolutions, pooling, batch normalization,
softmax and random numbers (``protocol/ops/nn.py`` says what each computes).

These functions are also the ``ndarray``'s and local numpy's definition of the ops: the
client's numpy extension (``client/extension.py``) calls them, so that a model gives the same
numbers locally, on the ``ndarray`` device and on a server.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from protocol.codec import Buffer
from protocol.ops import BatchNorm, Conv, Pool, PoolBackward, Random, Softmax
from protocol.ops.nn import conv_length

from .base import Array, Runner


def _padded(x: Array, padding: Sequence[tuple[int, int]], value: float = 0.0) -> Array:
    if not any(lo or hi for lo, hi in padding):
        return x
    return np.pad(x, ((0, 0), (0, 0), *padding), constant_values=value)


def _windows(
    x: Array,
    kernel: Sequence[int],
    stride: Sequence[int],
    dilation: Sequence[int],
    out: Sequence[int],
) -> Array:
    """A view of ``x`` (N, C, *L, already padded) as (N, C, *out, *kernel): each output
    position's window."""
    dims = len(kernel)
    spans = tuple(d * (k - 1) + 1 for k, d in zip(kernel, dilation, strict=True))
    view = sliding_window_view(x, spans, axis=tuple(range(2, 2 + dims)))
    picks = tuple(slice(0, o * s, s) for o, s in zip(out, stride, strict=True))
    taps = tuple(slice(None, None, d) for d in dilation)
    return view[(slice(None), slice(None), *picks, *taps)]


def _letters(dims: int) -> tuple[str, str]:
    """Einsum letters for ``dims`` spatial positions and kernel taps."""
    return "hwd"[:dims], "ijk"[:dims]


def conv(x: Array, w: Array, op: Conv) -> Array:
    """The forward convolution: grouped windows contracted with the weight."""
    n, c_in = x.shape[:2]
    g, c_out, dims = op.groups, w.shape[0], len(op.stride)
    kernel = w.shape[2:]
    padded = _padded(x, op.padding)
    out = [
        conv_length(*a)
        for a in zip(x.shape[2:], kernel, op.stride, op.padding, op.dilation, strict=True)
    ]
    win = _windows(padded, kernel, op.stride, op.dilation, out)
    win = win.reshape(n, g, c_in // g, *win.shape[2:])
    wg = w.reshape(g, c_out // g, c_in // g, *kernel)
    sp, tp = _letters(dims)
    y = np.einsum(f"ngc{sp}{tp},goc{tp}->ngo{sp}", win, wg, optimize=True)
    return np.ascontiguousarray(y.reshape(n, c_out, *out))


def conv_weight_grad(x: Array, grad: Array, op: Conv) -> Array:
    """The weight's gradient of :func:`conv`: output gradient against input windows."""
    n, c_in = x.shape[:2]
    g, c_out, dims = op.groups, grad.shape[1], len(op.stride)
    out = grad.shape[2:]
    win = _windows(_padded(x, op.padding), op.kernel, op.stride, op.dilation, out)
    win = win.reshape(n, g, c_in // g, *win.shape[2:])
    gg = grad.reshape(n, g, c_out // g, *out)
    sp, tp = _letters(dims)
    gw = np.einsum(f"ngo{sp},ngc{sp}{tp}->goc{tp}", gg, win, optimize=True)
    return np.ascontiguousarray(gw.reshape(c_out, c_in // g, *op.kernel))


def conv_transpose(x: Array, w: Array, op: Conv) -> Array:
    """The adjoint of :func:`conv`: each input position's contribution scattered over its
    window (one strided add per kernel tap), then cropped by the padding."""
    n, c_in = x.shape[:2]
    g, dims = op.groups, len(op.stride)
    kernel, lengths = w.shape[2:], x.shape[2:]
    c_out = w.shape[1] * g
    xg = x.reshape(n, g, c_in // g, *lengths)
    wg = w.reshape(g, c_in // g, c_out // g, *kernel)
    sp, tp = _letters(dims)
    cols = np.einsum(f"ngc{sp},gco{tp}->ngo{tp}{sp}", xg, wg, optimize=True)
    full_len = [
        (m - 1) * s + d * (k - 1) + 1
        for m, s, d, k in zip(lengths, op.stride, op.dilation, kernel, strict=True)
    ]
    extra = op.output_padding or (0,) * dims
    ends = [f - hi + e for f, (_, hi), e in zip(full_len, op.padding, extra, strict=True)]
    size = [max(f, end) for f, end in zip(full_len, ends, strict=True)]
    full = np.zeros((n, g, c_out // g, *size), dtype=x.dtype)
    for taps in itertools.product(*(range(k) for k in kernel)):
        at = tuple(
            slice(t * d, t * d + (m - 1) * s + 1, s)
            for t, d, m, s in zip(taps, op.dilation, lengths, op.stride, strict=True)
        )
        full[(slice(None), slice(None), slice(None), *at)] += cols[
            (slice(None), slice(None), slice(None), *taps)
        ]
    crop = tuple(slice(lo, end) for (lo, _), end in zip(op.padding, ends, strict=True))
    y = full[(slice(None), slice(None), slice(None), *crop)]
    return np.ascontiguousarray(y.reshape(n, c_out, *y.shape[3:]))


def run_conv(op: Conv, args: Sequence[Array], buffers: Sequence[Buffer]) -> Array:
    x, w = args
    if op.op == "conv":
        return conv(x, w, op)
    if op.op == "conv_transpose":
        return conv_transpose(x, w, op)
    return conv_weight_grad(x, w, op)


def _pool_windows(x: Array, op: Pool | PoolBackward) -> tuple[Array, list[int]]:
    fill = -np.inf if op.op == "max" else 0.0
    pads = [(p, p) for p in op.padding]
    out = [
        conv_length(m, k, s, pad, 1)
        for m, k, s, pad in zip(x.shape[2:], op.kernel, op.stride, pads, strict=True)
    ]
    ones = (1,) * len(op.kernel)
    return _windows(_padded(x, pads, fill), op.kernel, op.stride, ones, out), out


def _divisor(x: Array, op: Pool | PoolBackward, out: Sequence[int]) -> Array | float:
    """What each average window is divided by: the kernel's size, or, without
    ``count_include_pad``, the number of its positions inside ``x``."""
    if op.count_include_pad or not any(op.padding):
        return float(np.prod(op.kernel))
    ones = np.ones((1, 1, *x.shape[2:]), dtype=x.dtype)
    pads = [(p, p) for p in op.padding]
    unit = (1,) * len(op.kernel)
    win = _windows(_padded(ones, pads), op.kernel, op.stride, unit, out)
    axes = tuple(range(-len(op.kernel), 0))
    return np.asarray(win.sum(axis=axes))


def run_pool(op: Pool, args: Sequence[Array], buffers: Sequence[Buffer]) -> Array:
    (x,) = args
    win, out = _pool_windows(x, op)
    axes = tuple(range(-len(op.kernel), 0))
    if op.op == "max":
        return np.ascontiguousarray(win.max(axis=axes))
    return np.ascontiguousarray((win.sum(axis=axes) / _divisor(x, op, out)).astype(x.dtype))


def run_pool_backward(op: PoolBackward, args: Sequence[Array], buffers: Sequence[Buffer]) -> Array:
    x, grad = args
    win, out = _pool_windows(x, op)
    dims = len(op.kernel)
    pad = op.padding
    full = np.zeros(
        (*x.shape[:2], *(m + 2 * p for m, p in zip(x.shape[2:], pad, strict=True))), dtype=x.dtype
    )
    if op.op == "max":
        flat = win.reshape(*win.shape[:-dims], -1)
        first = flat.argmax(axis=-1)  # the first largest, as PyTorch's
    else:
        share = (grad / _divisor(x, op, out)).astype(x.dtype)
    for number, taps in enumerate(itertools.product(*(range(k) for k in op.kernel))):
        at = tuple(
            slice(t, t + (o - 1) * s + 1, s) for t, o, s in zip(taps, out, op.stride, strict=True)
        )
        part = np.where(first == number, grad, 0) if op.op == "max" else share
        full[(slice(None), slice(None), *at)] += part
    crop = tuple(slice(p, p + m) for p, m in zip(pad, x.shape[2:], strict=True))
    return np.ascontiguousarray(full[(slice(None), slice(None), *crop)])


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
