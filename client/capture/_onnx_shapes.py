"""The ONNX counterparts of the ops that move elements rather than compute them: manipulation,
indexing, sorting and cumulative sums; and of the creation ops, which become constants (see
:mod:`client.capture._onnx_ops` for the element-wise ops, and :mod:`._onnx_builder` for the
builder they share).

Shapes are static in a graph (``check_graph`` refuses data-dependent ones), so every shape,
axis and index these ops take is a constant here, computed the way numpy computes it; except,
in an export with a dynamic batch, a shape or an index that holds the batch, read at run time
(``Export.shape``, and :mod:`._onnx_batch`, which says where the batch is).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from protocol.dtypes import is_integer, to_numpy
from protocol.ops import (
    Arange,
    ArrayIndex,
    Axes,
    BroadcastTo,
    Cumulative,
    Eye,
    Full,
    GetItem,
    Join,
    Linspace,
    MoveAxis,
    PermuteDims,
    Repeat,
    Reshape,
    Roll,
    SetItem,
    SliceSpec,
    Sort,
    Take,
    Tile,
    Triangle,
)
from protocol.ops.indexing import expand_key, numpy_key
from protocol.scalars import scalar_to_python

from ._onnx_builder import INT64_MIN, Batch, Converter, Export, NoCounterpart, batch_bounds

if TYPE_CHECKING:
    from onnx import TensorProto


def _shape_of(ex: Export, tensor_id: int) -> tuple[int, ...]:
    return ex.metas[tensor_id].shape


# --- manipulation -----------------------------------------------------------------------------


def reshape(ex: Export, op: Reshape) -> None:
    # the inferred shape, with -1 resolved; allowzero: a 0 is a 0, as in numpy, not "keep"
    shape = ex.shape_of(op.out)
    ex.names[op.out] = ex.node("Reshape", [ex.value(op.x), shape], allowzero=1)


def permute_dims(ex: Export, op: PermuteDims) -> None:
    ndim = len(op.axes)
    perm = [a % ndim for a in op.axes]
    ex.names[op.out] = ex.node("Transpose", [ex.value(op.x)], perm=perm)


def moveaxis(ex: Export, op: MoveAxis) -> None:
    order = moveaxis_order(op, len(_shape_of(ex, op.x)))
    ex.names[op.out] = ex.node("Transpose", [ex.value(op.x)], perm=order)


def moveaxis_order(op: MoveAxis, ndim: int) -> list[int]:
    """The input axis each output axis of ``op`` is."""
    source, destination = [a % ndim for a in op.source], [a % ndim for a in op.destination]
    order = [a for a in range(ndim) if a not in source]
    for d, s in sorted(zip(destination, source, strict=True)):
        order.insert(d, s)
    return order


def join(ex: Export, op: Join) -> None:
    dtype = ex.metas[op.out].dtype
    values = [ex.cast(ex.value(i), ex.metas[i].dtype, dtype) for i in op.xs]
    if op.op == "stack":
        axis = (op.axis or 0) % len(_shape_of(ex, op.out))
        values = [ex.node("Unsqueeze", [v, ex.ints([axis])]) for v in values]
    elif op.axis is None:  # concat of the flattened arrays
        axis = 0
        values = [ex.node("Reshape", [v, ex.ints([-1])]) for v in values]
    else:
        axis = op.axis % len(_shape_of(ex, op.out))
    ex.names[op.out] = ex.node("Concat", values, axis=axis)


def axes(ex: Export, op: Axes) -> None:
    x, ndim = ex.value(op.x), len(_shape_of(ex, op.x))
    if op.op == "expand_dims":
        out_ndim = len(_shape_of(ex, op.out))
        assert op.axis is not None  # the inference rule refuses expand_dims without axes
        ex.names[op.out] = ex.node("Unsqueeze", [x, ex.ints([a % out_ndim for a in op.axis])])
    elif op.op == "squeeze":
        assert op.axis is not None
        ex.names[op.out] = ex.node("Squeeze", [x, ex.ints([a % ndim for a in op.axis])])
    else:
        flipped = sorted(range(ndim) if op.axis is None else {a % ndim for a in op.axis})
        ex.names[op.out] = _flip(ex, x, flipped)


def _flip(ex: Export, x: str, flipped: list[int]) -> str:
    if not flipped:
        return ex.node("Identity", [x])
    n = len(flipped)
    starts, ends, steps = ex.ints([-1] * n), ex.ints([INT64_MIN] * n), ex.ints([-1] * n)
    return ex.node("Slice", [x, starts, ends, ex.ints(flipped), steps])


def roll(ex: Export, op: Roll) -> None:
    """numpy's roll: the last ``shift`` elements of each axis first (axis None: of the flattened
    array, reshaped back)."""
    shape = _shape_of(ex, op.x)
    x = ex.value(op.x)
    if op.axis is None:
        shifts = {0: op.shift[0]}
        x = ex.node("Reshape", [x, ex.ints([-1])])
        sizes = [int(np.prod(shape))]
    else:
        shifts = {}
        per_axis = op.shift * len(op.axis) if len(op.shift) == 1 else op.shift
        for a, s in zip(op.axis, per_axis, strict=True):
            shifts[a % len(shape)] = shifts.get(a % len(shape), 0) + s  # numpy adds repeats
        sizes = list(shape)
    for axis, shift in shifts.items():
        n = sizes[axis]
        if n and shift % n:
            cut = n - shift % n
            head = ex.node("Slice", [x, ex.ints([0]), ex.ints([cut]), ex.ints([axis])])
            tail = ex.node("Slice", [x, ex.ints([cut]), ex.ints([n]), ex.ints([axis])])
            x = ex.node("Concat", [tail, head], axis=axis)
    if op.axis is None:
        x = ex.node("Reshape", [x, ex.ints(shape)], allowzero=1)
    ex.names[op.out] = x if x != ex.value(op.x) else ex.node("Identity", [x])


def broadcast_to(ex: Export, op: BroadcastTo) -> None:
    ex.names[op.out] = ex.node("Expand", [ex.value(op.x), ex.shape_of(op.out)])


def tile(ex: Export, op: Tile) -> None:
    shape = _shape_of(ex, op.x)
    ndim = max(len(shape), len(op.reps))
    x = ex.value(op.x)
    if len(shape) < ndim:  # numpy prepends 1s to the shorter of the shape and the reps
        x = ex.node("Unsqueeze", [x, ex.ints(range(ndim - len(shape)))])
    reps = (1,) * (ndim - len(op.reps)) + op.reps
    ex.names[op.out] = ex.node("Tile", [x, ex.ints(reps)])


def repeat(ex: Export, op: Repeat) -> None:
    """Each element ``repeats`` times in a row: a new axis after ``axis``, expanded, merged."""
    if op.repeats is None:
        raise NoCounterpart("no counterpart for repeats given as a tensor")
    x, shape = ex.value(op.x), _shape_of(ex, op.x)
    if op.axis is None:
        x, shape = ex.node("Reshape", [x, ex.ints([-1])]), (int(np.prod(shape)),)
    axis = (op.axis or 0) % len(shape)
    wide = ex.node("Unsqueeze", [x, ex.ints([axis + 1])])
    # Expand broadcasts its input's dimensions against the 1s: only the new axis is a size
    target = (1,) * (axis + 1) + (op.repeats,) + (1,) * (len(shape) - axis - 1)
    expanded = ex.node("Expand", [wide, ex.ints(target)])
    ex.names[op.out] = ex.node("Reshape", [expanded, ex.shape_of(op.out)], allowzero=1)


def triangle(ex: Export, op: Triangle) -> None:
    upper = int(op.op == "triu")
    ex.names[op.out] = ex.node("Trilu", [ex.value(op.x), _int64(ex, op.k)], upper=upper)


# --- indexing ---------------------------------------------------------------------------------


def getitem(ex: Export, op: GetItem) -> None:
    if any(isinstance(k, ArrayIndex) for k in op.key):
        ex.names[op.out] = _gather_one_index(ex, op)
    else:
        ex.names[op.out] = _basic_index(ex, ex.value(op.x), _shape_of(ex, op.x), op)


def _basic_index(ex: Export, x: str, shape: tuple[int, ...], op: GetItem) -> str:
    """Integers and slices as one Slice (an integer is a slice of one, squeezed after), then the
    new axes (``None``) inserted where they stand in the result."""
    batch_axis = ex.batch[op.x].axis if op.x in ex.batch else -1
    starts: list[int] = []
    ends: list[int] = []
    steps: list[int] = []
    sliced: list[int] = []
    squeezed: list[int] = []
    new_axes: list[int] = []
    dim = kept = 0  # the next dimension of x; the number of the result's dimensions so far
    for item in expand_key(op.key, len(shape)):
        if item is None:
            new_axes.append(kept)
            kept += 1
            continue
        if dim == batch_axis:  # the batch rule (_onnx_batch) refused those with no bounds
            assert isinstance(item, int | SliceSpec)
            bounds = batch_bounds(item, shape[dim])
            assert bounds is not None
            start, stop, step = bounds
            kept += isinstance(item, SliceSpec)
            if isinstance(item, int):
                squeezed.append(dim)
            elif step == 1:
                dim += 1
                continue
        elif isinstance(item, SliceSpec):
            start, stop, step = item.to_slice().indices(shape[dim])
            kept += 1
            if (start, stop, step) == (0, shape[dim], 1):
                dim += 1
                continue
            if step < 0 and stop < 0:  # before index 0: ONNX would read -1 as the last one
                stop = INT64_MIN
        else:
            assert isinstance(item, int)  # an ArrayIndex goes to _gather_one_index
            start, stop, step = item % shape[dim], item % shape[dim] + 1, 1
            squeezed.append(dim)
        starts, ends, steps = [*starts, start], [*ends, stop], [*steps, step]
        sliced.append(dim)
        dim += 1
    if sliced:
        x = ex.node("Slice", [x, ex.ints(starts), ex.ints(ends), ex.ints(sliced), ex.ints(steps)])
    if squeezed:
        x = ex.node("Squeeze", [x, ex.ints(squeezed)])
    if new_axes:
        x = ex.node("Unsqueeze", [x, ex.ints(new_axes)])
    return x if sliced or squeezed or new_axes else ex.node("Identity", [x])


def _gather_one_index(ex: Export, op: GetItem) -> str:
    """``x[..., i, ...]`` with one integer index array and full slices elsewhere: Gather."""
    shape = _shape_of(ex, op.x)
    key = expand_key(op.key, len(shape))
    arrays = [d for d, k in enumerate(key) if isinstance(k, ArrayIndex)]
    full = all(k == SliceSpec() for k in key if not isinstance(k, ArrayIndex))
    if len(arrays) != 1 or not full or len(key) != len(shape):
        raise NoCounterpart(
            "no counterpart for this index (one integer index array among "
            "full slices is what ONNX's Gather does)"
        )
    index = key[arrays[0]]
    assert isinstance(index, ArrayIndex)
    if not is_integer(ex.metas[index.tensor].dtype):
        raise NoCounterpart("no counterpart for a boolean index")
    indices = ex.cast(ex.value(index.tensor), ex.metas[index.tensor].dtype, "int64")
    return ex.node("Gather", [ex.value(op.x), indices], axis=arrays[0])


def setitem(ex: Export, op: SetItem) -> None:
    """``x[key] = value`` with a basic key, as a scatter into the flattened ``x``: the flat
    positions ``key`` selects are a constant (numpy picks them from ``arange``), the value is
    broadcast to the selection's shape."""
    if any(isinstance(k, ArrayIndex) for k in op.key):
        raise NoCounterpart("no counterpart for an assignment through an index array")
    shape = _shape_of(ex, op.out)
    positions = np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape)
    selected = np.asarray(positions[numpy_key(op.key, ())])
    flat = ex.node("Reshape", [ex.value(op.out), ex.ints([-1])])
    value = ex.node("Expand", [ex.value(op.value), ex.ints(selected.shape)])
    updates = ex.node("Reshape", [value, ex.ints([-1])])
    scattered = ex.node("ScatterND", [flat, ex.constant(selected.reshape(-1, 1)), updates])
    ex.names[op.out] = ex.node("Reshape", [scattered, ex.ints(shape)], allowzero=1)


def take(ex: Export, op: Take) -> None:
    x, indices = ex.value(op.x), ex.value(op.indices)
    indices = ex.cast(indices, ex.metas[op.indices].dtype, "int64")
    axis = op.axis % len(_shape_of(ex, op.x))
    if op.op == "take":
        ex.names[op.out] = ex.node("Gather", [x, indices], axis=axis)
        return
    # take_along_axis broadcasts x and the indices off the axis; GatherElements does not
    out_shape = _shape_of(ex, op.out)
    for name, shape in (("x", _shape_of(ex, op.x)), ("i", _shape_of(ex, op.indices))):
        target = tuple(shape[d] if d == axis else n for d, n in enumerate(out_shape))
        if target != shape:
            # Expand broadcasts against a 1: the axis keeps its own size, the others grow
            spread = tuple(1 if d == axis else n for d, n in enumerate(target))
            batch = ex.batch.get(op.out)
            size = ex.shape(spread, batch if batch and batch.axis != axis else None)
            expanded = ex.node("Expand", [x if name == "x" else indices, size])
            x, indices = (expanded, indices) if name == "x" else (x, expanded)
    ex.names[op.out] = ex.node("GatherElements", [x, indices], axis=axis)


# --- creation: a constant, made as numpy makes it (server/executor/creation.py) ---------------


def full(ex: Export, op: Full) -> None:
    value = np.asarray(scalar_to_python(op.value), dtype=to_numpy(op.dtype))
    if op.dtype.startswith("complex"):
        ex.names[op.out] = ex.constant(np.full(op.shape, value))
        return
    ex.names[op.out] = ex.node(
        "ConstantOfShape", [ex.ints(op.shape)], value=_tensor(value.reshape(1))
    )


def _tensor(array: np.ndarray[Any, Any]) -> TensorProto:
    from onnx import numpy_helper

    return numpy_helper.from_array(array)


def arange(ex: Export, op: Arange) -> None:
    dtype = to_numpy(op.dtype)
    if op.length() == 0:
        values = np.empty((0,), dtype=dtype)
    else:
        values = np.arange(op.start, op.stop, op.step).astype(dtype, copy=False)
    ex.names[op.out] = ex.constant(values)


def eye(ex: Export, op: Eye) -> None:
    ex.names[op.out] = ex.constant(np.eye(op.n_rows, op.n_cols, k=op.k, dtype=to_numpy(op.dtype)))


def linspace(ex: Export, op: Linspace) -> None:
    if op.dtype.startswith("complex"):
        raise NoCounterpart("no counterpart for complex values")
    values = np.linspace(op.start, op.stop, op.num, endpoint=op.endpoint, dtype=to_numpy(op.dtype))
    ex.names[op.out] = ex.constant(values)


# --- sorting and cumulative sums --------------------------------------------------------------


def sort(ex: Export, op: Sort) -> None:
    """TopK of the whole axis. ONNX breaks ties by the lower index first, ascending or
    descending, which is what the server's stable sorts give (and one of the orders an
    unstable one may)."""
    shape = _shape_of(ex, op.x)
    axis = op.axis % len(shape)
    batch = ex.batch.get(op.x)
    k = ex.shape([shape[axis]], Batch(0, batch.factor) if batch and batch.axis == axis else None)
    values, indices = ex.node_outputs(
        "TopK", [ex.value(op.x), k], 2, axis=axis, largest=int(op.descending), sorted=1
    )
    ex.names[op.out] = values if op.op == "sort" else indices


def cumulative(ex: Export, op: Cumulative) -> None:
    if op.op != "cumulative_sum":
        raise NoCounterpart("no counterpart")
    out = ex.metas[op.out]
    axis = (op.axis or 0) % len(out.shape)
    x = ex.cast(ex.value(op.x), ex.metas[op.x].dtype, out.dtype)
    total = ex.node("CumSum", [x, _int64(ex, axis)])
    if op.include_initial:
        zeros_shape = tuple(1 if d == axis else n for d, n in enumerate(out.shape))
        zero = _tensor(np.zeros(1, dtype=to_numpy(out.dtype)))
        shape = ex.shape(zeros_shape, ex.batch.get(op.out))
        zeros = ex.node("ConstantOfShape", [shape], value=zero)
        total = ex.node("Concat", [zeros, total], axis=axis)
    ex.names[op.out] = total


def _int64(ex: Export, value: int) -> str:
    """A 0-d int64 initializer: Trilu's k and CumSum's axis are scalars, not lists."""
    return ex.constant(np.asarray(value, dtype=np.int64))


SHAPES: dict[type, Converter] = {
    Reshape: reshape,
    PermuteDims: permute_dims,
    MoveAxis: moveaxis,
    Join: join,
    Axes: axes,
    Roll: roll,
    BroadcastTo: broadcast_to,
    Tile: tile,
    Repeat: repeat,
    Triangle: triangle,
    GetItem: getitem,
    SetItem: setitem,
    Take: take,
    Sort: sort,
    Cumulative: cumulative,
    Full: full,
    Arange: arange,
    Eye: eye,
    Linspace: linspace,
}
