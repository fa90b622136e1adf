"""Batch normalization with its gradients, over Tensorwire's neural-network extension
(``extension.py``): the forward is one op, the backward a few standard ops on what it saw."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ._common import as_tensor, same_device
from .extension import extension_of
from .tensor import Tensor, record

if TYPE_CHECKING:
    from .namespace import Autodiff


def batch_norm(
    ad: Autodiff,
    x: Any,
    mean: Any,
    var: Any,
    weight: Any = None,
    bias: Any = None,
    /,
    *,
    eps: float = 1e-5,
) -> Tensor:
    """``(x - mean) / sqrt(var + eps) * weight + bias`` over channel axis 1 of ``x`` (N, C,
    ...), with gradients to every tensor among them: in training, ``mean`` and ``var`` are
    the batch's own, computed from ``x``, and their gradients flow back into ``x``."""
    t, m, v = as_tensor(ad, x), as_tensor(ad, mean), as_tensor(ad, var)
    w = None if weight is None else as_tensor(ad, weight)
    b = None if bias is None else as_tensor(ad, bias)
    optional = tuple(o for o in (w, b) if o is not None)
    inputs = same_device("batch_norm", t, m, v, *optional)
    xp, ext = ad.xp, extension_of(ad.xp)
    xa, ma, va = t.array, m.array, v.array
    wa = None if w is None else w.array
    y = ext.batch_norm(xa, ma, va, wa, None if b is None else b.array, eps=float(eps))

    def backward(g: Any) -> tuple[Any, ...]:
        per_channel = (1, -1) + (1,) * (xa.ndim - 2)
        others = (0, *range(2, xa.ndim))
        inv = 1.0 / xp.sqrt(va + eps)
        scale = inv if wa is None else inv * wa
        gx = g * xp.reshape(scale, per_channel)
        centered = xa - xp.reshape(ma, per_channel)
        grads: list[Any] = [
            gx if t.requires_grad else None,
            -xp.sum(gx, axis=others) if m.requires_grad else None,
            (-0.5 * inv * inv) * xp.sum(gx * centered, axis=others) if v.requires_grad else None,
        ]
        if w is not None:
            normalized = centered * xp.reshape(inv, per_channel)
            grads.append(xp.sum(g * normalized, axis=others) if w.requires_grad else None)
        if b is not None:
            grads.append(xp.sum(g, axis=others) if b.requires_grad else None)
        return tuple(grads)

    return record(ad, "batch_norm", y, inputs, backward)


FUNCTIONS: dict[str, Callable[..., Tensor]] = {"batch_norm": batch_norm}
