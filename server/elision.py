"""Temporary elision in a plan: which steps may write their result into the memory of an
input that dies at them, instead of into a new array.

numpy does this for Python expressions: in ``a * b + c`` the temporary ``a * b``, referenced
by nothing else, receives the sum (its "temporary elision", for arrays of 256 KiB or more). A
step-by-step replay cannot see reference counts, but a plan knows the whole graph before it
runs, so it decides once, at registration, for every replay. Training steps are full of such
chains (Adam's ``v = beta2 * v + (1 - beta2) * g * g`` makes two temporaries per parameter).
The result lands in memory that was just read, still in the cache, where a new array is memory
the cache has to fetch again (bench/REASONS.md, 'Temporary elision').

A step writes into input ``t`` when all of these hold:
- the step is one ufunc call that numpy's ``out=`` leaves exact
  (:func:`server.executor.elementwise.writes_into`), and its result has ``t``'s shape and
  dtype, ``t`` not 0-d;
- ``t`` dies at the step (its last use), and is not an input, a constant or an output of the
  graph (none of those is ever freed);
- ``t``'s memory is ``t``'s alone: the op that made it returns a new array (a ufunc, matmul
  included), and no op that reads it could return a view of it (only ufuncs, ``where`` and
  in-place ops read it). A view of ``t`` that outlived ``t`` would see the write;
- at replay, every input of the step is C-contiguous (checked by
  :func:`~server.executor.elementwise.into_input`, which else returns a new array):
  numpy's own result would then be C-ordered like ``t``, so the result keeps numpy's layout,
  which a later reduction's bits depend on (it sums in memory order).

Standard library and the protocol only (besides the executor's rule); ``server/plans.py``
binds the runner.
"""

from __future__ import annotations

from collections.abc import Sequence

from protocol.graphs import GraphCheck
from protocol.ops import (
    AdamDirection,
    Binary,
    BinaryScalar,
    InPlaceBinary,
    InPlaceBinaryScalar,
    MomentUpdate,
    Unary,
    Where,
)
from protocol.ops.base import BaseOp

from .executor import elementwise


def elided_inputs(ops: Sequence[BaseOp], check: GraphCheck, kept: set[int]) -> dict[int, int]:
    """For each op index whose result may be written into one of its inputs, the position of
    that input in ``op.inputs()`` (see the module docstring). ``kept``: the graph's inputs,
    constants and outputs."""
    made_new = {o for op in ops if not op.inplace and _returns_new_array(op) for o in op.outputs()}
    private = made_new - kept - _maybe_viewed(ops)
    into: dict[int, int] = {}
    for index, op in enumerate(ops):
        if not isinstance(op, Unary | Binary | BinaryScalar):
            continue
        (result,) = check.op_metas[index]
        inputs = op.inputs()
        for position, tensor_id in enumerate(inputs):
            meta = check.metas[tensor_id]
            if (
                tensor_id in private
                and check.last_use.get(tensor_id) == index
                and meta == result
                and meta.shape != ()
                and elementwise.writes_into(op, [check.metas[i].dtype for i in inputs])
            ):
                into[index] = position
                break
    return into


def _returns_new_array(op: BaseOp) -> bool:
    """Whether the runner of ``op`` returns a new array that shares no input's memory: a ufunc
    does (matmul too), as do ``where`` and ``adam_direction``; ``real``, ``imag`` and
    ``round`` are not ufuncs, and the first two return views."""
    if isinstance(op, Unary):
        return op.op in elementwise.UNARY_UFUNCS
    return isinstance(op, Binary | BinaryScalar | Where | AdamDirection)


def _maybe_viewed(ops: Sequence[BaseOp]) -> set[int]:
    """The tensors read by an op that might return a view of them: any op but those that
    return a new array and the in-place ops (which write into their target and return it)."""
    return {
        tensor_id
        for op in ops
        if not (
            _returns_new_array(op)
            or isinstance(op, InPlaceBinary | InPlaceBinaryScalar | MomentUpdate)
        )
        for tensor_id in op.inputs()
    }
