"""Graphs: a captured op stream with declared inputs and outputs, replayable anywhere.

A :class:`GraphDef` is what a capture scope records (``client.capture``), what a file holds
(``Graph.save``), and what a session registers to run it by id (:class:`RegisterGraph`, then
the op ``run_graph``). Its ops are the catalogue's own op messages, with ids relative to the
graph: ids name the declared inputs, the constants (bytes uploaded during the capture, carried
as the message's buffers, in order) and every op's outputs. A graph holds no reads, no frees
and no uploads of its own: replaying it means binding inputs, running the ops in order, and
keeping the declared outputs; everything else it made is freed after its last use.

:func:`check_graph` is the one place that says whether a graph holds together; the client
runs it before saving and after loading, the server once, when a graph is registered. It runs
every op's inference rule, so a graph that passes it can only fail at run time where an op
could (numpy raising, memory).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from itertools import islice
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, TypeAdapter

from .dtypes import DType, to_numpy
from .errors import GraphError, InvalidOpError
from .model import Message
from .ops import UNKNOWN, AnyOp, FromBuffer, GraphId, Op, Pull, RunGraph, TensorId, TensorMeta
from .ops.indexing import ArrayIndex

GRAPH_FORMAT = 1


def _printable(name: str) -> str:
    """A name prints as it is: no control, format or line-breaking character (the summary,
    logs, errors and ONNX tools print names; an escape sequence in one would reach a
    terminal). Characters ``str.isprintable`` accepts, the space among them, are kept."""
    if not name.isprintable():
        raise ValueError(
            "a name holds printable characters only (no control, format or separator "
            "character but the space)"
        )
    return name


Name = Annotated[str, Field(min_length=1, max_length=200), AfterValidator(_printable)]
NAME_ADAPTER: TypeAdapter[str] = TypeAdapter(Name)  # one name checked alone (client.capture)


class GraphTensor(BaseModel):
    """One declared input or output: its name, its id in the graph, its shape and dtype."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)
    name: Name
    id: TensorId
    shape: tuple[Annotated[int, Field(ge=0, lt=2**63)], ...]
    dtype: DType

    @property
    def meta(self) -> TensorMeta:
        return TensorMeta(self.shape, self.dtype)


class GraphConstant(BaseModel):
    """Bytes uploaded during the capture: one buffer of the message, in order."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)
    id: TensorId
    shape: tuple[Annotated[int, Field(ge=0, lt=2**63)], ...]
    dtype: DType

    @property
    def meta(self) -> TensorMeta:
        return TensorMeta(self.shape, self.dtype)

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * to_numpy(self.dtype).itemsize


class GraphDef(Message):
    """A graph as a message: a versioned JSON header, then its constants' bytes."""

    type: Literal["graph"] = "graph"
    format: Literal[1] = 1  # GRAPH_FORMAT: a file of another version is refused on load
    inputs: list[GraphTensor] = []
    outputs: list[GraphTensor] = []
    constants: list[GraphConstant] = []
    ops: list[Op] = []

    def buffer_sizes(self) -> tuple[int, ...]:
        return tuple(c.nbytes for c in self.constants)


class RegisterGraph(BaseModel):
    """Register ``graph`` in the session under ``graph_id`` (chosen by the client, as tensor
    ids are); its constants are the batch's buffers from ``first_buffer`` on, in order."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)
    graph_id: GraphId
    graph: GraphDef
    first_buffer: Annotated[int, Field(ge=0, lt=2**63)] = 0


@dataclass(frozen=True)
class GraphCheck:
    """What :func:`check_graph` learnt: every id's meta, each op's output metas, each id's
    last use (op index; ids never used have none), and the peak bytes of live tensors."""

    metas: dict[int, TensorMeta]
    op_metas: list[tuple[TensorMeta, ...]]
    last_use: dict[int, int]
    peak_bytes: int
    op_counts: Counter[str]


def _nbytes(meta: TensorMeta) -> int:
    return math.prod(meta.shape) * to_numpy(meta.dtype).itemsize


def _declare(graph: GraphDef) -> tuple[dict[int, TensorMeta], set[int]]:
    """The metas of the inputs and constants, refusing repeated names and ids."""
    metas: dict[int, TensorMeta] = {}
    for role, named in (("input", graph.inputs), ("output", graph.outputs)):
        names = Counter(t.name for t in named)
        repeated = [n for n, c in names.items() if c > 1]
        if repeated:
            raise GraphError(f"the graph declares the {role} name {repeated[0]!r} twice")
    declared: list[GraphTensor | GraphConstant] = [*graph.inputs, *graph.constants]
    for tensor in declared:
        if tensor.id in metas:
            raise GraphError(f"the graph declares id #{tensor.id} twice")
        metas[tensor.id] = tensor.meta
    return metas, {c.id for c in graph.constants}


# Ops whose result may be a view of their first input (numpy decides: a reshape of a
# contiguous array is one, a basic index is one, astype to the same dtype is the array).
_VIEW_KINDS = frozenset(
    {"reshape", "getitem", "permute_dims", "axes", "moveaxis", "broadcast_to", "astype"}
)
_VIEW_NAMES = frozenset({"real", "imag"})  # unary ops that give a real array itself


def _check_op(index: int, op: AnyOp, metas: dict[int, TensorMeta], constants: set[int]) -> None:
    """Refuse what a graph cannot hold. ``constants`` holds the constants' ids and every id
    that may share a constant's memory; this adds ``op``'s outputs when they may."""
    if isinstance(op, FromBuffer | RunGraph | Pull):
        raise _op_error(index, op, f": a graph holds no {op.kind} op (constants are declared)")
    missing = [i for i in op.inputs() if i not in metas]
    if missing:
        raise _op_error(index, op, f" reads #{missing[0]}, which no input, constant or op made")
    if op.inplace and op.out in constants:
        raise _op_error(
            index,
            op,
            f" writes into constant #{op.out} (or a view of one): the next replay would see the "
            "change; copy the constant first",
        )
    if not op.inplace:
        taken = [i for i in op.outputs() if i in metas]
        if taken:
            raise _op_error(index, op, f" makes #{taken[0]}, which exists already")
        if (op.kind in _VIEW_KINDS or op.name() in _VIEW_NAMES) and op.inputs()[0] in constants:
            constants.update(op.outputs())


def _op_error(index: int, op: AnyOp, what: str) -> GraphError:
    """``what`` is wrong with op ``index``: described only when it is (a wide op's description
    is as long as its inputs)."""
    return GraphError(f"op {index} ({op.describe()}){what}")


def check_graph(graph: GraphDef) -> GraphCheck:
    """Check that ``graph`` holds together, by running every op's inference rule in order.

    Raises:
        GraphError: ids used before they are made or made twice, an op a graph cannot hold
            (an upload, a nested ``run_graph``, a data-dependent shape), an in-place write to
            a constant, an output that no op produced, or a declared meta its ops contradict.
    """
    checking = GraphChecking(graph)
    for op in graph.ops:
        checking.add(op)
    return checking.finish()


class GraphChecking:
    """:func:`check_graph` one op at a time, for ops that are never all in memory at once (a
    graph file's, loaded piece by piece): give it the graph's declarations (its ops are not
    read), :meth:`add` each op in order, then :meth:`finish`. It keeps what the ops to come
    need (each id's meta, its last use so far) and the live bytes each op index adds or
    drops, so the peak is known without going over the ops again. Equal metas are kept once.

    Raises (from each method):
        GraphError: as :func:`check_graph`, at the op or declaration that does not hold.
    """

    def __init__(self, declared: GraphDef, keep_op_metas: bool = True) -> None:
        self._graph = declared
        self.metas, self._constants = _declare(declared)  # constants grow by views of them
        self._shared: dict[TensorMeta, TensorMeta] = {}  # a meta equal to one seen: that one
        self.op_metas: list[tuple[TensorMeta, ...]] | None = [] if keep_op_metas else None
        self.last_use: dict[int, int] = {}  # an op's output: the op that made it, until read
        self.op_counts: Counter[str] = Counter()
        # live throughout (inputs, constants) or from their op to the end (outputs)
        self._lasting = {*self.metas, *(t.id for t in declared.outputs)}
        self._declared_bytes = sum(_nbytes(m) for m in self.metas.values())
        self._delta: list[int] = [0]  # at op index i: bytes that start or end being live
        self._index = 0

    def add(self, op: AnyOp) -> None:
        """Check the next op against what came before it."""
        index, metas, delta, last_use = self._index, self.metas, self._delta, self.last_use
        _check_op(index, op, metas, self._constants)
        inputs = op.inputs()
        try:
            out = op.infer_all(*(metas[i] for i in inputs))
        except InvalidOpError as exc:
            raise _op_error(index, op, f": {exc}") from None
        if any(UNKNOWN in meta.shape for meta in out):
            raise _op_error(
                index,
                op,
                " has a data-dependent shape, which a graph cannot hold: its replays could differ",
            )
        delta.append(0)
        for tensor_id in inputs:  # an op's output lives until its last read, at least
            last = last_use.get(tensor_id)
            last_use[tensor_id] = index
            if last is not None and last < index and tensor_id not in self._lasting:
                nbytes = _nbytes(metas[tensor_id])
                delta[last + 1] += nbytes
                delta[index + 1] -= nbytes
        out = tuple(self._shared.setdefault(meta, meta) for meta in out)
        for tensor_id, meta in zip(op.outputs(), out, strict=True):
            metas[tensor_id] = meta
            if not op.inplace:  # its output lives from here, until it is read
                nbytes = _nbytes(meta)
                delta[index] += nbytes
                if tensor_id not in self._lasting:
                    delta[index + 1] -= nbytes
                    last_use[tensor_id] = index
        if self.op_metas is not None:
            self.op_metas.append(out)
        self.op_counts[op.name()] += 1
        self._index += 1

    def finish(self) -> GraphCheck:
        """The check of the whole graph, once its outputs are checked against what its ops
        made."""
        declared = {t.id for t in self._graph.inputs} | {c.id for c in self._graph.constants}
        _check_outputs(self._graph, self.metas, declared)
        live = peak = self._declared_bytes
        for change in islice(self._delta, self._index):
            live += change
            peak = max(peak, live)
        return GraphCheck(
            metas=self.metas,
            op_metas=self.op_metas or [],
            last_use=self.last_use,
            peak_bytes=peak,
            op_counts=self.op_counts,
        )


def _check_outputs(graph: GraphDef, metas: dict[int, TensorMeta], declared: set[int]) -> None:
    """Each declared output is made by an op (it is known, and not an input or a constant),
    once, with the meta it is declared with."""
    seen: set[int] = set()
    for tensor in graph.outputs:
        if tensor.id not in metas or tensor.id in declared:
            raise GraphError(
                f"output {tensor.name!r} (#{tensor.id}) is not produced by an op of the graph"
            )
        if tensor.id in seen:
            raise GraphError(f"output {tensor.name!r}: #{tensor.id} is declared twice")
        seen.add(tensor.id)
        if metas[tensor.id] != tensor.meta:
            raise GraphError(
                f"output {tensor.name!r} is declared {tensor.meta}, its op makes {metas[tensor.id]}"
            )


# --- renumbering ------------------------------------------------------------------------------

_ID_FIELDS = ("out", "x", "x1", "x2", "condition", "indices", "repeats_tensor")
_ID_FIELDS_NN = ("w", "grad", "mean", "var", "weight", "bias", "state")  # the nn extension's
_ID_FIELDS_OPTIM = ("exp_avg", "exp_avg_sq", "step_size", "eps_term")  # the optim extension's
_ID_TUPLES = ("more", "xs", "args")
ID_FIELDS = (
    *_ID_FIELDS,
    *_ID_FIELDS_NN,
    *_ID_FIELDS_OPTIM,
)  # an op's fields that name one tensor (and setitem's value)
ID_TUPLES = _ID_TUPLES  # an op's fields that name several


def renumber(op: AnyOp, ids: Mapping[int, int]) -> AnyOp:
    """``op`` with every tensor id it names (inputs, outputs, index tensors) mapped through
    ``ids``. Raises KeyError for an id that ``ids`` lacks."""
    update: dict[str, Any] = {}
    if op.kind == "setitem":  # elsewhere (``full``) a field named value is a scalar
        update["value"] = ids[op.value]
    for name in ID_FIELDS:
        value = getattr(op, name, None)
        if value is not None:
            update[name] = ids[value]
    for name in _ID_TUPLES:
        value = getattr(op, name, None)
        if value is not None:
            update[name] = tuple(ids[i] for i in value)
    key = getattr(op, "key", None)
    if key is not None:
        update["key"] = tuple(
            ArrayIndex(tensor=ids[k.tensor]) if isinstance(k, ArrayIndex) else k for k in key
        )
    return op.model_copy(update=update)


__all__ = [
    "GRAPH_FORMAT",
    "ID_FIELDS",
    "ID_TUPLES",
    "NAME_ADAPTER",
    "GraphCheck",
    "GraphConstant",
    "GraphDef",
    "GraphTensor",
    "RegisterGraph",
    "TensorId",
    "check_graph",
    "renumber",
]
