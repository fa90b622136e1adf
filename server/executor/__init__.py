"""The numpy executor: runs one checked op and returns its array.

Rule: imports numpy and ``protocol`` only; knows nothing of bytes on sockets or sessions.

Callers run ``op.infer`` first (the check) and pass its result; :func:`run` then calls numpy and
verifies that numpy produced exactly the inferred shape and dtype, so the client's local view of
every tensor is the truth (ARCHITECTURE invariant 3).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from protocol import TensorMeta, to_numpy
from protocol.codec import Buffer
from protocol.ops import (
    AnyOp,
    Arange,
    AsType,
    Binary,
    Eye,
    FromBuffer,
    Full,
    GetItem,
    PermuteDims,
    Reduce,
    Reshape,
    Unary,
    Where,
)

from . import creation, elementwise, manipulation, reduction

Array = np.ndarray[Any, Any]
Runner = Callable[[Any, Sequence[Array], Sequence[Buffer]], Array]


class InferenceMismatch(AssertionError):
    """numpy produced another shape or dtype than the protocol inferred: a bug in a rule."""


_RUNNERS: dict[type[AnyOp], Runner] = {
    FromBuffer: creation.from_buffer,
    Full: creation.full,
    Arange: creation.arange,
    Eye: creation.eye,
    Unary: elementwise.unary,
    Binary: elementwise.binary,
    Where: elementwise.where,
    AsType: elementwise.astype,
    Reduce: reduction.reduce,
    Reshape: manipulation.reshape,
    PermuteDims: manipulation.permute_dims,
    GetItem: manipulation.getitem,
}


def run(op: AnyOp, args: Sequence[Array], buffers: Sequence[Buffer], meta: TensorMeta) -> Array:
    """Run ``op`` on ``args`` (arrays of ``op.inputs()``); ``meta`` is ``op.infer(...)``.

    Raises:
        Exception: whatever numpy raises for a genuine runtime failure.
        InferenceMismatch: the result differs from ``meta``.
    """
    with np.errstate(all="ignore"):
        result = np.asarray(_RUNNERS[type(op)](op, args, buffers))
    if result.shape != meta.shape or result.dtype != to_numpy(meta.dtype):
        raise InferenceMismatch(
            f"{op.describe()} gave {result.dtype}{list(result.shape)}, "
            f"inferred {meta.dtype}{list(meta.shape)}"
        )
    return result


def cost(op: AnyOp, meta: TensorMeta, args: Sequence[Array]) -> int:
    """A rough count of element operations, to decide whether an op may run on the event loop."""
    work = math.prod(meta.shape)  # not np.prod: this runs per op, and np.prod costs 20x more
    for a in args:
        work = max(work, a.size)
    if isinstance(op, Binary) and op.op == "matmul" and args[0].ndim:
        work *= args[0].shape[-1]
    return work
