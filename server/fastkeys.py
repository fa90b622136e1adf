"""What the checks of an op on the fast path depend on: its *key*, the op's fields but its
tensor ids, by op type (``server/fastpath.py`` adds the input metas and caches the checks by
both).

An op's inferred outputs, their bytes under the per-op caps, the scratch numpy allocates beside
them and its cost (``executor.cost``, ``executor.scratch``: they read its inputs' shapes and
dtypes, never their values) follow from its fields and its input metas alone; its ids only say
where the inputs are and the result goes. So two ops of one key and one set of input metas pass
or fail the same checks, with the same figures. A field whose values are equal across types
(``1 == 1.0 == True``) is keyed with its type where the type changes the rules (a Python
scalar's: ``full(value=1.0)`` of an integer dtype is refused, ``full(value=1)`` is not), and an
integer scalar, whose fit in a dtype depends on its value, with its value.

Only the op types of the training examples are here, each where its outputs' lengths follow
from its fields and metas (an index by a tensor, whose ids are in the key itself and whose
masks are data-dependent, has none: it takes the general path). An upload (``from_buffer``)
takes the general path too: its bytes are counted since they arrived (``take_upload``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable
from operator import attrgetter
from typing import Any

from protocol.ops import (
    AdamDirection,
    Arange,
    AsType,
    Axes,
    BatchNorm,
    Binary,
    BroadcastTo,
    Conv,
    Full,
    GetItem,
    InPlaceBinary,
    InPlaceBinaryScalar,
    Join,
    MomentUpdate,
    PermuteDims,
    Pool,
    PoolBackward,
    Random,
    Reduce,
    Reshape,
    SetItem,
    Softmax,
    Take,
    Triangle,
    Where,
)
from protocol.ops.indexing import ArrayIndex

JOINED = 16  # the most inputs of a join on the fast path
Key = Callable[[Any], Hashable | None]  # an op's key; None: it takes the general path


def _fields(*names: str) -> Key:
    """The key of the fields ``names`` (values whose type the rules do not see)."""
    if not names:
        return lambda op: ()
    return attrgetter(*names)


def _scalar(value: Any) -> tuple[type, Any]:
    """A Python scalar in a key: its type, and its value if an integer (its fit depends on it)."""
    kind = type(value)
    return kind, value if kind is int else None


def _matmul(op: Binary) -> Hashable | None:
    return "matmul" if op.op == "matmul" else None  # the others: FastPath's element-wise path


def _inplace_scalar(op: InPlaceBinaryScalar) -> Hashable:
    return op.op, _scalar(op.scalar)


def _full(op: Full) -> Hashable:
    return op.shape, op.dtype, _scalar(op.value)


def _arange(op: Arange) -> Hashable:
    """Its length depends on the values of its bounds (with their types: an integer range
    counts exactly)."""
    ends = (op.start, op.stop, op.step)
    return op.dtype, tuple(type(v) for v in ends), ends


def _index(op: GetItem | SetItem) -> Hashable | None:
    """A basic index (integers, slices, newaxis, ellipsis); None for an index by a tensor."""
    for item in op.key:
        if type(item) is ArrayIndex:
            return None
    return op.key


def _join(op: Join) -> Hashable | None:
    """A join of a few inputs (its key holds a meta per input: a wide one is not cached)."""
    return (op.op, op.axis) if len(op.xs) <= JOINED else None


def _moment(op: MomentUpdate) -> Hashable | None:
    """Whether it squares, and whether its factors are finite (which its rule checks): any
    finite values alike. None for its moment's own id as its gradient, which its rule
    refuses by the ids."""
    if op.grad == op.out:
        return None
    return op.squared, math.isfinite(op.decay) and math.isfinite(op.scale)


def _batch_norm(op: BatchNorm) -> Hashable:
    return op.eps, op.weight is None, op.bias is None  # which affine inputs it has


KEYS: dict[type, Key] = {
    Binary: _matmul,
    InPlaceBinary: _fields("op"),
    InPlaceBinaryScalar: _inplace_scalar,
    Where: _fields(),
    AsType: _fields("dtype"),
    Reduce: _fields("op", "axis", "keepdims", "correction"),
    Reshape: _fields("shape"),
    PermuteDims: _fields("axes"),
    Axes: _fields("op", "axis"),
    BroadcastTo: _fields("shape"),
    Join: _join,
    Take: _fields("op", "axis"),
    GetItem: _index,
    SetItem: _index,
    Full: _full,
    Arange: _arange,
    Triangle: _fields("op", "k"),
    Softmax: _fields("op", "axis"),
    Conv: _fields("op", "stride", "padding", "dilation", "groups", "output_padding", "kernel"),
    Pool: _fields("op", "kernel", "stride", "padding", "count_include_pad"),
    PoolBackward: _fields("op", "kernel", "stride", "padding", "count_include_pad"),
    BatchNorm: _batch_norm,
    Random: _fields("op", "shape", "dtype"),
    MomentUpdate: _moment,
    AdamDirection: _fields(),
}
