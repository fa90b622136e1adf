"""Element-wise ops with their gradients: unary functions, binary arithmetic with broadcasting
(each input's gradient summed back to its shape), ``where``, ``clip`` and ``astype``.

A Python scalar operand stays a scalar: it goes to the wrapped namespace as one (one op on a
remote device, not two) and never needs a gradient.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ._common import as_tensor, operand, plain, same_device, unbroadcast
from .tensor import Tensor, record

if TYPE_CHECKING:
    from .namespace import Autodiff

# d(name)(x)/dx times the output gradient g, from the namespace, x, the output y and g
UnaryGradient = Callable[[Any, Any, Any, Any], Any]

UNARY_GRADIENTS: dict[str, UnaryGradient] = {
    "exp": lambda xp, x, y, g: g * y,
    "expm1": lambda xp, x, y, g: g * (y + 1),
    "log": lambda xp, x, y, g: g / x,
    "log1p": lambda xp, x, y, g: g / (x + 1),
    "log2": lambda xp, x, y, g: g / (x * math.log(2)),
    "log10": lambda xp, x, y, g: g / (x * math.log(10)),
    "sqrt": lambda xp, x, y, g: g / (2 * y),
    "square": lambda xp, x, y, g: g * (2 * x),
    "tanh": lambda xp, x, y, g: g * (1 - y * y),
    "sinh": lambda xp, x, y, g: g * xp.cosh(x),
    "cosh": lambda xp, x, y, g: g * xp.sinh(x),
    "sin": lambda xp, x, y, g: g * xp.cos(x),
    "cos": lambda xp, x, y, g: -(g * xp.sin(x)),
    "tan": lambda xp, x, y, g: g * (1 + y * y),
    "atan": lambda xp, x, y, g: g / (1 + x * x),
    "abs": lambda xp, x, y, g: g * xp.sign(x),
    "negative": lambda xp, x, y, g: -g,
    "positive": lambda xp, x, y, g: g,
    "reciprocal": lambda xp, x, y, g: -(g * (y * y)),
    # piecewise constant: zero wherever the derivative exists, as PyTorch has it
    **dict.fromkeys(
        ["floor", "ceil", "round", "trunc", "sign"], lambda xp, x, y, g: xp.zeros_like(g)
    ),
}


def _unary(name: str, gradient: UnaryGradient) -> Callable[[Autodiff, Any], Tensor]:
    def unary(ad: Autodiff, x: Any, /) -> Tensor:
        t = as_tensor(ad, x)
        xa, xp = t.array, ad.xp
        y = getattr(xp, name)(xa)
        return record(ad, name, y, (t,), lambda g: (gradient(xp, xa, y, g),))

    unary.__name__ = unary.__qualname__ = name
    return unary


def sigmoid(ad: Autodiff, x: Any, /) -> Tensor:
    """``1 / (1 + exp(-x))``, computed as ``0.5 * tanh(x / 2) + 0.5``: no overflow anywhere."""
    t = as_tensor(ad, x)
    y = 0.5 * ad.xp.tanh(0.5 * t.array) + 0.5
    return record(ad, "sigmoid", y, (t,), lambda g: (g * (y * (1 - y)),))


def relu(ad: Autodiff, x: Any, /) -> Tensor:
    """``maximum(x, 0)``; its gradient at 0 is 0, as PyTorch's."""
    t = as_tensor(ad, x)
    xa, xp = t.array, ad.xp
    return record(ad, "relu", xp.maximum(xa, 0), (t,), lambda g: (xp.where(xa > 0, g, 0.0),))


# A binary op's gradient for one operand, from the namespace, a, b, the output y and g;
# either operand may be a Python scalar, whose gradient is never asked for. Each side is
# computed only for an operand that requires grad (on a remote device every op is a message).
Gradient = Callable[[Any, Any, Any, Any, Any], Any]


def _won(xp: Any, g: Any, wins: Any, ties: Any) -> Any:
    """maximum's and minimum's gradient: all of it to the winner, half each on a tie."""
    return g * (xp.astype(wins, g.dtype) + 0.5 * xp.astype(ties, g.dtype))


def _pow_base(xp: Any, a: Any, b: Any, y: Any, g: Any) -> Any:
    """``b * a ** (b - 1)``, and 0 where ``b == 0`` (PyTorch's choice: ``a ** 0`` is flat)."""
    if isinstance(b, int | float):
        return xp.zeros_like(g) if b == 0 else g * (b * a ** (b - 1))
    return xp.where(b == 0, 0.0, g * (b * a ** (b - 1)))


def _pow_exponent(xp: Any, a: Any, b: Any, y: Any, g: Any) -> Any:
    """``a ** b * log(a)``, and 0 where ``a == 0`` and ``b >= 0`` (PyTorch's choice)."""
    if not isinstance(a, int | float):
        return xp.where((a == 0) & (b >= 0), 0.0, g * (y * xp.log(a)))
    if a == 0:
        return g * xp.where(b >= 0, 0.0, -math.inf)
    return g * (y * (math.log(a) if a > 0 else math.nan))  # a negative base: NaN, as log


BINARY: dict[str, tuple[Callable[[Any, Any, Any], Any], Gradient, Gradient]] = {
    "add": (lambda xp, a, b: a + b, lambda xp, a, b, y, g: g, lambda xp, a, b, y, g: g),
    "subtract": (lambda xp, a, b: a - b, lambda xp, a, b, y, g: g, lambda xp, a, b, y, g: -g),
    "multiply": (
        lambda xp, a, b: a * b,
        lambda xp, a, b, y, g: g * b,
        lambda xp, a, b, y, g: g * a,
    ),
    "divide": (
        lambda xp, a, b: a / b,
        lambda xp, a, b, y, g: g / b,
        lambda xp, a, b, y, g: -(g * y) / b,
    ),
    "pow": (lambda xp, a, b: a**b, _pow_base, _pow_exponent),
    "maximum": (
        lambda xp, a, b: xp.maximum(a, b),
        lambda xp, a, b, y, g: _won(xp, g, a > b, a == b),
        lambda xp, a, b, y, g: _won(xp, g, b > a, a == b),
    ),
    "minimum": (
        lambda xp, a, b: xp.minimum(a, b),
        lambda xp, a, b, y, g: _won(xp, g, a < b, a == b),
        lambda xp, a, b, y, g: _won(xp, g, b < a, a == b),
    ),
    # piecewise constant in both operands: zero wherever the derivative exists
    "floor_divide": (
        lambda xp, a, b: a // b,
        lambda xp, a, b, y, g: xp.zeros_like(g),
        lambda xp, a, b, y, g: xp.zeros_like(g),
    ),
    "remainder": (
        lambda xp, a, b: a % b,
        lambda xp, a, b, y, g: g,
        lambda xp, a, b, y, g: -(g * xp.floor_divide(a, b)),
    ),
    "logaddexp": (
        lambda xp, a, b: xp.logaddexp(a, b),
        lambda xp, a, b, y, g: g * xp.exp(a - y),
        lambda xp, a, b, y, g: g * xp.exp(b - y),
    ),
    "atan2": (
        lambda xp, a, b: xp.atan2(a, b),
        lambda xp, a, b, y, g: g * b / (a * a + b * b),
        lambda xp, a, b, y, g: -(g * a) / (a * a + b * b),
    ),
    "hypot": (
        lambda xp, a, b: xp.hypot(a, b),
        lambda xp, a, b, y, g: g * a / y,
        lambda xp, a, b, y, g: g * b / y,
    ),
}


def _binary(name: str) -> Callable[[Autodiff, Any, Any], Tensor]:
    forward, gradient_a, gradient_b = BINARY[name]

    def binary(ad: Autodiff, x1: Any, x2: Any, /) -> Tensor:
        a, b = operand(ad, x1), operand(ad, x2)
        if not isinstance(a, Tensor) and not isinstance(b, Tensor):
            a = as_tensor(ad, a)
        inputs = same_device(name, a, b)
        xp, aa, ba = ad.xp, plain(a), plain(b)
        y = forward(xp, aa, ba)

        def backward(g: Any) -> tuple[Any, ...]:
            return tuple(
                _fitted(xp, gradient(xp, aa, ba, y, g), t) if t.requires_grad else None
                for gradient, t in ((gradient_a, a), (gradient_b, b))
                if isinstance(t, Tensor)
            )

        return record(ad, name, y, inputs, backward)

    binary.__name__ = binary.__qualname__ = name
    return binary


def _fitted(xp: Any, grad: Any, t: Tensor) -> Any:
    """The gradient for input ``t`` summed back to its shape (None if it needs none)."""
    return unbroadcast(xp, grad, tuple(t.array.shape)) if t.requires_grad else None


def where(ad: Autodiff, condition: Any, x1: Any, x2: Any, /) -> Tensor:
    mask = operand(ad, condition)
    cond = plain(mask)
    a, b = operand(ad, x1), operand(ad, x2)
    inputs = same_device("where", a, b)
    xp = ad.xp
    y = xp.where(cond, plain(a), plain(b))

    def backward(g: Any) -> tuple[Any, ...]:
        ga, gb = xp.where(cond, g, 0.0), xp.where(cond, 0.0, g)
        return tuple(
            _fitted(xp, grad, t) for grad, t in ((ga, a), (gb, b)) if isinstance(t, Tensor)
        )

    watched = (mask,) if isinstance(mask, Tensor) else ()
    return record(ad, "where", y, inputs, backward, watched=watched)


def clip(ad: Autodiff, x: Any, /, min: Any = None, max: Any = None) -> Tensor:  # noqa: A002
    """The standard's ``clip``; gradient 1 inside ``[min, max]`` (bounds included), else 0.
    A bound that requires grad gets its gradient too (clip is then maximum, then minimum)."""
    if any(isinstance(v, Tensor) and v.requires_grad for v in (min, max)):
        out = as_tensor(ad, x)
        out = out if min is None else ad.maximum(out, min)
        return out if max is None else ad.minimum(out, max)
    t = as_tensor(ad, x)
    bounds = tuple(v for v in (min, max) if isinstance(v, Tensor))
    same_device("clip", t, *bounds)
    xp, xa = ad.xp, t.array
    lo, hi = plain(min) if min is not None else None, plain(max) if max is not None else None
    y = xp.clip(xa, min=lo, max=hi)

    def backward(g: Any) -> tuple[Any]:
        inside = None if lo is None else xa >= lo
        if hi is not None:
            inside = xa <= hi if inside is None else xp.logical_and(inside, xa <= hi)
        return (g if inside is None else xp.where(inside, g, 0.0),)

    return record(ad, "clip", y, (t,), backward, watched=bounds)


def astype(
    ad: Autodiff,
    x: Any,
    dtype: Any,
    /,
    *,
    copy: bool = True,
    device: Any = None,
) -> Tensor:
    """A cast; between floating types the gradient is cast back."""
    t = as_tensor(ad, x)
    xp, source = ad.xp, t.array.dtype
    kwargs: dict[str, Any] = {"copy": copy} if device is None else {"copy": copy, "device": device}
    y = xp.astype(t.array, dtype, **kwargs)
    return record(ad, "astype", y, (t,), lambda g: (xp.astype(g, source),))


FUNCTIONS: dict[str, Callable[..., Tensor]] = {
    **{name: _unary(name, gradient) for name, gradient in UNARY_GRADIENTS.items()},
    **{name: _binary(name) for name in BINARY},
    "sigmoid": sigmoid,
    "relu": relu,
    "where": where,
    "clip": clip,
    "astype": astype,
}
