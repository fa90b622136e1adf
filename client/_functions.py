"""The functions behind the namespace and the array's operators.

Each function builds a typed op with a client-allocated output id, runs the protocol's inference
rule (so a shape or dtype error is raised here, before anything is sent), queues the op and
returns the new handle at once.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from protocol import DType, TensorMeta, from_numpy
from protocol.codec import byte_view
from protocol.dtypes import is_bool, is_complex, is_floating
from protocol.ops import (
    UNKNOWN,
    AnyOp,
    Arange,
    AsType,
    Binary,
    BinaryName,
    Eye,
    FromBuffer,
    Full,
    GetItem,
    IndexItem,
    PermuteDims,
    Reduce,
    ReduceName,
    Reshape,
    SliceSpec,
    Unary,
    UnaryName,
    Where,
)
from protocol.ops.indexing import ArrayIndex, SetItem, key_tensors
from protocol.scalars import scalar_from_python

from .array import RemoteArray

if TYPE_CHECKING:
    from .device import Device

PyScalar = bool | int | float | complex


def wire_dtype(dtype: Any) -> DType:
    """A wire dtype name from a numpy dtype, a dtype name or a numpy scalar type."""
    return from_numpy(np.dtype(dtype))


def common_device(arrays: Sequence[RemoteArray]) -> Device:
    device = arrays[0].device
    for a in arrays[1:]:
        if a.device is not device:
            raise ValueError(
                f"arrays on different devices ({device!r} and {a.device!r}); "
                "move one with to_device first"
            )
    return device


def apply(
    make: Callable[[int], AnyOp], *inputs: RemoteArray, device: Device | None = None
) -> RemoteArray:
    """Build ``make(out)``, check it locally, queue it and return the output handle.

    :func:`apply_many` for one output, without its generality on the hot path (a
    data-dependent output takes :func:`apply_many`'s round trip).
    """
    dev = device if device is not None else common_device(inputs)
    out = dev._conn.new_id()
    op = make(out)
    metas = op.infer_all(*[a.meta for a in inputs])
    if len(metas) == 1 and UNKNOWN not in metas[0].shape:
        dev._conn.submit(op)
        return RemoteArray(dev, out, metas[0])
    return _queue(dev, op, [out], metas)[0]


def apply_many(
    make: Callable[[int, tuple[int, ...]], AnyOp],
    count: int,
    *inputs: RemoteArray,
    device: Device | None = None,
) -> tuple[RemoteArray, ...]:
    """Build ``make(out, more)`` for an op with ``count`` outputs, check it locally, queue it
    and return the output handles. An output whose shape is data-dependent costs one round
    trip: the server runs the op and describes the output before this returns.

    Raises:
        RemoteError: the server could not run an op with a data-dependent output.
    """
    dev = device if device is not None else common_device(inputs)
    ids = [dev._conn.new_id() for _ in range(count)]
    op = make(ids[0], tuple(ids[1:]))
    return _queue(dev, op, ids, op.infer_all(*[a.meta for a in inputs]))


def _queue(
    dev: Device, op: AnyOp, ids: list[int], metas: tuple[TensorMeta, ...]
) -> tuple[RemoteArray, ...]:
    """Queue the checked ``op``, whose outputs ``ids`` have ``metas``; their handles."""
    dev._conn.submit(op)
    unknown = [i for i, meta in enumerate(metas) if UNKNOWN in meta.shape]
    if unknown:  # one round trip for all of them
        try:
            described = dev._describe_blocking([ids[i] for i in unknown])
        except BaseException:
            for tensor_id in ids:  # no handle will own them: free the failed outputs
                dev._conn.release(tensor_id)
            raise
        learnt = dict(zip(unknown, described, strict=True))
        metas = tuple(learnt.get(i, meta) for i, meta in enumerate(metas))
    return tuple(RemoteArray(dev, i, meta) for i, meta in zip(ids, metas, strict=True))


def apply_inplace(make: Callable[[int], AnyOp], target: RemoteArray,
                  *inputs: RemoteArray) -> RemoteArray:  # fmt: skip
    """Queue the in-place op ``make(target id)``, whose inputs are ``target`` then ``inputs``;
    ``target`` keeps its id, shape and dtype. Returns ``target``."""
    common_device((target, *inputs))
    op = make(target.tensor_id)
    op.infer_all(target.meta, *(a.meta for a in inputs))
    target.device._conn.submit(op)
    return target


# --- creation ---------------------------------------------------------------------------------


def upload(values: np.ndarray[Any, Any], device: Device) -> RemoteArray:
    """Copy a local numpy array to ``device`` (raw bytes, little-endian, C order)."""
    dtype = from_numpy(values.dtype)
    # Note: not np.ascontiguousarray, which turns a 0-d array into a 1-d one
    values = np.asarray(values, dtype=values.dtype.newbyteorder("<"), order="C")
    shape = values.shape
    out = device._conn.new_id()
    device._conn.submit_upload(
        lambda buffer: FromBuffer(out=out, shape=shape, dtype=dtype, buffer=buffer),
        byte_view(values),
    )
    return RemoteArray(device, out, TensorMeta(shape, dtype))


def default_dtype(value: PyScalar) -> DType:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int64"
    if isinstance(value, float):
        return "float64"
    return "complex128"


def shape_tuple(shape: int | Sequence[int]) -> tuple[int, ...]:
    if isinstance(shape, int | np.integer):
        return (operator.index(shape),)
    return tuple(operator.index(d) for d in shape)


def full(shape: int | Sequence[int], value: PyScalar, dtype: DType, device: Device) -> RemoteArray:
    dims = shape_tuple(shape)
    if isinstance(value, np.generic):
        value = value.item()
    return apply(
        lambda out: Full(out=out, shape=dims, dtype=dtype, value=scalar_from_python(value)),
        device=device,
    )


def arange(start: int | float, stop: int | float | None, step: int | float, dtype: DType | None,
           device: Device) -> RemoteArray:  # fmt: skip
    if stop is None:
        start, stop = 0, start
    if dtype is None:
        ints = all(isinstance(v, int) for v in (start, stop, step))
        dtype = "int64" if ints else "float64"
    resolved: DType = dtype
    return apply(
        lambda out: Arange(out=out, start=start, stop=stop, step=step, dtype=resolved),
        device=device,
    )


def eye(n_rows: int, n_cols: int | None, k: int, dtype: DType, device: Device) -> RemoteArray:
    n_rows, k = operator.index(n_rows), operator.index(k)
    cols = n_rows if n_cols is None else operator.index(n_cols)
    return apply(
        lambda out: Eye(out=out, n_rows=n_rows, n_cols=cols, k=k, dtype=dtype), device=device
    )


# --- element-wise -----------------------------------------------------------------------------


def scalar_dtype(value: PyScalar, dtype: DType) -> DType:
    """The dtype a Python scalar takes beside an array of ``dtype`` (the standard's rule, and
    numpy 2's "weak scalar" promotion): the array's dtype when the scalar's kind fits in it,
    else the default dtype of the scalar's kind.
    """
    if isinstance(value, bool):
        return dtype
    if isinstance(value, int):
        return "int64" if is_bool(dtype) else dtype
    if isinstance(value, float):
        return dtype if is_floating(dtype) or is_complex(dtype) else "float64"
    if is_complex(dtype):
        return dtype
    return "complex64" if dtype == "float32" else "complex128"


def operand(value: Any, like: RemoteArray) -> RemoteArray | None:
    """``value`` as an array on ``like``'s device, or None if it cannot take part in an op."""
    if isinstance(value, RemoteArray):
        return value
    if isinstance(value, np.generic):
        value = np.asarray(value)
    if isinstance(value, np.ndarray):
        return upload(value, like.device)
    if isinstance(value, bool | int | float | complex):
        return full((), value, scalar_dtype(value, like.wire_dtype), like.device)
    return None


def binary(name: BinaryName, x1: RemoteArray, x2: RemoteArray) -> RemoteArray:
    return apply(lambda out: Binary(op=name, out=out, x1=x1.tensor_id, x2=x2.tensor_id), x1, x2)


def binary_operator(
    name: BinaryName, self: RemoteArray, other: Any, reflected: bool
) -> RemoteArray:
    other_array = operand(other, self)
    if other_array is None:
        result: RemoteArray = NotImplemented  # Python then tries the other operand
        return result
    return binary(name, other_array, self) if reflected else binary(name, self, other_array)


def binary_function(name: BinaryName, x1: Any, x2: Any) -> RemoteArray:
    """A namespace binary function: at least one argument must be an array."""
    if not isinstance(x1, RemoteArray):
        if not isinstance(x2, RemoteArray):
            raise TypeError(f"{name} needs at least one array argument")
        return binary_operator(name, x2, x1, reflected=True)
    array = operand(x2, x1)
    if array is None:
        raise TypeError(f"{name} does not take {type(x2).__name__}")
    return binary(name, x1, array)


def unary(name: UnaryName, x: RemoteArray) -> RemoteArray:
    return apply(lambda out: Unary(op=name, out=out, x=x.tensor_id), x)


def negative(x: RemoteArray) -> RemoteArray:
    return unary("negative", x)


def positive(x: RemoteArray) -> RemoteArray:
    return unary("positive", x)


def abs(x: RemoteArray) -> RemoteArray:  # noqa: A001 - the standard's name
    return unary("abs", x)


def bitwise_invert(x: RemoteArray) -> RemoteArray:
    return unary("bitwise_invert", x)


def where(condition: RemoteArray, x1: Any, x2: Any) -> RemoteArray:
    like = x1 if isinstance(x1, RemoteArray) else x2 if isinstance(x2, RemoteArray) else None
    if like is None:  # two Python scalars: the default dtype of their common kind
        dtype = from_numpy(np.result_type(wire_dtype(default_dtype(x1)), default_dtype(x2)))
        a: RemoteArray | None = full((), x1, dtype, condition.device)
        b: RemoteArray | None = full((), x2, dtype, condition.device)
    else:
        a, b = operand(x1, like), operand(x2, like)
    if a is None or b is None:
        raise TypeError("where takes arrays or Python scalars")
    return apply(
        lambda out: Where(out=out, condition=condition.tensor_id, x1=a.tensor_id, x2=b.tensor_id),
        condition,
        a,
        b,
    )


def astype(x: RemoteArray, dtype: Any) -> RemoteArray:
    target = wire_dtype(dtype)
    return apply(lambda out: AsType(out=out, x=x.tensor_id, dtype=target), x)


# --- reductions -------------------------------------------------------------------------------


def _axes(axis: int | Sequence[int] | None) -> tuple[int, ...] | None:
    if axis is None:
        return None
    if isinstance(axis, int | np.integer):
        return (operator.index(axis),)
    return tuple(operator.index(a) for a in axis)


def reduce(name: ReduceName, x: RemoteArray, axis: int | Sequence[int] | None, keepdims: bool,
           dtype: Any = None, correction: float = 0.0) -> RemoteArray:  # fmt: skip
    if dtype is not None:
        x = astype(x, dtype)
    axes = _axes(axis)
    result = apply(
        lambda out: Reduce(
            op=name, out=out, x=x.tensor_id, axis=axes, keepdims=keepdims, correction=correction
        ),
        x,
    )
    if dtype is not None and result.dtype != np.dtype(dtype):
        result = astype(result, dtype)
    return result


# --- manipulation and indexing ----------------------------------------------------------------


def reshape(x: RemoteArray, shape: Sequence[int]) -> RemoteArray:
    dims = tuple(operator.index(d) for d in shape)
    return apply(lambda out: Reshape(out=out, x=x.tensor_id, shape=dims), x)


def permute_dims(x: RemoteArray, axes: Sequence[int]) -> RemoteArray:
    order = tuple(operator.index(a) for a in axes)
    return apply(lambda out: PermuteDims(out=out, x=x.tensor_id, axes=order), x)


def matrix_transpose(x: RemoteArray) -> RemoteArray:
    if x.ndim < 2:
        raise ValueError(f"matrix_transpose needs at least 2 dimensions, not {x.ndim}")
    axes = list(range(x.ndim))
    axes[-2], axes[-1] = axes[-1], axes[-2]
    return permute_dims(x, axes)


def _index_item(item: Any, x: RemoteArray, arrays: list[RemoteArray]) -> IndexItem:
    if item is None:
        return None
    if item is Ellipsis:
        return "..."
    if isinstance(item, slice):
        parts = [
            None if v is None else operator.index(v) for v in (item.start, item.stop, item.step)
        ]
        return SliceSpec(start=parts[0], stop=parts[1], step=parts[2])
    if isinstance(item, bool | np.bool_ | list | np.ndarray | RemoteArray):
        array = item if isinstance(item, RemoteArray) else upload(np.asarray(item), x.device)
        if array.device is not x.device:
            raise ValueError("an index array must be on the indexed array's device")
        arrays.append(array)
        return ArrayIndex(tensor=array.tensor_id)
    return operator.index(item)


def _key(x: RemoteArray, key: Any) -> tuple[tuple[IndexItem, ...], list[RemoteArray]]:
    items = key if isinstance(key, tuple) else (key,)
    arrays: list[RemoteArray] = []
    index = tuple(_index_item(k, x, arrays) for k in items)
    assert key_tensors(index) == tuple(a.tensor_id for a in arrays)
    return index, arrays


def getitem(x: RemoteArray, key: Any) -> RemoteArray:
    index, arrays = _key(x, key)
    return apply(lambda out: GetItem(out=out, x=x.tensor_id, key=index), x, *arrays)


def setitem(x: RemoteArray, key: Any, value: Any) -> None:
    """``x[key] = value`` as an in-place op: ``x`` keeps its id; nothing travels back."""
    index, arrays = _key(x, key)
    if isinstance(value, RemoteArray):
        if value.wire_dtype != x.wire_dtype:
            value = astype(value, x.dtype)
    else:
        value_array = operand(value, x)
        if value_array is None:
            raise TypeError(f"cannot assign {type(value).__name__} to an array")
        value = (
            value_array if value_array.wire_dtype == x.wire_dtype else astype(value_array, x.dtype)
        )
    v = value
    apply_inplace(lambda out: SetItem(out=out, key=index, value=v.tensor_id), x, v, *arrays)


def inplace_operator(name: BinaryName, self: RemoteArray, other: Any) -> RemoteArray:
    """``self op= other``: computes ``self op other``, then stores it under ``self``'s id.

    Raises:
        ValueError: the result would not have ``self``'s shape.
        TypeError: the result's dtype cannot be cast back to ``self``'s (int ``/=``, ...).
    """
    result = binary_operator(name, self, other, reflected=False)
    if result is NotImplemented:
        return NotImplemented  # type: ignore[no-any-return]
    if result.shape != self.shape:
        raise ValueError(f"in-place {name} would change the shape {self.shape} to {result.shape}")
    if result.wire_dtype != self.wire_dtype:
        if not np.can_cast(result.dtype, self.dtype, casting="same_kind"):
            raise TypeError(f"in-place {name} cannot store {result.dtype} into {self.dtype}")
        result = astype(result, self.dtype)
    r = result
    return apply_inplace(lambda out: SetItem(out=out, key=("...",), value=r.tensor_id), self, r)
