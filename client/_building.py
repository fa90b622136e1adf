"""Building ops: take an output id, check the op locally, queue it, return the output handle.

Every op of the client goes through :func:`apply` (one output), :func:`apply_many` (several,
or a data-dependent shape, which costs one round trip), :func:`apply_inplace` (the target keeps
its id), :func:`upload` (local bytes) or :func:`full`. The protocol's inference rule runs here,
so a shape or dtype error is raised before anything is sent (ARCHITECTURE.md, invariant 3).
Handles are made through :func:`client.device.new_handle`, whose type ``client.array``
registers: this module sits below the array type it returns.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from pydantic import ValidationError

from protocol import DType, OpArgumentError, TensorMeta, from_numpy
from protocol.codec import byte_view
from protocol.ops import UNKNOWN, AnyOp, FromBuffer, Full, GetItem
from protocol.scalars import PyScalar, scalar_from_python

from ._deriving import (
    WATCHED_OPS,
    derive,
    learn_masked,
    masked_meta,
    note_condition,
    single_mask,
)
from ._handle import common_device, ints
from ._known import FRESH_OPS, VALUES_KEPT, fresh
from .device import Device, new_handle

if TYPE_CHECKING:
    from .array import RemoteArray


def apply(
    make: Callable[[int], AnyOp], *inputs: RemoteArray, device: Device | None = None
) -> RemoteArray:
    """Build ``make(out)``, check it locally, queue it and return the output handle.

    :func:`apply_many` for one output, without its generality on the hot path (a
    data-dependent output takes :func:`apply_many`'s round trip).
    """
    dev = device if device is not None else common_device(inputs)
    out = dev.new_id()
    op = built(make, out)
    metas = op.infer_all(*[a.meta for a in inputs])
    mask = single_mask(op, inputs) if len(metas) == 1 and UNKNOWN in metas[0].shape else None
    if mask is not None:  # x[mask]: its length is the mask's count, if that is known
        metas = (masked_meta(dev.known, metas[0], mask),)
    if len(metas) == 1 and UNKNOWN not in metas[0].shape:
        dev.submit(op)
        handle = new_handle(dev, out, metas[0])
        kind = type(op)  # what follows costs no call for most ops
        if inputs and kind not in FRESH_OPS and not fresh(op):
            handle._base = viewed_base(op, inputs)
        meta = metas[0]
        facts = dev.known.facts  # what is known of its (first) input, else nothing to derive
        if (inputs and inputs[0]._id in facts) or not meta.shape or kind in WATCHED_OPS:
            derive(dev.known, op, handle, inputs)
        if meta.dtype == "bool" and meta.shape and handle._base == out:
            note_condition(dev.known, handle)
        return handle
    handle = _queue(dev, op, [out], metas, inputs)[0]
    if mask is not None:
        learn_masked(dev.known, metas[0], handle, mask)
    return handle


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
    ids = [dev.new_id() for _ in range(count)]
    op = built(make, ids[0], tuple(ids[1:]))
    return _queue(dev, op, ids, op.infer_all(*[a.meta for a in inputs]), inputs)


def viewed_base(op: AnyOp, inputs: Sequence[RemoteArray]) -> int:
    """The memory an output of ``op`` (not a fresh-memory op) may view: its first input's (the
    indexed array's, for indexing), or any of its inputs' (-1) when it has several."""
    if len(inputs) == 1 or type(op) is GetItem:
        return inputs[0]._base
    return -1


def built(make: Callable[..., AnyOp], *ids: Any) -> AnyOp:
    """``make(*ids)``, the op's wire model, which validates what the user passed into it.

    Raises:
        OpArgumentError: an argument the model cannot carry (an array where a scalar goes,
            a string for a number), in place of the model's own validation error.
    """
    try:
        return make(*ids)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"][:1])
        got = type(first["input"]).__name__
        raise OpArgumentError(
            f"{exc.title}{'.' + where if where else ''}: {first['msg']}, not {got}"
        ) from None


def _queue(
    dev: Device,
    op: AnyOp,
    ids: list[int],
    metas: tuple[TensorMeta, ...],
    inputs: Sequence[RemoteArray],
) -> tuple[RemoteArray, ...]:
    """Queue the checked ``op``, whose outputs ``ids`` have ``metas``; their handles."""
    dev.submit(op)
    unknown = [i for i, meta in enumerate(metas) if UNKNOWN in meta.shape]
    if unknown:  # one round trip for all of them
        try:
            described = dev.describe([ids[i] for i in unknown])
        except BaseException:
            for tensor_id in ids:  # no handle will own them: free the failed outputs
                dev.release(tensor_id)
            raise
        learnt = dict(zip(unknown, described, strict=True))
        metas = tuple(learnt.get(i, meta) for i, meta in enumerate(metas))
    handles = tuple(new_handle(dev, i, meta) for i, meta in zip(ids, metas, strict=True))
    if inputs and not fresh(op):
        for handle in handles:
            handle._base = viewed_base(op, inputs)
    return handles


def apply_inplace(
    make: Callable[[int], AnyOp], target: RemoteArray, *inputs: RemoteArray
) -> RemoteArray:
    """Queue the in-place op ``make(target id)``, whose inputs are ``target`` then ``inputs``;
    ``target`` keeps its id, shape and dtype. Returns ``target``."""
    common_device((target, *inputs))
    op = built(make, target.tensor_id)
    op.infer_all(target.meta, *(a.meta for a in inputs))
    device = target.device
    device.known.wrote(target._base)
    device.submit(op)
    if device.origins.on:
        device.origins.note(op.out)  # what the target holds now was made here
    return target


def upload(values: np.ndarray[Any, Any], device: Device) -> RemoteArray:
    """Copy a local numpy array to ``device`` (raw bytes, little-endian, C order)."""
    dtype = from_numpy(values.dtype)
    # Note: not np.ascontiguousarray, which turns a 0-d array into a 1-d one
    values = np.asarray(values, dtype=values.dtype.newbyteorder("<"), order="C")
    shape = values.shape
    out = device.new_id()
    device.submit_upload(
        lambda buffer: FromBuffer(out=out, shape=shape, dtype=dtype, buffer=buffer),
        byte_view(values),
    )
    handle = new_handle(device, out, TensorMeta(shape, dtype))
    if values.nbytes <= VALUES_KEPT:  # known once the server is known to hold it
        kept = values.copy()
        kept.flags.writeable = False
        device.known.learn(handle, values=kept, uploaded=True)
    return handle


def full(shape: int | Sequence[int], value: PyScalar, dtype: DType, device: Device) -> RemoteArray:
    """An array of ``shape`` filled with ``value``."""
    dims = ints(shape)
    if isinstance(value, np.generic):
        value = value.item()
    return apply(
        lambda out: Full(out=out, shape=dims, dtype=dtype, value=scalar_from_python(value)),
        device=device,
    )
