"""What an op tells of its output's values from what the client knows of its inputs
(``client._known``): exact operations only (selection, by index arrays too, broadcasting,
negation of a mask, comparisons, ``any``, ``all``, ``abs``, ``negative``, ``max``, ``min``,
``searchsorted``, and ``+``, ``-``, ``*`` of integers of one dtype), computed as the server
computes them, and the length of ``x[mask]`` from the mask's count of true elements. Values
derived from an upload's await its confirmation as the upload's do (``Known.derivable``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from protocol import TensorMeta, to_numpy
from protocol.ops import (
    UNKNOWN,
    AnyOp,
    Binary,
    BinaryScalar,
    BroadcastTo,
    GetItem,
    PermuteDims,
    Reduce,
    Reshape,
    SearchSorted,
    Unary,
)
from protocol.ops.elementwise import operand_dtype
from protocol.ops.indexing import numpy_key

from ._known import ALONG_ELEMENTS, VALUES_KEPT, Known

if TYPE_CHECKING:
    from ._handle import Handle

COMPLEMENTS = frozenset({"logical_not", "bitwise_invert"})
COMPARISONS = frozenset(
    ("equal", "not_equal", "less", "less_equal", "greater", "greater_equal")
    + ("logical_and", "logical_or", "logical_xor")
)
EXACT_UNARY = frozenset({"abs", "negative"})  # no rounding: the client's numpy gives the same
# exact on integers of one dtype (they wrap as the server's numpy wraps them): index arithmetic
EXACT_INTEGER = frozenset({"add", "subtract", "multiply"})
EXACT_REDUCE = frozenset({"max", "min"})
WATCHED_OPS = frozenset({Unary, Reduce})  # what derive() looks at even when nothing is known


def single_mask(op: AnyOp, inputs: Sequence[Handle]) -> Handle | None:
    """The boolean mask of ``x[mask]``-like indexing (one array index, a boolean one), or
    None: the only indexing whose unknown dimension is the mask's count of true elements."""
    if type(op) is not GetItem or len(inputs) != 2 or inputs[1].wire_dtype != "bool":
        return None
    return inputs[1]


def masked_meta(known: Known, meta: TensorMeta, mask: Handle) -> TensorMeta:
    """``meta`` of ``x[mask]`` with its data-dependent dimension filled in, if the mask's
    count is known (else ``meta`` as it is)."""
    count = known.count(mask) if known else None
    if count is None or meta.shape.count(UNKNOWN) != 1:
        return meta
    return TensorMeta(tuple(count if d == UNKNOWN else d for d in meta.shape), meta.dtype)


def learn_masked(known: Known, meta: TensorMeta, out: Handle, mask: Handle) -> None:
    """``out = x[mask]``, whose ``meta`` had one unknown dimension, has been described: the
    length of that dimension is the mask's count of true elements."""
    if meta.shape.count(UNKNOWN) == 1:
        known.learn_count(mask, out.shape[meta.shape.index(UNKNOWN)])


def note_condition(known: Known, mask: Handle) -> None:
    """``mask``, a boolean array in fresh memory, is likely tested soon (``xp.any(mask)``,
    ``x[mask]``): a small one is read along with the next read (``Known.read_along``)."""
    if mask.size <= ALONG_ELEMENTS:
        known.note_result(mask)


def derive(known: Known, op: AnyOp, out: Handle, inputs: Sequence[Handle]) -> None:
    """Note what ``op`` tells of ``out``'s values from what is known of its inputs (exact
    operations only: the module's list)."""
    if isinstance(op, Unary):
        if op.op in COMPLEMENTS and inputs[0].wire_dtype == "bool":
            count = known.count(inputs[0]) if known else None
            if count is None:
                known.learn(out, complement=inputs[0])
            else:
                known.learn(out, count=out.size - count)
        elif op.op in EXACT_UNARY:
            _exact(known, out, inputs[0], getattr(np, op.op))
        return
    if not out.shape and isinstance(op, Reduce | Binary | BinaryScalar):
        known.note_result(out)
    if isinstance(op, Binary | BinaryScalar):
        compared, awaiting = _compared(known, op, inputs)
        if compared is not None:
            _learn(known, out, compared, awaiting)
        elif op.op in COMPARISONS:
            _learn_roots(known, out, inputs)
        return
    if len(inputs) != 1:
        if isinstance(op, SearchSorted | GetItem) and known:
            _several(known, op, out, inputs)
        return
    values, awaiting = known.derivable(inputs[0]) if known else (None, 0)
    result: np.ndarray[Any, Any] | None = None
    if isinstance(op, Reduce):
        if op.op in ("any", "all"):
            result = _any_all(known, op, inputs[0], values)
            if result is None:
                known.learn(out, source=inputs[0])
        elif op.op in EXACT_REDUCE:
            reduce = np.max if op.op == "max" else np.min
            _exact(known, out, inputs[0], lambda v: reduce(v, axis=op.axis, keepdims=op.keepdims))
            return
    elif values is None:
        if isinstance(op, GetItem) and not out.shape and inputs[0].size <= ALONG_ELEMENTS:
            known.learn(out, array=inputs[0])  # what is made from it brings the array along
        return
    elif isinstance(op, Reshape):
        result = values.reshape(op.shape)
    elif isinstance(op, PermuteDims):
        result = values.transpose(op.axes)
    elif isinstance(op, GetItem):
        result = values[numpy_key(op.key, ())]
    elif isinstance(op, BroadcastTo) and out.size * values.itemsize <= VALUES_KEPT:
        result = np.broadcast_to(values, op.shape)
    _learn(known, out, result, awaiting)


def _several(
    known: Known, op: SearchSorted | GetItem, out: Handle, inputs: Sequence[Handle]
) -> None:
    """``searchsorted``, or indexing by index arrays, of known arrays: as the server's numpy
    computes them (an index out of bounds is left to the server, which stores its error)."""
    values, awaiting = _all_derivable(known, inputs)
    if values is None:
        return
    result: np.ndarray[Any, Any] | None = None
    if isinstance(op, SearchSorted):
        common = np.result_type(values[0], values[1])
        found = np.searchsorted(values[0].astype(common), values[1].astype(common), op.side)
        result = np.asarray(found, dtype=np.int64)
    elif out.size <= ALONG_ELEMENTS:
        try:
            result = np.asarray(values[0][numpy_key(op.key, values[1:])])
        except IndexError:
            return
    _learn(known, out, result, awaiting)


def _exact(known: Known, out: Handle, x: Handle, fn: Callable[[Any], Any]) -> None:
    """``out = fn(x)``, an exact operation (no rounding) of a real or integer ``x``: its values
    if ``x``'s are known, as the server's numpy computes them; else ``x`` as the small array
    they come from, which a read of ``out`` (or of what is made from it) brings along."""
    values, awaiting = known.derivable(x) if known else (None, 0)
    if values is None:
        _learn_roots(known, out, (x,))
    elif values.dtype.kind in "iuf" and values.size:
        with np.errstate(all="ignore"):
            _learn(known, out, np.asarray(fn(values)), awaiting)


def _learn_roots(known: Known, out: Handle, inputs: Sequence[Handle]) -> None:
    """``out`` is made by an exact op from ``inputs``, whose values are not known: note the
    small arrays they come from (theirs, else themselves), which a read of ``out`` brings."""
    roots: list[Handle] = []
    for x in inputs:
        made_from = known.roots(x, element=True) if known else []
        roots += made_from or ([x] if x.size <= ALONG_ELEMENTS else [])
    if roots:
        known.learn(out, roots=roots)


def _learn(
    known: Known, out: Handle, result: np.ndarray[Any, Any] | None, awaiting: int = 0
) -> None:
    """``out``'s values are ``result``, once upload number ``awaiting`` is confirmed (0: at
    once)."""
    if result is not None and result.shape == out.shape and result.dtype == out.dtype:
        result = np.array(result)
        result.flags.writeable = False
        known.learn(out, values=result, awaiting=awaiting)


def _compared(
    known: Known, op: Binary | BinaryScalar, inputs: Sequence[Handle]
) -> tuple[np.ndarray[Any, Any] | None, int]:
    """A comparison's (or a logical op's) result from its operands' known values, computed
    as the server computes it (numpy, the scalar as a 0-d array of its standard dtype), and
    the upload whose confirmation it awaits (``Known.derivable``)."""
    integer = op.op in EXACT_INTEGER
    if not (integer or op.op in COMPARISONS) or not known:
        return None, 0
    operands, awaiting = _all_derivable(known, inputs)
    if operands is None:
        return None, 0
    fn = getattr(np, op.op)
    if isinstance(op, Binary):
        other = operands[1]
        pair = (operands[0], other)
    else:
        if type(op.scalar) not in ((int,) if integer else (bool, int, float)):
            return None, 0
        try:
            dtype = to_numpy(operand_dtype(op.scalar, inputs[0].wire_dtype))
            other = np.asarray(op.scalar, dtype)
        except OverflowError:  # not of the array's dtype: left to the server
            return None, 0
        pair = (other, operands[0]) if op.scalar_first else (operands[0], other)
    if not integer:
        return np.asarray(fn(*pair)), awaiting
    if not _one_integer_dtype(operands[0], other):
        return None, 0
    with np.errstate(all="ignore"):  # they wrap, as on the server
        return np.asarray(fn(*pair)), awaiting


def _all_derivable(
    known: Known, inputs: Sequence[Handle]
) -> tuple[list[np.ndarray[Any, Any]] | None, int]:
    """The values of every one of ``inputs`` (None unless all are known), and the upload
    whose confirmation they await (``Known.derivable``)."""
    derivable = [known.derivable(x) for x in inputs]
    values = [v for v, _ in derivable if v is not None]
    if len(values) != len(inputs):
        return None, 0
    return values, max(upload for _, upload in derivable)


def _one_integer_dtype(a: np.ndarray[Any, Any], b: np.ndarray[Any, Any]) -> bool:
    return a.dtype == b.dtype and a.dtype.kind in "iu"


def _any_all(
    known: Known, op: Reduce, x: Handle, values: np.ndarray[Any, Any] | None
) -> np.ndarray[Any, Any] | None:
    reduce = np.any if op.op == "any" else np.all
    if values is not None:
        return np.asarray(reduce(values, axis=op.axis, keepdims=op.keepdims))
    count = known.count(x) if op.axis is None else None
    if count is None:
        return None
    value = count > 0 if op.op == "any" else count == x.size
    return np.full((1,) * x.ndim if op.keepdims else (), value)
