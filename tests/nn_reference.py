"""Numpy references for client.nn's convolutional, pooling, normalization and attention
functions, written as directly as the definitions read (loops over output positions), so
that they share nothing with the server's formulations (sliding windows and einsum); and the
helpers the tests of client.nn's layers share."""

from __future__ import annotations

from typing import Any

import numpy as np

Pairs = tuple[tuple[int, int], tuple[int, int]]


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
