"""Indexing ops: ``x[key]`` (basic, integer-array and boolean-mask), ``x[key] = v``, ``take``.

A key is a tuple of items: integers, slices, ``None`` (new axis), one ``"..."`` and
:class:`ArrayIndex` (an integer or boolean tensor of the same session). Shapes follow numpy's
rules: the index arrays (and integers, when arrays are present) broadcast together; their shape
replaces the indexed dimensions where they are adjacent, and goes first otherwise. A boolean
array contributes one dimension of :data:`~protocol.ops.base.UNKNOWN` length (data-dependent).
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal, TypeAlias

from pydantic import BaseModel, ConfigDict

from ..dtypes import is_integer
from ..errors import OpDTypeError, OpIndexError, OpShapeError
from .base import I64, UNKNOWN, BaseOp, TensorId, TensorMeta, check_shape, normalize_axis


class SliceSpec(BaseModel):
    """``start:stop:step`` of a basic index; ``None`` means the default."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)
    start: I64 | None = None
    stop: I64 | None = None
    step: I64 | None = None

    def to_slice(self) -> slice:
        return slice(self.start, self.stop, self.step)


class ArrayIndex(BaseModel):
    """An integer or boolean tensor used as an index."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)
    tensor: TensorId


IndexItem: TypeAlias = I64 | SliceSpec | ArrayIndex | None | Literal["..."]  # None is newaxis


def key_tensors(key: tuple[IndexItem, ...]) -> tuple[int, ...]:
    return tuple(k.tensor for k in key if isinstance(k, ArrayIndex))


def expand_key(
    key: tuple[IndexItem, ...], ndim: int, widths: dict[int, int] | None = None
) -> tuple[IndexItem, ...]:
    """Replace the ellipsis (or the implicit trailing one) by full slices. ``widths`` gives
    the number of dimensions a boolean :class:`ArrayIndex` consumes, by position in ``key``.
    """
    widths = widths or {}
    consumed = sum(widths.get(i, 1) for i, k in enumerate(key) if k is not None and k != "...")
    ellipses = sum(1 for k in key if k == "...")
    if ellipses > 1:
        raise OpIndexError("an index can only have a single ellipsis")
    if consumed > ndim:
        raise OpIndexError(f"too many indices: {consumed} for {ndim} dimensions")
    fill: tuple[IndexItem, ...] = (SliceSpec(),) * (ndim - consumed)
    if ellipses:
        at = key.index("...")
        return key[:at] + fill + key[at + 1 :]
    return key + fill


def _broadcast_unknown(shapes: list[tuple[int, ...]]) -> tuple[int, ...]:
    ndim = max((len(s) for s in shapes), default=0)
    out: list[int] = []
    for i in range(-ndim, 0):
        dims = {s[i] for s in shapes if len(s) >= -i} - {1}
        known = dims - {UNKNOWN}
        if len(known) > 1:
            raise OpIndexError(f"index arrays of shapes {shapes} do not broadcast")
        out.append(known.pop() if known else (UNKNOWN if dims else 1))
    return tuple(out)


def _array_index(meta: TensorMeta, shape: tuple[int, ...], dim: int) -> tuple[tuple[int, ...], int]:
    """What an index array at dimension ``dim`` contributes to the advanced-index block (its
    shape; a boolean mask, one dimension of unknown length) and how many dimensions it uses."""
    if meta.dtype == "bool":
        width = len(meta.shape)
        indexed = tuple(shape[dim : dim + width])
        if not all(m in (d, 0) for d, m in zip(indexed, meta.shape, strict=True)):
            raise OpIndexError(
                f"boolean index of shape {meta.shape} does not match the indexed "
                f"dimensions {indexed}"
            )
        return (UNKNOWN,), width
    if shape[dim] == 0 and 0 not in meta.shape:
        raise OpIndexError(f"index into an empty axis {dim}")
    return meta.shape, 1


def index_shape(
    shape: tuple[int, ...], key: tuple[IndexItem, ...], metas: tuple[TensorMeta, ...]
) -> tuple[int, ...]:
    """The shape of ``x[key]`` for ``x`` of ``shape``; ``metas`` describe the index tensors."""
    by_id = iter(metas)
    tensor_meta = {i: next(by_id) for i, k in enumerate(key) if isinstance(k, ArrayIndex)}
    for meta in tensor_meta.values():
        if meta.dtype != "bool" and not is_integer(meta.dtype):
            raise OpDTypeError(f"an index array must be integer or bool, not {meta.dtype}")
    widths = {i: len(m.shape) for i, m in tensor_meta.items() if m.dtype == "bool"}
    items = list(enumerate(key))
    expanded = expand_key(key, len(shape), widths)
    # positions survive expansion only through the ellipsis: recompute them on the expanded key
    metas_in_order = [tensor_meta[i] for i, k in items if isinstance(k, ArrayIndex)]
    advanced = bool(metas_in_order)
    out: list[int | None] = []  # None marks where an advanced index stands
    adv_shapes: list[tuple[int, ...]] = []
    adv_pos: list[int] = []
    dim = 0
    arrays = iter(metas_in_order)
    for item in expanded:
        if item is None:
            out.append(1)
        elif isinstance(item, SliceSpec):
            if item.step == 0:
                raise OpShapeError("slice step cannot be zero")
            out.append(len(range(*item.to_slice().indices(shape[dim]))))
            dim += 1
        elif isinstance(item, ArrayIndex):
            block, width = _array_index(next(arrays), shape, dim)
            adv_shapes.append(block)
            dim += width
            adv_pos.append(len(out))
            out.append(None)
        elif isinstance(item, int):
            n = shape[dim]
            if not -n <= item < n:
                raise OpIndexError(f"index {item} is out of bounds for axis of size {n}")
            if advanced:
                adv_shapes.append(())
                adv_pos.append(len(out))
                out.append(None)
            dim += 1
    if not advanced:
        return check_shape(tuple(d for d in out if d is not None))
    block = _broadcast_unknown(adv_shapes)
    # adjacency is judged on the key as written: an ellipsis separates, even an empty one
    written = [i for i, k in enumerate(key) if isinstance(k, ArrayIndex | int)]
    adjacent = written == list(range(written[0], written[0] + len(written)))
    rest = [d for d in out if d is not None]
    at = sum(1 for d in out[: adv_pos[0]] if d is not None) if adjacent else 0
    return tuple(rest[:at]) + block + tuple(rest[at:])


def numpy_key(key: tuple[IndexItem, ...], arrays: Any) -> tuple[Any, ...]:
    """The numpy index for ``key``; ``arrays`` yields the index tensors' arrays in order."""
    it = iter(arrays)
    out: list[Any] = []
    for k in key:
        if isinstance(k, SliceSpec):
            out.append(k.to_slice())
        elif isinstance(k, ArrayIndex):
            out.append(next(it))
        else:
            out.append(Ellipsis if k == "..." else k)
    return tuple(out)


class GetItem(BaseOp):
    """``x[key]``: basic, integer-array and boolean-mask indexing."""

    kind: Literal["getitem"] = "getitem"
    x: TensorId
    key: tuple[IndexItem, ...]

    def inputs(self) -> tuple[int, ...]:
        return (self.x, *key_tensors(self.key))

    def infer(self, *args: TensorMeta) -> TensorMeta:
        x, *index = args
        return TensorMeta(index_shape(x.shape, self.key, tuple(index)), x.dtype)


class SetItem(BaseOp):
    """``x[key] = value`` in place: the tensor ``out`` keeps its id, shape and dtype.

    ``value`` must already have ``out``'s dtype and broadcast to ``x[key]``'s shape.
    """

    kind: Literal["setitem"] = "setitem"
    inplace: ClassVar[bool] = True
    key: tuple[IndexItem, ...]
    value: TensorId

    def inputs(self) -> tuple[int, ...]:
        return (self.out, self.value, *key_tensors(self.key))

    def infer(self, *args: TensorMeta) -> TensorMeta:
        x, value, *index = args
        target = index_shape(x.shape, self.key, tuple(index))
        if value.dtype != x.dtype:
            raise OpDTypeError(
                f"Cannot cast array data from dtype('{value.dtype}') to dtype('{x.dtype}'): "
                f"cannot store {value.dtype} values into a {x.dtype} array"
            )
        if len(value.shape) > len(target):
            raise OpShapeError(f"value of shape {value.shape} does not fit {target}")
        for v, t in zip(reversed(value.shape), reversed(target), strict=False):
            if v not in (1, t) and t != UNKNOWN:
                raise OpShapeError(
                    f"could not broadcast input array from shape {value.shape} into shape "
                    f"{target}: the value does not broadcast to it"
                )
        return x


class Take(BaseOp):
    """``take(x, indices, axis)`` (1-D indices) or ``take_along_axis(x, indices, axis)``."""

    kind: Literal["take"] = "take"
    op: Literal["take", "take_along_axis"]
    x: TensorId
    indices: TensorId
    axis: I64

    def inputs(self) -> tuple[int, ...]:
        return (self.x, self.indices)

    def infer(self, *args: TensorMeta) -> TensorMeta:
        x, idx = args
        if not is_integer(idx.dtype):
            raise OpDTypeError(f"{self.op} needs integer indices, not {idx.dtype}")
        axis = normalize_axis(self.axis, len(x.shape))
        if x.shape[axis] == 0 and 0 not in idx.shape:
            raise OpShapeError(f"{self.op} from an empty axis")
        if self.op == "take":
            if len(idx.shape) != 1:
                raise OpShapeError("take needs 1-dimensional indices")
            return TensorMeta(x.shape[:axis] + idx.shape + x.shape[axis + 1 :], x.dtype)
        if len(idx.shape) != len(x.shape):
            raise OpShapeError("take_along_axis needs indices with as many dimensions as x")
        shape = []
        for i, (a, b) in enumerate(zip(x.shape, idx.shape, strict=True)):
            if i == axis:
                shape.append(b)
            elif a == b or b == 1 or a == 1:
                shape.append(max(a, b) if min(a, b) else 0)
            else:
                raise OpShapeError(f"indices of shape {idx.shape} do not fit {x.shape}")
        return TensorMeta(tuple(shape), x.dtype)
