"""What registering a graph checks beside :func:`~protocol.graphs.check_graph`, and what it charges
(``server/graphs.py`` registers): the per-op caps on its declared tensors and its ops
(:func:`check_caps`), its constants' buffers (:func:`constant_buffers`), the bytes its plan
holds in the server (:func:`structure_bytes`), and the bounded text of the error a failed
registration keeps (:func:`bounded`).

What a plan holds beside its constants is Python objects that no numpy array counts: each op's
message model and step, an item of each of its tuple fields twice (the op's and the step's,
and an integer object for each id), each declared tensor's entries, meta and name. It is
charged as bytes against ``--max-graph-bytes``, the quota and the budget before the plan is
made, at a little more than each takes (bench/REASONS.md, 'Registered graph charge'), so that
no graph holds memory that nothing counts: neither many small graphs nor a few huge ones.
"""

from __future__ import annotations

from collections.abc import Sequence

from protocol import ErrorCode
from protocol.codec import Buffer
from protocol.graphs import GraphCheck, GraphDef

from . import executor
from .check_costs import width
from .errors import StoreError
from .limits import Limits, output_bytes
from .plans import shaped_like

ERROR_TEXT = 2048  # characters of a failed registration's error kept: its start and its end
OP_BYTES = 2048  # an op: its message model, its plan step, its metas
ID_BYTES = 64  # an item of an op's tuple fields (an input's id, a dimension)
TENSOR_BYTES = 320  # a declared input, output or constant, besides its name


def structure_bytes(graph: GraphDef) -> int:
    """What ``graph``'s plan holds beside its constants' bytes (see the module docstring)."""
    declared = [*graph.inputs, *graph.outputs]
    names = sum(len(t.name) for t in declared)
    tensors = len(declared) + len(graph.constants)
    items = sum(width(op) for op in graph.ops)
    return OP_BYTES * len(graph.ops) + ID_BYTES * items + TENSOR_BYTES * tensors + names


def bounded(text: str, most: int = ERROR_TEXT) -> str:
    """``text``, or its first and last ``most // 2`` characters and how many are left out
    between them (a wide op's description is as long as its inputs: megabytes)."""
    if len(text) <= most:
        return text
    half = most // 2
    return f"{text[:half]} [... {len(text) - 2 * half} characters ...] {text[-half:]}"


def check_caps(graph: GraphDef, check: GraphCheck, limits: Limits) -> None:
    """The per-op caps on every op's outputs and scratch, and on the graph's outputs together
    (they are one ``run_graph``'s). Raises :class:`StoreError` (``limit_exceeded``) naming
    the op. The inputs and constants first, then the ops in order, so that every op's inputs
    have passed a cap before numpy shapes an array of theirs (a constant's, its scratch
    counted on arrays of their shapes), which it refuses past its address space or 64
    dimensions."""
    declared = [(f"input {t.name!r}", t.meta) for t in graph.inputs]  # no op could make one
    declared += [(f"constant #{c.id}", c.meta) for c in graph.constants]  # no upload either
    for what, meta in declared:
        try:
            output_bytes([meta], limits)
        except StoreError as exc:
            raise StoreError(exc.code, f"{what}: {exc}") from None
    for index, (op, metas) in enumerate(zip(graph.ops, check.op_metas, strict=True)):
        try:
            shaped = [shaped_like(check.metas[i]) for i in op.inputs()]
            output_bytes(metas, limits, executor.scratch(op, metas[0], shaped))
        except StoreError as exc:
            raise StoreError(exc.code, f"op {index} ({op.describe()}): {exc}") from None
    output_bytes([t.meta for t in graph.outputs], limits)


def constant_buffers(graph: GraphDef, buffers: Sequence[Buffer], first: int) -> list[Buffer]:
    """The buffers of ``graph``'s constants. Raises :class:`StoreError` (``bad_message``)
    when the batch lacks them or one's size is not its constant's."""
    if first + len(graph.constants) > len(buffers):
        raise StoreError(
            ErrorCode.BAD_MESSAGE,
            f"the graph has {len(graph.constants)} constants from buffer {first}; the batch "
            f"carries {len(buffers)} buffers",
        )
    data = list(buffers[first : first + len(graph.constants)])
    for constant, buffer in zip(graph.constants, data, strict=True):
        if buffer.nbytes != constant.nbytes:
            raise StoreError(
                ErrorCode.BAD_MESSAGE,
                f"constant #{constant.id} ({constant.dtype}{list(constant.shape)}) needs "
                f"{constant.nbytes} bytes; its buffer holds {buffer.nbytes}",
            )
    return data


__all__ = [
    "ERROR_TEXT",
    "ID_BYTES",
    "OP_BYTES",
    "TENSOR_BYTES",
    "bounded",
    "check_caps",
    "constant_buffers",
    "structure_bytes",
]
