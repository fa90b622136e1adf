"""What every differentiable op needs: its operands as tensors, one device among them, and
gradients summed back to the shape of an input that was broadcast."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from .errors import DeviceMismatchError
from .tensor import Tensor

if TYPE_CHECKING:
    from .namespace import Autodiff

PyScalar = bool | int | float | complex
PY_SCALARS = (bool, int, float, complex)


def as_tensor(ad: Autodiff, value: Any) -> Tensor:
    """``value`` as a tensor of ``ad``: a tensor as it is, an array of the wrapped namespace
    as a constant (no copy), anything else through ``asarray``."""
    if isinstance(value, Tensor):
        return value
    if hasattr(value, "__array_namespace__"):
        return Tensor(ad, value)
    return Tensor(ad, ad.xp.asarray(value))


def operand(ad: Autodiff, value: Any) -> Tensor | PyScalar:
    """A binary op's operand: a Python scalar stays one (it travels inside the op)."""
    return value if isinstance(value, PY_SCALARS) else as_tensor(ad, value)


def same_device(name: str, *values: Tensor | PyScalar) -> tuple[Tensor, ...]:
    """The tensors among ``values``, after checking that they share one device."""
    tensors = tuple(v for v in values if isinstance(v, Tensor))
    if len(tensors) > 1:
        first = tensors[0].array.device
        for other in tensors[1:]:
            if other.array.device != first:
                raise DeviceMismatchError(
                    f"{name}: tensors on two devices, {first} and {other.array.device}; "
                    "move one with to_device() first"
                )
    return tensors


def plain(value: Tensor | PyScalar) -> Any:
    return value.array if isinstance(value, Tensor) else value


def normalized_axes(axis: int | Sequence[int] | None, ndim: int) -> tuple[int, ...]:
    """``axis`` as a sorted tuple of non-negative axes; None is every axis."""
    if axis is None:
        return tuple(range(ndim))
    axes = (axis,) if isinstance(axis, int) else tuple(axis)
    return tuple(sorted(a % ndim if ndim else a for a in axes))


def kept_shape(shape: tuple[int, ...], axes: tuple[int, ...]) -> tuple[int, ...]:
    """``shape`` with each reduced axis kept as 1 (what ``keepdims=True`` gives)."""
    return tuple(1 if i in axes else n for i, n in enumerate(shape))


def unbroadcast(xp: Any, grad: Any, shape: tuple[int, ...]) -> Any:
    """``grad`` summed over the axes along which an input of ``shape`` was broadcast."""
    if tuple(grad.shape) == shape:
        return grad
    extra = grad.ndim - len(shape)
    if extra:
        grad = xp.sum(grad, axis=tuple(range(extra)))
    stretched = tuple(i for i, n in enumerate(shape) if n == 1 and grad.shape[i] != 1)
    if stretched:
        grad = xp.sum(grad, axis=stretched, keepdims=True)
    return grad


def reshaped_or_same(
    a: Any, shape: tuple[int | None, ...], reshape: Callable[[Any, Any], Any]
) -> Any:
    """``reshape(a, shape)`` (a reshape or a broadcast), or ``a`` itself where it has that shape
    already, known in full: the op would give a view of the same layout, so none is sent."""
    if tuple(a.shape) == shape and None not in shape:
        return a
    return reshape(a, shape)
