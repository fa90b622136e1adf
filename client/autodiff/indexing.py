"""Indexing with gradients: ``x[key]`` (basic and integer-array keys), ``take`` and
``take_along_axis``.

A gathered element may be gathered twice, so its gradient is a sum over the places it went.
The standard has no scatter-add, so the gradient of a gather is written as a product with a
one-hot matrix (``positions == arange(n)``): ordinary ops of the wrapped namespace, which run
where the tensors live. For ``take``, ``take_along_axis`` and ``x[rows]`` its cost is (elements
gathered) x (length of the axis) multiply-adds: fine for labels and embedding tables of
training size; any other integer-array key costs (elements gathered) x (size of ``x``). Basic
indexing and boolean masks never repeat an element, so their gradient is written into zeros
with ``__setitem__``.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ._common import as_tensor, reshaped_or_same, same_device
from .tensor import Tensor, record

if TYPE_CHECKING:
    from .namespace import Autodiff


def _one_hot(xp: Any, positions: Any, n: int, dtype: Any) -> Any:
    """``(..., k) -> (..., k, n)``: 1 where the last axis equals the position, negative
    positions counted from the end as indexing counts them: ``positions % n`` (one op), which
    is ``positions + n`` below 0 and ``positions`` above for every position in ``[-n, n)``,
    the only ones a gather that succeeded was given."""
    if n > 0:
        positions = positions % n
    hits = xp.expand_dims(positions, axis=-1) == xp.arange(n, dtype=positions.dtype)
    return xp.astype(hits, dtype)


def _to_last(xp: Any, a: Any, axis: int) -> Any:
    """``a`` with ``axis`` moved last; ``a`` itself when it is last already (no op is sent
    for a permutation that moves nothing: it would be a view of the same layout)."""
    if axis == a.ndim - 1:
        return a
    order = tuple(i for i in range(a.ndim) if i != axis) + (axis,)
    return xp.permute_dims(a, order)


def _from_last(xp: Any, a: Any, axis: int) -> Any:
    """The last axis of ``a`` moved back to ``axis``; ``a`` itself when that is the last."""
    if axis == a.ndim - 1:
        return a
    order = list(range(a.ndim - 1))
    order.insert(axis, a.ndim - 1)
    return xp.permute_dims(a, tuple(order))


def take(ad: Autodiff, x: Any, indices: Any, /, *, axis: int | None = None) -> Tensor:
    t, index = as_tensor(ad, x), as_tensor(ad, indices)
    same_device("take", t, index)
    xp, ia = ad.xp, index.array
    if axis is None:
        if t.ndim != 1:
            raise ValueError("take: axis is required for arrays of more than one dimension")
        axis = 0
    along = axis % t.ndim
    n = t.array.shape[along]
    y = xp.take(t.array, ia, axis=along)

    def backward(g: Any) -> tuple[Any, ...]:  # (..., k) @ (k, n) -> (..., n), back in place
        summed = _to_last(xp, g, along) @ _one_hot(xp, ia, n, g.dtype)
        return (_from_last(xp, summed, along), None)

    return record(ad, "take", y, (t, index), backward)


def take_along_axis(ad: Autodiff, x: Any, indices: Any, /, *, axis: int = -1) -> Tensor:
    t, index = as_tensor(ad, x), as_tensor(ad, indices)
    same_device("take_along_axis", t, index)
    xp, ia = ad.xp, index.array
    along = axis % t.ndim
    n = t.array.shape[along]
    shape = tuple(t.array.shape)
    y = xp.take_along_axis(t.array, ia, axis=along)

    def backward(g: Any) -> tuple[Any, ...]:  # per row: (1, k) @ (k, n) -> (1, n)
        rows = xp.expand_dims(_to_last(xp, g, along), axis=-2)
        spread = reshaped_or_same(ia, tuple(g.shape), xp.broadcast_to)
        hot = _one_hot(xp, _to_last(xp, spread, along), n, g.dtype)
        summed = xp.squeeze(rows @ hot, axis=-2)
        grad = _from_last(xp, summed, along)
        return (_summed_to(xp, grad, shape), None)

    return record(ad, "take_along_axis", y, (t, index), backward)


def _summed_to(xp: Any, grad: Any, shape: tuple[int, ...]) -> Any:
    """Sum over the axes where ``x`` had length 1 but the indices broadcast it wider."""
    stretched = tuple(i for i, n in enumerate(shape) if n == 1 and grad.shape[i] != 1)
    return xp.sum(grad, axis=stretched, keepdims=True) if stretched else grad


def _is_array_key(item: Any) -> bool:
    """An index array (a numpy integer scalar has ``__array_namespace__`` too, but is an int)."""
    if isinstance(item, numbers.Integral):
        return False
    return isinstance(item, Tensor) or hasattr(item, "__array_namespace__")


def _is_basic(item: Any) -> bool:
    """An index item that takes each element at most once (a list, as numpy's and the remote
    namespace's ``x[[0, 0]]``, may take one twice: its gradient must add up, not overwrite)."""
    return item is None or item is Ellipsis or isinstance(item, numbers.Integral | slice)


def getitem(ad: Autodiff, x: Any, key: Any, /) -> Tensor:
    """``x[key]``. Its gradient: written into zeros where no element can be taken twice (basic
    keys, a boolean mask); a one-hot product along axis 0 for one integer array there (as
    ``take``); else a one-hot product over every position of ``x`` (any other integer-array
    key: (elements taken) x (size of x) multiply-adds)."""
    t = as_tensor(ad, x)
    items = key if isinstance(key, tuple) else (key,)
    arrays = [as_tensor(ad, i) for i in items if _is_array_key(i)]
    same_device("__getitem__", t, *arrays)
    plain_key = tuple(i.array if isinstance(i, Tensor) else i for i in items)
    plain_key_or_item = plain_key if isinstance(key, tuple) else plain_key[0]
    xp, shape, device = ad.xp, tuple(t.array.shape), t.array.device
    y = t.array[plain_key_or_item]
    if not arrays and all(_is_basic(item) for item in items):
        return record(
            ad,
            "__getitem__",
            y,
            (t,),
            lambda g: (_scattered(xp, g, shape, plain_key_or_item, device),),
            view_of=t,
        )
    if arrays and len(items) == 1 and xp.isdtype(arrays[0].dtype, "bool"):  # each taken once
        return record(
            ad,
            "__getitem__",
            y,
            (t, *arrays),
            lambda g: (_scattered(xp, g, shape, plain_key_or_item, device), None),
        )
    if _rows(items) and xp.isdtype(arrays[0].dtype, "integral"):
        rows = xp.reshape(arrays[0].array, (-1,))

        def backward_rows(g: Any) -> tuple[Any, ...]:  # (n, k) @ (k, rest) -> (n, rest)
            taken = xp.reshape(g, (rows.shape[0], -1))
            summed = xp.matrix_transpose(_one_hot(xp, rows, shape[0], g.dtype)) @ taken
            return (xp.reshape(summed, shape), None)

        return record(ad, "__getitem__", y, (t, *arrays), backward_rows)

    def backward(g: Any) -> tuple[Any, ...]:  # which flat position each element came from
        size = math.prod(shape)
        positions = xp.reshape(xp.arange(size, device=device), shape)[plain_key_or_item]
        flat = xp.reshape(g, (1, -1)) @ _one_hot(xp, xp.reshape(positions, (-1,)), size, g.dtype)
        return (xp.reshape(flat, shape), *(None for _ in arrays))

    return record(ad, "__getitem__", y, (t, *arrays), backward)


def _rows(items: tuple[Any, ...]) -> bool:
    """Whether the key is one index array on axis 0 and whole slices (or ``...``) after it."""
    first, *rest = items
    return _is_array_key(first) and all(
        item is Ellipsis or (isinstance(item, slice) and item == slice(None)) for item in rest
    )


def _scattered(xp: Any, g: Any, shape: tuple[int, ...], key: Any, device: Any) -> Any:
    """Zeros of the input's shape with ``g`` where the basic key took the output from."""
    grad = xp.zeros(shape, dtype=g.dtype, device=device)
    items = key if isinstance(key, tuple) else (key,)
    if any(item is None for item in items):  # the standard's setitem takes no new axes
        key = tuple(item for item in items if item is not None)
        g = xp.reshape(g, tuple(grad[key].shape))
    grad[key] = g
    return grad


FUNCTIONS: dict[str, Callable[..., Tensor]] = {
    "take": take,
    "take_along_axis": take_along_axis,
    "getitem": getitem,
}
