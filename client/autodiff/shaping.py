"""Shape ops with their gradients: each sends the output gradient back through the inverse
rearrangement (``reshape`` back, the inverse permutation, the sum over broadcast axes, the
slices of a concatenation). The ops that may return a view share their input's version."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ._common import as_tensor, normalized_axes, reshaped_or_same, same_device, unbroadcast
from .tensor import Tensor, record

if TYPE_CHECKING:
    from .namespace import Autodiff


def _reshaped_back(ad: Autodiff, name: str, t: Tensor, y: Any) -> Tensor:
    """An op that only relabels the shape: the gradient is reshaped to the input's shape."""
    xp, shape = ad.xp, tuple(t.array.shape)
    return record(ad, name, y, (t,), lambda g: (reshaped_or_same(g, shape, xp.reshape),), view_of=t)


def reshape(
    ad: Autodiff,
    x: Any,
    /,
    shape: Sequence[int],
    *,
    copy: bool | None = None,
) -> Tensor:
    t = as_tensor(ad, x)
    kwargs = {} if copy is None else {"copy": copy}
    return _reshaped_back(ad, "reshape", t, ad.xp.reshape(t.array, tuple(shape), **kwargs))


def expand_dims(ad: Autodiff, x: Any, /, *, axis: int = 0) -> Tensor:
    t = as_tensor(ad, x)
    return _reshaped_back(ad, "expand_dims", t, ad.xp.expand_dims(t.array, axis=axis))


def squeeze(ad: Autodiff, x: Any, /, axis: int | tuple[int, ...]) -> Tensor:
    t = as_tensor(ad, x)
    return _reshaped_back(ad, "squeeze", t, ad.xp.squeeze(t.array, axis=axis))


def permute_dims(ad: Autodiff, x: Any, /, axes: Sequence[int]) -> Tensor:
    t = as_tensor(ad, x)
    xp, order = ad.xp, tuple(a % max(t.ndim, 1) for a in axes)
    inverse = tuple(sorted(range(len(order)), key=order.__getitem__))
    y = xp.permute_dims(t.array, order)
    return record(ad, "permute_dims", y, (t,), lambda g: (xp.permute_dims(g, inverse),), view_of=t)


def matrix_transpose(ad: Autodiff, x: Any, /) -> Tensor:
    t = as_tensor(ad, x)
    xp = ad.xp
    return record(
        ad,
        "matrix_transpose",
        xp.matrix_transpose(t.array),
        (t,),
        lambda g: (xp.matrix_transpose(g),),
        view_of=t,
    )


def broadcast_to(ad: Autodiff, x: Any, /, shape: Sequence[int]) -> Tensor:
    t = as_tensor(ad, x)
    xp, source = ad.xp, tuple(t.array.shape)
    return record(
        ad,
        "broadcast_to",
        xp.broadcast_to(t.array, tuple(shape)),
        (t,),
        lambda g: (unbroadcast(xp, g, source),),
        view_of=t,
    )


def flip(ad: Autodiff, x: Any, /, *, axis: int | tuple[int, ...] | None = None) -> Tensor:
    t = as_tensor(ad, x)
    xp = ad.xp
    return record(
        ad, "flip", xp.flip(t.array, axis=axis), (t,), lambda g: (xp.flip(g, axis=axis),), view_of=t
    )


def _along(axis: int, item: int | slice) -> tuple[Any, ...]:
    """The index key that takes ``item`` along ``axis`` and everything along the others."""
    return (*(slice(None),) * axis, item, ...)


def concat(ad: Autodiff, arrays: Sequence[Any], /, *, axis: int | None = 0) -> Tensor:
    """Each input's gradient is its slice of the output gradient (``axis=None``: of the
    flattened output)."""
    tensors = tuple(as_tensor(ad, a) for a in arrays)
    same_device("concat", *tensors)
    xp = ad.xp
    y = xp.concat([t.array for t in tensors], axis=axis)
    shapes = [tuple(t.array.shape) for t in tensors]
    along = 0 if axis is None else normalized_axes(axis, len(shapes[0]))[0]
    sizes = [math.prod(s) if axis is None else s[along] for s in shapes]

    def backward(g: Any) -> tuple[Any, ...]:
        flat = xp.reshape(g, (-1,)) if axis is None else g
        grads: list[Any] = []
        start = 0
        for t, shape, size in zip(tensors, shapes, sizes, strict=True):
            piece = flat[_along(along, slice(start, start + size))] if t.requires_grad else None
            grads.append(piece if piece is None or axis is not None else xp.reshape(piece, shape))
            start += size
        return tuple(grads)

    return record(ad, "concat", y, tensors, backward)


def stack(ad: Autodiff, arrays: Sequence[Any], /, *, axis: int = 0) -> Tensor:
    """Input i's gradient is the output gradient at index i along the new axis."""
    tensors = tuple(as_tensor(ad, a) for a in arrays)
    same_device("stack", *tensors)
    xp = ad.xp
    y = xp.stack([t.array for t in tensors], axis=axis)
    along = axis % y.ndim
    return record(
        ad,
        "stack",
        y,
        tensors,
        lambda g: tuple(
            g[_along(along, i)] if t.requires_grad else None for i, t in enumerate(tensors)
        ),
    )


FUNCTIONS: dict[str, Callable[..., Tensor]] = {
    "reshape": reshape,
    "expand_dims": expand_dims,
    "squeeze": squeeze,
    "permute_dims": permute_dims,
    "matrix_transpose": matrix_transpose,
    "broadcast_to": broadcast_to,
    "flip": flip,
    "concat": concat,
    "stack": stack,
}
