"""The numpy formulations ``python -m bench.conv_formulations`` times against the server's
(``server/executor/convolution.py`` and ``pooling.py``, whose helpers they share): each takes
and gives what the server's runner of its op does."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from protocol.ops import Conv, Pool, PoolBackward
from server.executor.convolution import (
    conv_lengths,
    pad_spatial,
    tap_slices,
    transpose_frame,
    windows,
)
from server.executor.pooling import pool_input, pool_taps

Array = np.ndarray[Any, Any]


def _all(*index: slice) -> tuple[slice, ...]:
    return (slice(None), slice(None), *index)


def _window_view(x: Array, kernel: tuple[int, ...], op: Conv, out: list[int]) -> Array:
    """(N, C, *out, *kernel) of ``x`` padded, a view."""
    return windows(pad_spatial(x, op.padding), kernel, op, out)


def _letters(dims: int) -> tuple[str, str]:
    return "hwd"[:dims], "ijk"[:dims]


# --- the forward convolution ----------------------------------------------------------------


def conv_im2col_whole(x: Array, w: Array, op: Conv) -> Array:
    """The server's im2col, the whole batch at once (one window matrix, however large)."""
    n, c = x.shape[:2]
    g, co, kernel = op.groups, w.shape[0], w.shape[2:]
    out, dims = conv_lengths(x.shape[2:], kernel, op), len(kernel)
    win = _window_view(x, kernel, op, out).reshape(n, g, c // g, *out, *kernel)
    order = (1, 2, *range(3 + dims, 3 + 2 * dims), 0, *range(3, 3 + dims))
    cols = np.ascontiguousarray(win.transpose(order)).reshape(g, -1, n * math.prod(out))
    y = (w.reshape(g, co // g, -1) @ cols).reshape(g, co // g, n, *out)
    return np.ascontiguousarray(np.moveaxis(y, 2, 0)).reshape(n, co, *out)


def conv_tensordot(x: Array, w: Array, op: Conv) -> Array:
    c, g, co, kernel = x.shape[1], op.groups, w.shape[0], w.shape[2:]
    out, dims = conv_lengths(x.shape[2:], kernel, op), len(kernel)
    win = _window_view(x, kernel, op, out)
    cg, og = c // g, co // g
    axes = ([1, *range(2 + dims, 2 + 2 * dims)], list(range(1, 2 + dims)))
    parts = [
        np.tensordot(win[:, i * cg : (i + 1) * cg], w[i * og : (i + 1) * og], axes=axes)
        for i in range(g)
    ]
    return np.ascontiguousarray(np.moveaxis(np.concatenate(parts, axis=-1), -1, 1))


def conv_einsum(x: Array, w: Array, op: Conv) -> Array:
    n, c = x.shape[:2]
    g, co, kernel = op.groups, w.shape[0], w.shape[2:]
    out = conv_lengths(x.shape[2:], kernel, op)
    win = _window_view(x, kernel, op, out).reshape(n, g, c // g, *out, *kernel)
    sp, tp = _letters(len(kernel))
    wg = w.reshape(g, co // g, c // g, *kernel)
    y = np.einsum(f"ngc{sp}{tp},goc{tp}->ngo{sp}", win, wg, optimize=True)
    return np.ascontiguousarray(y.reshape(n, co, *out))


def conv_per_tap(x: Array, w: Array, op: Conv) -> Array:
    n, c = x.shape[:2]
    g, co, kernel = op.groups, w.shape[0], w.shape[2:]
    out = conv_lengths(x.shape[2:], kernel, op)
    xp, p = pad_spatial(x, op.padding), math.prod(out)
    wt = np.ascontiguousarray(np.moveaxis(w.reshape(g, co // g, c // g, -1), -1, 0))
    y = np.zeros((g, co // g, n * p), dtype=x.dtype)
    for t, at in enumerate(tap_slices(kernel, op.dilation, out, op.stride)):
        tap = xp[_all(*at)].reshape(n, g, c // g, p)
        y += wt[t] @ np.ascontiguousarray(tap.transpose(1, 2, 0, 3)).reshape(g, c // g, n * p)
    y = y.reshape(g, co // g, n, *out)
    return np.ascontiguousarray(np.moveaxis(y, 2, 0)).reshape(n, co, *out)


# --- the weight's gradient ------------------------------------------------------------------


def weight_grad_tensordot(x: Array, grad: Array, op: Conv) -> Array:
    c, g, co, kernel = x.shape[1], op.groups, grad.shape[1], op.kernel
    out, dims = list(grad.shape[2:]), len(kernel)
    win = _window_view(x, kernel, op, out)
    cg, og = c // g, co // g
    axes = ([0, *range(2, 2 + dims)], [0, *range(2, 2 + dims)])
    parts = [
        np.tensordot(grad[:, i * og : (i + 1) * og], win[:, i * cg : (i + 1) * cg], axes=axes)
        for i in range(g)
    ]
    return np.ascontiguousarray(np.concatenate(parts, axis=0))


def weight_grad_einsum(x: Array, grad: Array, op: Conv) -> Array:
    n, c = x.shape[:2]
    g, co, kernel = op.groups, grad.shape[1], op.kernel
    out = list(grad.shape[2:])
    win = _window_view(x, kernel, op, out).reshape(n, g, c // g, *out, *kernel)
    sp, tp = _letters(len(kernel))
    gg = grad.reshape(n, g, co // g, *out)
    gw = np.einsum(f"ngo{sp},ngc{sp}{tp}->goc{tp}", gg, win, optimize=True)
    return np.ascontiguousarray(gw.reshape(co, c // g, *kernel))


def weight_grad_per_tap(x: Array, grad: Array, op: Conv) -> Array:
    n, c = x.shape[:2]
    g, co, kernel = op.groups, grad.shape[1], op.kernel
    out = list(grad.shape[2:])
    xp, p = pad_spatial(x, op.padding), math.prod(out)
    gg = np.ascontiguousarray(grad.reshape(n, g, co // g, p).transpose(1, 2, 0, 3))
    gg = gg.reshape(g, co // g, n * p)
    gw = np.empty((g, co // g, c // g, math.prod(kernel)), dtype=x.dtype)
    for t, at in enumerate(tap_slices(kernel, op.dilation, out, op.stride)):
        tap = xp[_all(*at)].reshape(n, g, c // g, p)
        gw[..., t] = gg @ np.ascontiguousarray(tap.transpose(1, 0, 3, 2)).reshape(g, n * p, c // g)
    return gw.reshape(co, c // g, *kernel)


# --- the transpose --------------------------------------------------------------------------


def _scatter(part: Callable[[int], Array], x: Array, w: Array, op: Conv) -> Array:
    """Each tap's contribution ``part(t)`` (g, C_out/g, N * L) added into its strided slice
    of the full output, cropped and put back into (N, C_out, ...)."""
    n, g = x.shape[0], op.groups
    co, kernel, lengths = w.shape[1] * g, w.shape[2:], x.shape[2:]
    size, crop = transpose_frame(lengths, kernel, op)
    full = np.zeros((g, co // g, n, *size), dtype=x.dtype)
    for t, at in enumerate(tap_slices(kernel, op.dilation, lengths, op.stride)):
        full[_all(slice(None), *at)] += part(t).reshape(g, co // g, n, *lengths)
    y = full[_all(slice(None), *crop)]
    return np.ascontiguousarray(np.moveaxis(y, 2, 0)).reshape(n, co, *y.shape[3:])


def transpose_einsum(x: Array, w: Array, op: Conv) -> Array:
    n, c, g = x.shape[0], x.shape[1], op.groups
    sp, _ = _letters(len(op.stride))
    xg = x.reshape(n, g, c // g, *x.shape[2:])
    wg = w.reshape(g, c // g, w.shape[1], -1)
    cols = np.einsum(f"ngc{sp},gcot->gotn{sp}", xg, wg, optimize=True)
    return _scatter(lambda t: cols[:, :, t], x, w, op)


def transpose_col2im(x: Array, w: Array, op: Conv) -> Array:
    """The weight's transpose times the input for every tap at once (one BLAS product per
    group), then each tap's part added into its strided slice (col2im)."""
    n, c, g = x.shape[0], x.shape[1], op.groups
    xt = np.ascontiguousarray(x.reshape(n, g, c // g, -1).transpose(1, 2, 0, 3))
    wt = w.reshape(g, c // g, -1).transpose(0, 2, 1)
    cols = (wt @ xt.reshape(g, c // g, -1)).reshape(g, w.shape[1], -1, n * math.prod(x.shape[2:]))
    return _scatter(lambda t: cols[:, :, t], x, w, op)


def transpose_dilated(
    x: Array, w: Array, op: Conv, forward: Callable[[Array, Array, Conv], Array]
) -> Array:
    """The convolution of ``x`` spread by the stride (zeros between its elements) and padded by
    the kernel's span less the padding, with the flipped kernel, its channel axes swapped."""
    n, ci, dims, g = x.shape[0], x.shape[1], len(op.stride), op.groups
    kernel, lengths = w.shape[2:], x.shape[2:]
    spread_lengths = ((m - 1) * s + 1 for m, s in zip(lengths, op.stride, strict=True))
    spread = np.zeros((n, ci, *spread_lengths), x.dtype)
    spread[_all(*(slice(None, None, s) for s in op.stride))] = x
    extra = op.output_padding or (0,) * dims
    pads = [
        (d * (k - 1) - lo, d * (k - 1) - hi + e)
        for k, d, (lo, hi), e in zip(kernel, op.dilation, op.padding, extra, strict=True)
    ]
    crop = (
        slice(max(0, -lo), m - max(0, -hi))
        for (lo, hi), m in zip(pads, spread.shape[2:], strict=True)
    )
    spread = spread[_all(*crop)]
    flipped = w[_all(*(slice(None, None, -1),) * dims)]
    wf = flipped.reshape(g, ci // g, w.shape[1], *kernel).swapaxes(1, 2)
    wf = np.ascontiguousarray(wf.reshape(g * w.shape[1], ci // g, *kernel))
    padding = tuple((max(0, lo), max(0, hi)) for lo, hi in pads)
    spec = Conv(
        out=0, x=1, w=2, stride=(1,) * dims, padding=padding, dilation=op.dilation, groups=g
    )
    return forward(spread, wf, spec)


# --- pooling --------------------------------------------------------------------------------


def _pool_windows(x: Array, op: Pool | PoolBackward) -> tuple[Array, Array, list[int]]:
    """``x`` padded, its (N, C, *out, *kernel) windows (a view), and the pooled lengths."""
    xp, out = pool_input(x, op)
    unit = (1,) * len(op.kernel)
    spec = Conv(out=0, x=1, w=2, stride=op.stride, padding=((0, 0),) * len(unit), dilation=unit)
    return xp, windows(xp, op.kernel, spec, out), out


def pool_window_reduce(x: Array, op: Pool) -> Array:
    _, win, _ = _pool_windows(x, op)
    axes = tuple(range(-len(op.kernel), 0))
    if op.op == "max":
        return np.ascontiguousarray(win.max(axis=axes))
    return np.ascontiguousarray(win.sum(axis=axes) / math.prod(op.kernel)).astype(x.dtype)


def max_backward_argmax(x: Array, grad: Array, op: PoolBackward) -> Array:
    """Each window's gradient given to its ``argmax`` (of the windows copied flat)."""
    xp, win, out = _pool_windows(x, op)
    first = win.reshape(*win.shape[: x.ndim], -1).argmax(axis=-1)
    full = np.zeros(xp.shape, dtype=x.dtype)
    for number, at in enumerate(pool_taps(op, out)):
        full[at] += np.where(first == number, grad, 0)
    crop = (slice(p, p + m) for p, m in zip(op.padding, x.shape[2:], strict=True))
    return np.ascontiguousarray(full[_all(*crop)])
