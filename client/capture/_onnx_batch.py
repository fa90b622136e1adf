"""Where the batch is, op by op, in an ONNX export with a dynamic batch
(``to_onnx(..., dynamic_batch=...)``), and what such an export refuses.

Theory of operation. Dimension 0 of the batch inputs holds the batch, of the size B recorded
(at least 2: a batch of 1 cannot be told from the other dimensions of 1). Before each op is
converted, its rule here says where the batch is in its output (a :class:`Batch`: an axis,
and a factor where a reshape merged the batch with the dimensions after it, as an embedding's
lookup of (B, T) indices as B * T rows does), from where it is in the op's inputs; the
converters then make every shape that holds the batch a value computed at run time
(``Export.shape``) instead of a constant. A rule refuses (:class:`BatchDependent`, which the
exporter raises as a ``DynamicBatchError`` naming the op) what no such shape expresses: an op
that splits the batch, merges it with the dimensions before it or takes part of it; one that
computes with its size (a variance over the batch divides by it); and, where a batched array
meets one that is not, a broadcast against the batch's axis of a size other than 1: that is an
array made for one batch size (a constant, ``zeros((B, n))``, an input not declared batched),
which the refusal names.

A Python number computed from the batch's size (``total / x.shape[0]``) is frozen into the
graph as any Python value is, and nothing here can see it: use the array functions (``mean``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from protocol import ops
from protocol.graphs import GraphDef
from protocol.ops import AnyOp, ArrayIndex, SliceSpec, TensorMeta
from protocol.ops.indexing import expand_key

from ._onnx_builder import Batch, batch_bounds
from ._onnx_shapes import moveaxis_order

BATCH = "batch"  # the symbolic dimension's name in the model's inputs and outputs


class BatchDependent(Exception):
    """The op bakes the batch's size in where no run-time shape can stand for it; the message
    says how."""


class BatchTrace:
    """Where the batch is in each tensor of ``graph``, op by op (the module docstring)."""

    def __init__(self, graph: GraphDef, metas: dict[int, TensorMeta], names: Sequence[str]):
        self.metas = metas
        self.batch: dict[int, Batch] = {}
        self.made_by = {t.id: f"input {t.name!r}" for t in graph.inputs}
        self.made_by |= {c.id: "a constant" for c in graph.constants}
        inputs = {t.name: t for t in graph.inputs}
        if not names:
            raise BatchDependent("the graph has no input to hold the batch")
        for name in names:
            tensor = inputs.get(name)
            if tensor is None:
                raise BatchDependent(f"the graph has no input {name!r}")
            if not tensor.shape:
                raise BatchDependent(f"input {name!r} is 0-dimensional: it has no batch axis")
            self.batch[tensor.id] = Batch(0)
        first = inputs[names[0]]
        self.source = first.name  # the input the batch's size is read from
        self.size = first.shape[0]
        for name in names:
            if inputs[name].shape[0] != self.size:
                raise BatchDependent(
                    f"inputs {first.name!r} and {name!r} were recorded with batches of "
                    f"{self.size} and {inputs[name].shape[0]}"
                )
        if self.size < 2:
            raise BatchDependent(
                f"input {first.name!r} was recorded with a batch of {self.size}: record it "
                "with a batch of 2 or more, so that the batch is told from the dimensions of 1"
            )

    def step(self, index: int, op: AnyOp) -> None:
        """Where the batch is in ``op``'s output, from its rule.

        Raises:
            BatchDependent: the rule refuses the op.
        """
        out = RULES[type(op)](self, op)
        if op.inplace:
            return
        self.made_by[op.out] = f"made by op {index}, {op.name()}"
        if out is not None:
            self.batch[op.out] = out

    def shape(self, tensor_id: int) -> tuple[int, ...]:
        return self.metas[tensor_id].shape

    def ndim(self, tensor_id: int) -> int:
        return len(self.metas[tensor_id].shape)

    def operands(self, *ids: int) -> list[tuple[int, Batch | None]]:
        return [(i, self.batch.get(i)) for i in ids]

    def fits(self, tensor_id: int, axis: int) -> None:
        """Refuse ``tensor_id``, which does not hold the batch, broadcast against the batch
        along its ``axis`` (negative: it has none there), unless its size there is 1."""
        shape = self.shape(tensor_id)
        if axis >= 0 and shape[axis] != 1:
            raise BatchDependent(
                f"it broadcasts #{tensor_id} ({self.made_by[tensor_id]}, shape {shape}), which "
                f"does not hold the batch, against the batch along its axis {axis}, of fixed "
                f"size {shape[axis]}: an array made for one batch size (declare the input "
                "batched, or make the array from the batch's own arrays, as zeros_like does)"
            )

    def regrouped(self, batch: Batch, before: tuple[int, ...], after: tuple[int, ...]) -> Batch:
        """Where ``batch`` is once ``before`` is reshaped to ``after``: in the axis after
        as many elements as preceded it, if that axis holds a multiple of B elements (each
        batch element's block is then whole and in order in it)."""
        lead = math.prod(before[: batch.axis])
        run = 1
        for axis, size in enumerate(after):
            if run == lead and size >= self.size and size % self.size == 0:
                return Batch(axis, size // self.size)
            run *= size
        raise BatchDependent(
            f"it reshapes {before} to {after}, splitting the batch's axis {batch.axis} or "
            "merging it with the axes before it: no axis of the result holds the batch whole"
        )


Rule = Callable[[BatchTrace, Any], Batch | None]


def _aligned(tr: BatchTrace, operands: list[tuple[int, Batch | None]], ndim: int) -> Batch | None:
    """Where the batch is in the broadcast of ``operands`` to ``ndim`` dimensions."""
    found: Batch | None = None
    for tensor_id, batch in operands:
        if batch is not None:
            at = Batch(batch.axis + ndim - tr.ndim(tensor_id), batch.factor)
            if found is not None and at != found:
                raise BatchDependent(
                    f"it broadcasts the batch of #{tensor_id} (axis {at.axis} of the result) "
                    f"against another's (axis {found.axis}): the result would hold it twice"
                )
            found = at
    if found is not None:
        for tensor_id, batch in operands:
            if batch is None:
                tr.fits(tensor_id, found.axis - (ndim - tr.ndim(tensor_id)))
    return found


def _same(tr: BatchTrace, op: Any) -> Batch | None:
    return tr.batch.get(op.inputs()[0])


def _none(tr: BatchTrace, op: Any) -> None:
    """A creation op, or one its converter refuses (training's): no batch."""


def _broadcast(tr: BatchTrace, op: Any) -> Batch | None:
    """An op that broadcasts its inputs to its output's shape (matmul: only their stacks)."""
    if isinstance(op, ops.Binary) and op.op == "matmul":
        return _matmul(tr, op)
    return _aligned(tr, tr.operands(*op.inputs()), tr.ndim(op.out))


def _matmul(tr: BatchTrace, op: ops.Binary) -> Batch | None:
    """numpy's matmul: the stacks broadcast, x1's last axis meets x2's second last (a 1-D x1
    is a row, a 1-D x2 a column). A batch on both met axes is summed away."""
    (x1, b1), (x2, b2) = tr.operands(op.x1, op.x2)
    n1, n2, n = tr.ndim(x1), tr.ndim(x2), tr.ndim(op.out)
    met = [b for b, axis in ((b1, n1 - 1), (b2, max(n2 - 2, 0))) if b and b.axis == axis]
    if met:
        if len(met) == 1 or met[0].factor != met[1].factor:
            raise BatchDependent("it contracts the batch with an axis of fixed size")
        return None  # summed over the batch
    stack = n - (n1 >= 2) - (n2 >= 2)  # the result's broadcast (stacked) axes
    found: list[tuple[int, Batch]] = []
    for tensor_id, batch, ndim, kept_at in ((x1, b1, n1, stack), (x2, b2, n2, n - 1)):
        if batch is not None:
            own = batch.axis == (ndim - 2 if tensor_id == x1 else ndim - 1)
            axis = kept_at if own else batch.axis + stack - (ndim - 2)
            found.append((tensor_id, Batch(axis, batch.factor)))
    if not found:
        return None
    if len(found) == 2 and found[0][1] != found[1][1]:
        raise BatchDependent("it multiplies two batched arrays into one holding the batch twice")
    at = found[0][1]
    if len(found) == 1 and at.axis < stack:  # a stacked batch meets the other's stack
        other = x2 if found[0][0] == x1 else x1
        other_stack = tr.ndim(other) - 2
        position = at.axis - (stack - other_stack)
        tr.fits(other, position if 0 <= position < other_stack else -1)
    return at


def _reduce(tr: BatchTrace, op: ops.Reduce) -> Batch | None:
    batch, ndim = tr.batch.get(op.x), tr.ndim(op.x)
    if batch is None:
        return None
    axes = set(range(ndim)) if op.axis is None else {a % ndim for a in op.axis}
    if batch.axis in axes:
        if op.op in ("var", "std"):
            raise BatchDependent(f"its {op.op} over the batch divides by the batch's size")
        return None
    if op.keepdims:
        return batch
    return Batch(batch.axis - sum(a < batch.axis for a in axes), batch.factor)


def _reshape(tr: BatchTrace, op: ops.Reshape) -> Batch | None:
    batch = tr.batch.get(op.x)
    return None if batch is None else tr.regrouped(batch, tr.shape(op.x), tr.shape(op.out))


def _permute(tr: BatchTrace, op: ops.PermuteDims | ops.MoveAxis) -> Batch | None:
    batch, ndim = tr.batch.get(op.x), tr.ndim(op.x)
    if batch is None:
        return None
    order = (
        [a % ndim for a in op.axes] if isinstance(op, ops.PermuteDims) else moveaxis_order(op, ndim)
    )
    return Batch(order.index(batch.axis), batch.factor)


def _join(tr: BatchTrace, op: ops.Join) -> Batch | None:
    operands = tr.operands(*op.xs)
    batched = [b for _, b in operands if b is not None]
    if not batched:
        return None
    first = batched[0]
    for tensor_id, batch in operands:
        if batch != first:
            raise BatchDependent(
                f"it joins #{tensor_id} ({tr.made_by[tensor_id]}), whose batch is not at "
                f"axis {first.axis} as the others' is"
            )
    if op.op == "stack":
        at = (op.axis or 0) % tr.ndim(op.out)
        return Batch(first.axis + (first.axis >= at), first.factor)
    if op.axis is None:
        raise BatchDependent("it flattens the batch into one axis with the other arrays")
    if first.axis == op.axis % tr.ndim(op.out):
        raise BatchDependent("it concatenates along the batch: the batches follow each other")
    return first


def _axes(tr: BatchTrace, op: ops.Axes) -> Batch | None:
    batch = tr.batch.get(op.x)
    if batch is None or op.op == "flip":
        return batch
    assert op.axis is not None  # the inference rule refuses expand_dims and squeeze without
    if op.op == "squeeze":  # a batch of 2 or more is never squeezed
        gone = {a % tr.ndim(op.x) for a in op.axis}
        return Batch(batch.axis - sum(a < batch.axis for a in gone), batch.factor)
    new = {a % tr.ndim(op.out) for a in op.axis}
    kept = [a for a in range(tr.ndim(op.out)) if a not in new]
    return Batch(kept[batch.axis], batch.factor)


def _roll(tr: BatchTrace, op: ops.Roll) -> Batch | None:
    batch, ndim = tr.batch.get(op.x), tr.ndim(op.x)
    rolled = range(ndim) if op.axis is None else {a % ndim for a in op.axis}  # None: flattened
    if batch is not None and batch.axis in rolled:
        raise BatchDependent("it rolls along the batch, by a shift modulo the batch's size")
    return batch


def _tile(tr: BatchTrace, op: ops.Tile) -> Batch | None:
    batch = tr.batch.get(op.x)
    if batch is None:
        return None
    ndim = tr.ndim(op.out)
    at = batch.axis + ndim - tr.ndim(op.x)
    reps = (1,) * (ndim - len(op.reps)) + op.reps
    if reps[at] != 1:
        raise BatchDependent(f"it tiles the batch {reps[at]} times: the copies follow each other")
    return Batch(at, batch.factor)


def _repeat(tr: BatchTrace, op: ops.Repeat) -> Batch | None:
    batch = tr.batch.get(op.x)
    if batch is None or op.repeats is None:  # repeats as a tensor: the converter refuses it
        return batch
    shape = tr.shape(op.x)
    if op.axis is None:
        batch, axis = tr.regrouped(batch, shape, (math.prod(shape),)), 0
    else:
        axis = op.axis % len(shape)
    return Batch(axis, batch.factor * op.repeats) if batch.axis == axis else batch


def _getitem(tr: BatchTrace, op: ops.GetItem) -> Batch | None:
    batch = tr.batch.get(op.x)
    key = expand_key(op.key, tr.ndim(op.x))
    arrays = [d for d, k in enumerate(key) if isinstance(k, ArrayIndex)]
    if arrays:
        index = key[arrays[0]]
        if len(arrays) != 1 or len(key) != tr.ndim(op.x) or not isinstance(index, ArrayIndex):
            return None  # the converter refuses what is not one index array among slices
        return _gathered(tr, batch, arrays[0], index.tensor)
    if batch is None:
        return None
    kept = dim = 0
    for item in key:
        if item is None:
            kept += 1
            continue
        assert isinstance(item, int | SliceSpec)
        if dim == batch.axis:
            if isinstance(item, int):
                if batch.factor == 1:  # one element of the batch: none left
                    return None
            elif batch_bounds(item, tr.shape(op.x)[dim]) is not None:
                return Batch(kept, batch.factor)
            raise BatchDependent(
                f"it takes part of the batch ({item if isinstance(item, int) else item.to_slice()}"
                f" of axis {dim}): its size would depend on the batch's"
            )
        kept += isinstance(item, SliceSpec)
        dim += 1
    raise AssertionError("an expanded key indexes every axis")


def _gathered(tr: BatchTrace, batch: Batch | None, axis: int, indices: int) -> Batch | None:
    """Where the batch is once ``indices`` are taken along ``axis`` of an array whose batch
    is ``batch``: the indices' shape takes that axis's place."""
    index_batch = tr.batch.get(indices)
    if index_batch is not None:
        if batch is not None and batch.axis != axis:
            raise BatchDependent("it takes batched indices along another axis than the batch's")
        return Batch(axis + index_batch.axis, index_batch.factor)
    if batch is None or batch.axis == axis:  # picked from the batch: as many as the indices
        return None
    return batch if batch.axis < axis else Batch(batch.axis + tr.ndim(indices) - 1, batch.factor)


def _setitem(tr: BatchTrace, op: ops.SetItem) -> None:
    if op.out in tr.batch or op.value in tr.batch:
        raise BatchDependent(
            "it assigns into a batched array at positions fixed for one batch size (use where)"
        )


def _take(tr: BatchTrace, op: ops.Take) -> Batch | None:
    axis = op.axis % tr.ndim(op.x)
    (x, batch), (indices, index_batch) = tr.operands(op.x, op.indices)
    if op.op == "take":
        return _gathered(tr, batch, axis, indices)
    if batch is not None and batch.axis == axis:  # the indices pick from the batch
        batch = None
    if index_batch is not None and index_batch.axis == axis:
        if batch is not None:
            raise BatchDependent("it takes batched indices along another axis than the batch's")
        return index_batch
    return _aligned(tr, [(x, batch), (indices, index_batch)], tr.ndim(op.out))


def _cumulative(tr: BatchTrace, op: ops.Cumulative) -> Batch | None:
    batch = tr.batch.get(op.x)
    if batch is not None and op.include_initial and batch.axis == (op.axis or 0) % tr.ndim(op.x):
        raise BatchDependent("it prepends a zero to the batch: its axis is one longer than it")
    return batch


def _nn(tr: BatchTrace, op: ops.Conv | ops.Pool | ops.BatchNorm) -> Batch | None:
    """The batch is N, axis 0 of the input; weights and statistics hold none."""
    if isinstance(op, ops.Conv) and op.op == "conv_weight_grad":
        return None  # the converter refuses it
    x, *rest = op.inputs()
    for tensor_id in rest:
        if tensor_id in tr.batch:
            raise BatchDependent(f"its weight or statistics #{tensor_id} hold the batch")
    batch = tr.batch.get(x)
    if batch is not None and batch.axis != 0:
        raise BatchDependent(f"the batch is on axis {batch.axis} of its input, not on N (axis 0)")
    return batch


# every op the exporter converts has its rule (tests/test_onnx_export_batch.py checks it)
RULES: dict[type, Rule] = {
    **dict.fromkeys(
        (ops.Unary, ops.AsType, ops.BinaryScalar, ops.InPlaceBinaryScalar, ops.Softmax), _same
    ),
    **dict.fromkeys((ops.Triangle, ops.Sort), _same),
    **dict.fromkeys((ops.Binary, ops.Where, ops.InPlaceBinary, ops.BroadcastTo), _broadcast),
    ops.Reduce: _reduce,
    ops.Reshape: _reshape,
    ops.PermuteDims: _permute,
    ops.MoveAxis: _permute,
    ops.Join: _join,
    ops.Axes: _axes,
    ops.Roll: _roll,
    ops.Tile: _tile,
    ops.Repeat: _repeat,
    ops.GetItem: _getitem,
    ops.SetItem: _setitem,
    ops.Take: _take,
    ops.Cumulative: _cumulative,
    **dict.fromkeys((ops.Conv, ops.Pool, ops.BatchNorm), _nn),
    **dict.fromkeys((ops.PoolBackward, ops.Random, ops.Full, ops.Arange, ops.Eye), _none),
    **dict.fromkeys((ops.Linspace, ops.MomentUpdate, ops.AdamDirection), _none),
}
