"""Reductions over axes with their gradients (``sum``, ``mean``, ``max``, ``min``, ``var``,
``std``), and the numerically stable ``logsumexp``, ``log_softmax`` and ``softmax``.

A reduction's gradient is the output gradient put back on the reduced axes (``keepdims`` or
not) and broadcast over them, times the local derivative.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ._common import as_tensor, kept_shape, normalized_axes, reshaped_or_same
from .extension import find_extension
from .tensor import Tensor, record

if TYPE_CHECKING:
    from .namespace import Autodiff

Axis = int | Sequence[int] | None


def _spread(xp: Any, g: Any, shape: tuple[int, ...], axes: tuple[int, ...]) -> Any:
    """The output gradient with the reduced axes back as 1s (broadcasts against the input);
    kept by ``keepdims``, it has that shape already."""
    return reshaped_or_same(g, kept_shape(shape, axes), xp.reshape)


def _count(shape: tuple[int, ...], axes: tuple[int, ...]) -> int:
    return math.prod(shape[a] for a in axes)


def sum(
    ad: Autodiff,
    x: Any,
    /,
    *,
    axis: Axis = None,
    dtype: Any = None,  # noqa: A001
    keepdims: bool = False,
) -> Tensor:
    t = as_tensor(ad, x)
    xp, shape = ad.xp, tuple(t.array.shape)
    axes, source = normalized_axes(axis, len(shape)), t.array.dtype
    y = xp.sum(t.array, axis=axis, dtype=dtype, keepdims=keepdims)

    def backward(g: Any) -> tuple[Any]:
        g = g if g.dtype == source else xp.astype(g, source)
        return (xp.broadcast_to(_spread(xp, g, shape, axes), shape),)

    return record(ad, "sum", y, (t,), backward)


def mean(ad: Autodiff, x: Any, /, *, axis: Axis = None, keepdims: bool = False) -> Tensor:
    t = as_tensor(ad, x)
    xp, shape = ad.xp, tuple(t.array.shape)
    axes = normalized_axes(axis, len(shape))
    y = xp.mean(t.array, axis=axis, keepdims=keepdims)
    n = _count(shape, axes)
    return record(
        ad, "mean", y, (t,), lambda g: (xp.broadcast_to(_spread(xp, g, shape, axes) / n, shape),)
    )


def _extreme(name: str) -> Callable[..., Tensor]:
    def extreme(ad: Autodiff, x: Any, /, *, axis: Axis = None, keepdims: bool = False) -> Tensor:
        """The gradient goes to the extreme element, split evenly among ties."""
        t = as_tensor(ad, x)
        xp, xa, shape = ad.xp, t.array, tuple(t.array.shape)
        axes = normalized_axes(axis, len(shape))
        y = getattr(xp, name)(xa, axis=axis, keepdims=keepdims)

        def backward(g: Any) -> tuple[Any]:
            hits = xp.astype(xa == _spread(xp, y, shape, axes), g.dtype)
            share = _spread(xp, g, shape, axes) / xp.sum(hits, axis=axes, keepdims=True)
            return (hits * share,)

        return record(ad, name, y, (t,), backward)

    extreme.__name__ = extreme.__qualname__ = name
    return extreme


def _spread_moments(
    ad: Autodiff, name: str, x: Any, axis: Axis, correction: float, keepdims: bool
) -> Tensor:
    """``var`` and ``std``: d var/dx = 2 (x - mean) / (n - correction); d std = d var / 2 std."""
    t = as_tensor(ad, x)
    xp, xa, shape = ad.xp, t.array, tuple(t.array.shape)
    axes = normalized_axes(axis, len(shape))
    y = getattr(xp, name)(xa, axis=axis, correction=correction, keepdims=keepdims)
    dof = _count(shape, axes) - correction

    def backward(g: Any) -> tuple[Any]:
        centred = xa - xp.mean(xa, axis=axes, keepdims=True)
        gk = _spread(xp, g, shape, axes)
        if name == "var":
            return (gk * centred * (2 / dof),)
        return (gk * centred / (_spread(xp, y, shape, axes) * dof),)

    return record(ad, name, y, (t,), backward)


def var(
    ad: Autodiff, x: Any, /, *, axis: Axis = None, correction: float = 0.0, keepdims: bool = False
) -> Tensor:
    return _spread_moments(ad, "var", x, axis, correction, keepdims)


def std(
    ad: Autodiff, x: Any, /, *, axis: Axis = None, correction: float = 0.0, keepdims: bool = False
) -> Tensor:
    return _spread_moments(ad, "std", x, axis, correction, keepdims)


def _shifted(xp: Any, xa: Any, axes: tuple[int, ...]) -> tuple[Any, Any]:
    """``x - m`` and ``m``, the maximum along ``axes`` (kept), where it is finite, else 0: the
    shift that keeps ``exp`` from overflowing."""
    m = xp.max(xa, axis=axes, keepdims=True)
    m = xp.where(xp.isfinite(m), m, 0.0)
    return xa - m, m


def logsumexp(ad: Autodiff, x: Any, /, *, axis: Axis = None, keepdims: bool = False) -> Tensor:
    """``log(sum(exp(x), axis))`` without overflow; its gradient is the softmax."""
    t = as_tensor(ad, x)
    xp, xa, shape = ad.xp, t.array, tuple(t.array.shape)
    axes = normalized_axes(axis, len(shape))
    shifted, m = _shifted(xp, xa, axes)
    kept = xp.log(xp.sum(xp.exp(shifted), axis=axes, keepdims=True)) + m
    y = (
        kept
        if keepdims
        else xp.reshape(kept, tuple(n for i, n in enumerate(shape) if i not in axes))
    )
    return record(
        ad, "logsumexp", y, (t,), lambda g: (_spread(xp, g, shape, axes) * xp.exp(xa - kept),)
    )


def log_softmax(ad: Autodiff, x: Any, /, *, axis: int = -1) -> Tensor:
    """``x - logsumexp(x, axis, keepdims=True)``, stable for any magnitude: one op of the
    neural-network extension where the namespace has it, else the standard's ops."""
    t = as_tensor(ad, x)
    xp, xa = ad.xp, t.array
    axes = normalized_axes(axis, xa.ndim)
    ext = find_extension(xp) if isinstance(axis, int) else None
    if ext is not None:
        y = ext.softmax("log_softmax", xa, axis=axis)
    else:
        shifted, _ = _shifted(xp, xa, axes)
        y = shifted - xp.log(xp.sum(xp.exp(shifted), axis=axes, keepdims=True))
    return record(
        ad, "log_softmax", y, (t,), lambda g: (g - xp.exp(y) * xp.sum(g, axis=axes, keepdims=True),)
    )


def softmax(ad: Autodiff, x: Any, /, *, axis: int = -1) -> Tensor:
    """``exp(x) / sum(exp(x), axis, keepdims=True)``, shifted by the maximum first: one op
    of the neural-network extension where the namespace has it, else the standard's ops."""
    t = as_tensor(ad, x)
    xp, xa = ad.xp, t.array
    axes = normalized_axes(axis, xa.ndim)
    ext = find_extension(xp) if isinstance(axis, int) else None
    if ext is not None:
        y = ext.softmax("softmax", xa, axis=axis)
    else:
        e = xp.exp(_shifted(xp, xa, axes)[0])
        y = e / xp.sum(e, axis=axes, keepdims=True)
    return record(
        ad, "softmax", y, (t,), lambda g: (y * (g - xp.sum(g * y, axis=axes, keepdims=True)),)
    )


FUNCTIONS: dict[str, Callable[..., Tensor]] = {
    "sum": sum,
    "mean": mean,
    "max": _extreme("max"),
    "min": _extreme("min"),
    "var": var,
    "std": std,
    "logsumexp": logsumexp,
    "log_softmax": log_softmax,
    "softmax": softmax,
}
