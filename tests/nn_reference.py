"""Numpy references for client.nn's convolutional, pooling, normalization and attention
functions and for the extension's ops, written as directly as the definitions read (loops
over output positions and kernel taps), so that they share nothing with the server's
formulations (window matrices, per-tap products); and the helpers the tests of client.nn's
layers share."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

Pair = tuple[int, int]
Pairs = tuple[Pair, Pair]


def values(x: Any) -> np.ndarray:
    """A tensor's or an array's values on the client."""
    array: np.ndarray = np.asarray(getattr(x, "array", x))
    return array


def normal(*shape: int, seed: int = 0, dtype: Any = np.float64) -> np.ndarray:
    """Standard normal numbers of ``shape`` from numpy's generator seeded with ``seed``."""
    array: np.ndarray = np.random.default_rng(seed).standard_normal(shape).astype(dtype)
    return array


def conv2d(
    x: np.ndarray,
    w: np.ndarray,
    b: np.ndarray | None = None,
    stride: tuple[int, int] = (1, 1),
    pads: Pairs = ((0, 0), (0, 0)),
    dilation: tuple[int, int] = (1, 1),
    groups: int = 1,
) -> np.ndarray:
    """PyTorch's conv2d (a cross-correlation) with explicit (before, after) padding."""
    x = np.pad(x, ((0, 0), (0, 0), *pads))
    n, _, height, width = x.shape
    c_out, per_group, kh, kw = w.shape
    (sh, sw), (dh, dw) = stride, dilation
    out_h = (height - dh * (kh - 1) - 1) // sh + 1
    out_w = (width - dw * (kw - 1) - 1) // sw + 1
    out = np.zeros((n, c_out, out_h, out_w), x.dtype)
    o = c_out // groups
    for g in range(groups):
        xs, ws = x[:, g * per_group : (g + 1) * per_group], w[g * o : (g + 1) * o]
        for i in range(out_h):
            for j in range(out_w):
                patch = xs[
                    :,
                    :,
                    i * sh : i * sh + dh * (kh - 1) + 1 : dh,
                    j * sw : j * sw + dw * (kw - 1) + 1 : dw,
                ]
                out[:, g * o : (g + 1) * o, i, j] = np.einsum("nchw,ochw->no", patch, ws)
    return out if b is None else out + b[None, :, None, None]


def conv_transpose2d(
    x: np.ndarray,
    w: np.ndarray,
    b: np.ndarray | None = None,
    stride: tuple[int, int] = (1, 1),
    padding: tuple[int, int] = (0, 0),
    output_padding: tuple[int, int] = (0, 0),
    groups: int = 1,
    dilation: tuple[int, int] = (1, 1),
) -> np.ndarray:
    """PyTorch's conv_transpose2d: every input element scatters its kernel-weighted copy into
    the output, which is then cropped by ``padding`` and grown by ``output_padding``."""
    n, c_in, height, width = x.shape
    _, o, kh, kw = w.shape
    (sh, sw), (dh, dw) = stride, dilation
    full_h = (height - 1) * sh + dh * (kh - 1) + 1 + output_padding[0]
    full_w = (width - 1) * sw + dw * (kw - 1) + 1 + output_padding[1]
    full = np.zeros((n, o * groups, full_h, full_w), x.dtype)
    per_group = c_in // groups
    for g in range(groups):
        xs, ws = x[:, g * per_group : (g + 1) * per_group], w[g * per_group : (g + 1) * per_group]
        for i in range(height):
            for j in range(width):
                for a in range(kh):
                    for c in range(kw):
                        full[:, g * o : (g + 1) * o, i * sh + a * dh, j * sw + c * dw] += (
                            xs[:, :, i, j] @ ws[:, :, a, c]
                        )
    ph, pw = padding
    out = full[:, :, ph : full_h - ph, pw : full_w - pw]
    return out if b is None else out + b[None, :, None, None]


def pool2d(
    op: str,
    x: np.ndarray,
    kernel: tuple[int, int],
    stride: tuple[int, int],
    padding: tuple[int, int] = (0, 0),
    count_include_pad: bool = True,
) -> np.ndarray:
    """PyTorch's max_pool2d (padding -inf) and avg_pool2d (padding 0)."""
    (ph, pw), (kh, kw), (sh, sw) = padding, kernel, stride
    fill = -np.inf if op == "max" else 0.0
    padded = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)), constant_values=fill)
    ones = np.pad(np.ones(x.shape[2:]), ((ph, ph), (pw, pw)))
    out_h = (padded.shape[2] - kh) // sh + 1
    out_w = (padded.shape[3] - kw) // sw + 1
    out = np.zeros((*x.shape[:2], out_h, out_w), x.dtype)
    for i in range(out_h):
        for j in range(out_w):
            window = padded[:, :, i * sh : i * sh + kh, j * sw : j * sw + kw]
            if op == "max":
                out[:, :, i, j] = window.max(axis=(2, 3))
            else:
                real = ones[i * sh : i * sh + kh, j * sw : j * sw + kw].sum()
                out[:, :, i, j] = window.sum(axis=(2, 3)) / (kh * kw if count_include_pad else real)
    return out


def softmax(z: np.ndarray, axis: int = -1) -> np.ndarray:
    e = np.exp(z - z.max(axis=axis, keepdims=True))
    result: np.ndarray = e / e.sum(axis=axis, keepdims=True)
    return result


def attention(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    allowed: Any = None,
    added: Any = None,
    scale: float | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """softmax(q k^T * scale, where ``allowed`` (True attends), plus ``added``) @ v, and the
    weights."""
    factor = 1 / np.sqrt(q.shape[-1]) if scale is None else scale
    scores = (q @ np.swapaxes(k, -1, -2)) * factor
    if allowed is not None:
        scores = np.where(allowed, scores, -np.inf)
    if added is not None:
        scores = scores + added
    weights = softmax(scores)
    return weights @ v, weights


def multihead_attention(
    state: dict[str, np.ndarray],
    heads: int,
    query: np.ndarray,
    key: np.ndarray,
    value: np.ndarray,
    ignored: np.ndarray | None = None,
    attn_mask: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """PyTorch's MultiheadAttention forward on (N, L, E) inputs, from its state dict: the
    output and the weights per head (N, heads, L, S). ``ignored``: key_padding_mask (N, S),
    True ignores; ``attn_mask``: (L, S), boolean (True ignores) or added."""
    w, b = state["in_proj_weight"], state["in_proj_bias"]
    e = query.shape[-1]
    projected = [
        t @ w[i * e : (i + 1) * e].T + b[i * e : (i + 1) * e]
        for i, t in enumerate((query, key, value))
    ]
    q, k, v = (
        p.reshape(p.shape[0], p.shape[1], heads, e // heads).transpose(0, 2, 1, 3)
        for p in projected
    )
    allowed = None if ignored is None else ~ignored[:, None, None, :]
    added = None
    if attn_mask is not None and attn_mask.dtype == bool:
        allowed = ~attn_mask if allowed is None else allowed & ~attn_mask
    elif attn_mask is not None:
        added = attn_mask
    out, weights = attention(q, k, v, allowed, added)
    merged = out.transpose(0, 2, 1, 3).reshape(query.shape[0], query.shape[1], e)
    return merged @ state["out_proj.weight"].T + state["out_proj.bias"], weights


def batch_norm(
    x: np.ndarray,
    mean: np.ndarray,
    var: np.ndarray,
    weight: Any = 1.0,
    bias: Any = 0.0,
    eps: float = 1e-5,
) -> np.ndarray:
    """(x - mean) / sqrt(var + eps) * weight + bias over channel axis 1."""
    shape = (1, -1) + (1,) * (x.ndim - 2)
    normalized = (x - mean.reshape(shape)) / np.sqrt(var.reshape(shape) + eps)
    return normalized * np.reshape(weight, shape if np.ndim(weight) else ()) + np.reshape(
        bias, shape if np.ndim(bias) else ()
    )


# --- N-d convolutions and poolings, their transpose and gradients (tests/test_nn_ops.py) -------

Ints = Sequence[int]


def _grid(lengths: Sequence[int]) -> Iterator[tuple[int, ...]]:
    return itertools.product(*(range(m) for m in lengths))


def _at(pos: Ints, tap: Ints, stride: Ints, dilation: Ints) -> tuple[int, ...]:
    return tuple(p * s + t * d for p, t, s, d in zip(pos, tap, stride, dilation, strict=True))


def conv_nd(
    x: np.ndarray, w: np.ndarray, stride: Ints, padding: Sequence[Pair], dilation: Ints, groups: int
) -> np.ndarray:
    """A convolution of any number of spatial dimensions, (before, after) padding pairs."""
    xp = np.pad(x, ((0, 0), (0, 0), *padding))
    c_out, per_group, *kernel = w.shape
    out = [
        (m - d * (k - 1) - 1) // s + 1
        for m, k, s, d in zip(xp.shape[2:], kernel, stride, dilation, strict=True)
    ]
    y = np.zeros((x.shape[0], c_out, *out))
    for o in range(c_out):
        group = o // (c_out // groups)
        channels = slice(group * per_group, (group + 1) * per_group)
        for pos in _grid(out):
            for tap in _grid(kernel):
                y[(slice(None), o, *pos)] += (
                    xp[(slice(None), channels, *_at(pos, tap, stride, dilation))]
                    @ w[(o, slice(None), *tap)]
                )
    return y


def conv_weight_grad_nd(
    x: np.ndarray,
    grad: np.ndarray,
    kernel: Ints,
    stride: Ints,
    padding: Sequence[Pair],
    dilation: Ints,
    groups: int,
) -> np.ndarray:
    """:func:`conv_nd`'s weight gradient for its output's gradient ``grad``."""
    xp = np.pad(x, ((0, 0), (0, 0), *padding))
    c_out, per_group = grad.shape[1], x.shape[1] // groups
    gw = np.zeros((c_out, per_group, *kernel))
    for o in range(c_out):
        group = o // (c_out // groups)
        channels = slice(group * per_group, (group + 1) * per_group)
        for pos in _grid(grad.shape[2:]):
            for tap in _grid(kernel):
                gw[(o, slice(None), *tap)] += (
                    grad[(slice(None), o, *pos)]
                    @ xp[(slice(None), channels, *_at(pos, tap, stride, dilation))]
                )
    return gw


def conv_transpose_nd(
    x: np.ndarray,
    w: np.ndarray,
    stride: Ints,
    padding: Sequence[Pair],
    dilation: Ints,
    groups: int,
    output_padding: Ints,
) -> np.ndarray:
    """Every input element's weighted kernel scattered into the full output, which is then
    cropped by the padding and grown by the output padding."""
    c_in, per_group, *kernel = w.shape
    spans = [
        (m - 1) * s + d * (k - 1) + 1
        for m, s, d, k in zip(x.shape[2:], stride, dilation, kernel, strict=True)
    ]
    out = [f - lo - hi + e for f, (lo, hi), e in zip(spans, padding, output_padding, strict=True)]
    size = [max(f, lo + o) for f, (lo, _), o in zip(spans, padding, out, strict=True)]
    full = np.zeros((x.shape[0], per_group * groups, *size))
    for ci in range(c_in):
        group = ci // (c_in // groups)
        outs = slice(group * per_group, (group + 1) * per_group)
        for pos in _grid(x.shape[2:]):
            for tap in _grid(kernel):
                full[(slice(None), outs, *_at(pos, tap, stride, dilation))] += np.outer(
                    x[(slice(None), ci, *pos)], w[(ci, slice(None), *tap)]
                )
    return full[
        (
            slice(None),
            slice(None),
            *(slice(lo, lo + o) for (lo, _), o in zip(padding, out, strict=True)),
        )
    ]


def pool_nd(
    kind: str,
    x: np.ndarray,
    grad: np.ndarray | None,
    kernel: Ints,
    stride: Ints,
    padding: Ints,
    include_pad: bool,
) -> tuple[np.ndarray, np.ndarray]:
    """Pooling and, for ``grad``, its input gradient: a window's gradient to its first largest
    element (``argmax``), or shared over its positions inside the input."""
    pads = [(p, p) for p in padding]
    xp = np.pad(x, ((0, 0), (0, 0), *pads), constant_values=-np.inf if kind == "max" else 0.0)
    inside = np.pad(np.ones(x.shape[2:]), pads)
    out = [(m - k) // s + 1 for m, k, s in zip(xp.shape[2:], kernel, stride, strict=True)]
    y, gx = np.zeros((*x.shape[:2], *out)), np.zeros(xp.shape)
    for pos in _grid(out):
        window = tuple(slice(q * s, q * s + k) for q, s, k in zip(pos, stride, kernel, strict=True))
        values = xp[(slice(None), slice(None), *window)].reshape(*x.shape[:2], -1)
        if kind == "max":
            y[(slice(None), slice(None), *pos)] = values.max(axis=-1)
            for n, c in _grid(x.shape[:2]):
                tap = np.unravel_index(values[n, c].argmax(), kernel)
                spot = (n, c, *(q * s + t for q, s, t in zip(pos, stride, tap, strict=True)))
                gx[spot] += 0.0 if grad is None else grad[(n, c, *pos)]
        else:
            divisor = math.prod(kernel) if include_pad else inside[window].sum()
            y[(slice(None), slice(None), *pos)] = values.sum(axis=-1) / divisor
            if grad is not None:
                share = grad[(slice(None), slice(None), *pos)] / divisor
                gx[(slice(None), slice(None), *window)] += share.reshape(
                    *share.shape, *(1,) * len(kernel)
                )
    crop = tuple(slice(p, p + m) for p, m in zip(padding, x.shape[2:], strict=True))
    return y, gx[(slice(None), slice(None), *crop)]
