"""Attention: ``scaled_dot_product_attention``, composed of matmuls and a softmax, and the
core it shares with ``nn.MultiheadAttention``.

Masks follow ``F.scaled_dot_product_attention``: a boolean mask says where to attend
(``True``: attend; elsewhere the score becomes -inf), a floating one is added to the scores.
A query row that the masks leave nowhere to attend (every score -inf) gives zeros and sends
no gradient, as PyTorch's (its "safe softmax", since 2.5): a NaN there would reach every
parameter through the backward pass even when the loss ignores the row (left padding under a
causal mask makes such rows). ``nn.MultiheadAttention`` returning its weights keeps PyTorch's
NaN instead.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from client.autodiff import Autodiff, Tensor

from .arguments import ArrayLike, as_tensor, check_same_dtype, namespace_of, sizes
from .dropout import dropout


def scaled_dot_product_attention(
    query: ArrayLike,
    key: ArrayLike,
    value: ArrayLike,
    attn_mask: ArrayLike | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
) -> Tensor:
    """``softmax(query @ key.mT * scale + mask) @ value`` over ``query`` (..., L, E), ``key``
    (..., S, E) and ``value`` (..., S, Ev), giving (..., L, Ev); ``scale`` is 1/sqrt(E) by
    default. ``is_causal`` lets position i attend to positions up to i only (the mask's top
    left triangle, as PyTorch's); it cannot be combined with ``attn_mask``. ``dropout_p``
    drops attention weights (whenever it is above 0, as PyTorch's: pass 0.0 to evaluate)."""
    name = "scaled_dot_product_attention"
    ad = namespace_of(query, key, value)
    q, k, v = as_tensor(ad, query), as_tensor(ad, key), as_tensor(ad, value)
    if min(q.ndim, k.ndim, v.ndim) < 2:
        raise ValueError(
            f"{name}: query, key and value need (..., L, E) shapes, got {q.shape}, {k.shape}, "
            f"{v.shape}"
        )
    if q.shape[-1] != k.shape[-1] or k.shape[-2] != v.shape[-2]:
        raise ValueError(
            f"{name}: query {q.shape} and key {k.shape} must share E, key and value {v.shape} "
            "must share S"
        )
    if not ad.is_real_floating(q.array):
        raise TypeError(f"{name}: query must be float32 or float64, not {q.dtype}")
    check_same_dtype(name, q, key=k, value=v)
    masks: list[Tensor] = []
    if is_causal:
        if attn_mask is not None:
            raise ValueError(f"{name}: give attn_mask or is_causal=True, not both")
        masks.append(causal_mask(ad, sizes(q)[-2], sizes(k)[-2]))
    elif attn_mask is not None:
        mask = as_tensor(ad, attn_mask)
        scores = _broadcast(sizes(q)[:-2], sizes(k)[:-2]) + (sizes(q)[-2], sizes(k)[-2])
        if _broadcast(sizes(mask), scores) != scores:
            raise ValueError(
                f"{name}: attn_mask of shape {mask.shape} does not broadcast to the scores' "
                f"shape {scores} (..., L, S)"
            )
        masks.append(mask)
    # the causal mask alone leaves every row its first key: only a given mask can block one
    out, _ = attend(q, k, v, masks, dropout_p, scale, safe=attn_mask is not None)
    return out


def _broadcast(*shapes: tuple[int, ...]) -> tuple[int, ...]:
    """The shape ``shapes`` broadcast to, or ``()`` if they do not."""
    try:
        return np.broadcast_shapes(*shapes)
    except ValueError:
        return ()


def causal_mask(ad: Autodiff, length: int, source_length: int) -> Tensor:
    """(L, S) booleans, True where j <= i: built on the device, nothing uploaded."""
    mask: Tensor = ad.tril(ad.ones((length, source_length), dtype=ad.xp.bool))
    return mask


def attend(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    masks: Sequence[Tensor],
    dropout_p: float = 0.0,
    scale: float | None = None,
    *,
    safe: bool = False,
) -> tuple[Tensor, Tensor]:
    """The attention output and its weights (after dropout), each mask applied to the scores
    in turn (boolean: True attends; floating: added). ``safe``: a row the masks block
    entirely gets zero weights (and no gradient) rather than NaN."""
    ad = q.namespace
    factor = 1.0 / math.sqrt(sizes(q)[-1]) if scale is None else float(scale)
    scores = (q * factor) @ ad.matrix_transpose(k)  # scaled before: L*E products, not L*S
    for mask in masks:
        if ad.xp.isdtype(mask.dtype, "bool"):
            scores = ad.where(mask, scores, -math.inf)
        elif mask.dtype == scores.dtype:
            scores = scores + mask
        else:
            raise TypeError(
                f"attention: a mask is boolean or of the scores' dtype {scores.dtype}, not "
                f"{mask.dtype}"
            )
    if safe:  # each blocked row softmaxed as zeros, its result replaced: no NaN either way
        blocked = ad.all(scores == -math.inf, axis=-1, keepdims=True)
        scores = ad.where(blocked, 0.0, scores)
    weights = ad.softmax(scores, axis=-1)
    if safe:
        weights = ad.where(blocked, 0.0, weights)
    if dropout_p > 0.0:
        weights = dropout(weights, dropout_p, training=True)
    out: Tensor = weights @ v
    return out, weights
