"""Export a graph (:class:`protocol.graphs.GraphDef` and its constants) to ONNX, the standard
exchange format for computation graphs, which onnxruntime and most inference engines run.

The graph's declared inputs and outputs become the ONNX graph's, under the same names, shapes
and dtypes; its constants become initializers; each op becomes the nodes that compute what the
server computes for it (numpy's results and dtypes, ``server/executor/``). ONNX assigns each
value once, so an in-place op gives its target a new value name; an in-place write that numpy
would make visible through a view (``v = x[0:2]; v += 1`` changes ``x``) or in an input or a
constant cannot be expressed that way, and is refused. Ops with no exact counterpart (linalg,
fft, searching, ``cumulative_prod``, ...) are refused too, by :class:`OnnxExportError` naming
the op, and so are the ops only training makes (gradients, random numbers drawn on the device:
export a model in eval mode).

A graph is recorded for one batch size. ``dynamic_batch`` makes dimension 0 of the batch
inputs a symbolic ``batch`` (as ``dynamic_axes`` does in ``torch.onnx.export``): the shapes
that hold the batch are then computed at run time, and what bakes its recorded size in is
refused by :class:`DynamicBatchError` naming the op (:mod:`._onnx_batch` says what and why).

The ``onnx`` package is optional (``pip install 'tensorwire[onnx]'``): it is imported when
:func:`to_onnx` is called.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from protocol.dtypes import from_numpy, to_numpy
from protocol.graphs import GraphCheck, GraphDef, GraphTensor, check_graph
from protocol.ops import (
    AnyOp,
    ArrayIndex,
    Axes,
    BroadcastTo,
    GetItem,
    MoveAxis,
    PermuteDims,
    Reshape,
    Unary,
)

from ._onnx_batch import BATCH, BatchDependent, BatchTrace
from ._onnx_builder import Batch, Converter, Export, NoCounterpart, onnx_dtype
from ._onnx_nn import NN
from ._onnx_ops import ELEMENTWISE
from ._onnx_shapes import SHAPES

if TYPE_CHECKING:
    import onnx

MIN_OPSET = 18  # every Reduce* takes its axes as an input from 18 on: one form to emit
CONVERTERS: dict[type, Converter] = {**ELEMENTWISE, **SHAPES, **NN}
DynamicBatch = bool | str | Sequence[str]


class OnnxExportError(ValueError):
    """A graph that ONNX cannot express as the server runs it: an op with no counterpart, an
    in-place write through a view, constants that do not match the graph."""


class DynamicBatchError(OnnxExportError):
    """A graph whose batch cannot be made dynamic: an op bakes the recorded batch size in (a
    reshape that splits the batch, an array made for one batch size, ...), or the batch inputs
    do not fit (unknown, of different batch sizes, recorded with a batch of 1). The graph may
    still export with its recorded batch (``dynamic_batch=False``)."""


def to_onnx(
    graph: GraphDef,
    constants: Sequence[np.ndarray[Any, Any]],
    path: str | os.PathLike[str] | None = None,
    opset: int = 18,
    *,
    dynamic_batch: DynamicBatch = False,
) -> onnx.ModelProto:
    """The ONNX model of ``graph``, whose constants' values are ``constants`` (in the graph's
    order); written to ``path`` too, when given. The model passes ``onnx.checker`` (full check,
    with shape inference), at the default domain's ``opset``.

    ``dynamic_batch``: False, every shape as recorded; True, dimension 0 of the graph's first
    input is the batch, named ``batch`` in the model; or the names of the inputs whose
    dimension 0 is the batch (all recorded with the same batch size, at least 2). The outputs
    that hold the batch have it symbolic too.

    Raises:
        ImportError: the ``onnx`` package is not installed.
        GraphError: ``graph`` does not hold together (:func:`~protocol.graphs.check_graph`).
        OnnxExportError: an op with no ONNX counterpart (named, with its index), a training
            op, an in-place write ONNX cannot express, constants that do not match the graph's,
            or a model ONNX's checker refuses.
        DynamicBatchError: (an OnnxExportError) with ``dynamic_batch``, an op that bakes the
            batch size in (named, with its index and why), or batch inputs that do not fit.
        ValueError: an ``opset`` below 18 or above what the installed ``onnx`` knows.
    """
    onnx = _import_onnx()
    if not MIN_OPSET <= opset <= onnx.defs.onnx_opset_version():
        raise ValueError(
            f"opset {opset} is out of range: {MIN_OPSET} to {onnx.defs.onnx_opset_version()} "
            f"(the installed onnx {onnx.__version__})"
        )
    check = check_graph(graph)
    arrays = _constant_arrays(graph, constants)
    ex = _convert(graph, arrays, check, _batch_names(graph, dynamic_batch))
    _refuse_hidden_writes(graph, check)
    model = _model(graph, ex, opset)
    try:
        onnx.checker.check_model(model, full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as exc:
        raise OnnxExportError(_checker_failure(graph, str(exc))) from None
    if path is not None:
        onnx.save(model, os.fspath(path))
    return model


def _checker_failure(graph: GraphDef, message: str) -> str:
    """The checker's complaint, naming the op whose nodes it is about (a dtype its ONNX
    counterpart lacks, such as Neg of uint8), as the node names say (``op3:negative/...``)."""
    found = re.search(r"node name: op(\d+):", message)
    if found is None:
        return f"the exported model fails ONNX's checker: {message}"
    index = int(found[1])
    return (
        f"cannot export op {index} ({graph.ops[index].describe()}) to ONNX: its nodes fail "
        f"ONNX's checker: {message}"
    )


def _import_onnx() -> Any:
    try:
        import onnx
    except ImportError as exc:
        raise ImportError(
            "exporting to ONNX needs the onnx package: pip install 'tensorwire[onnx]'"
        ) from exc
    return onnx


def _constant_arrays(
    graph: GraphDef, constants: Sequence[np.ndarray[Any, Any]]
) -> list[np.ndarray[Any, Any]]:
    """``constants``, checked against the graph's declarations, in wire (little-endian) order."""
    if len(constants) != len(graph.constants):
        raise OnnxExportError(
            f"the graph declares {len(graph.constants)} constants; {len(constants)} were given"
        )
    arrays = []
    for k, (declared, value) in enumerate(zip(graph.constants, constants, strict=True)):
        array = np.asarray(value)
        try:
            dtype = from_numpy(array.dtype)
        except TypeError as exc:
            raise OnnxExportError(f"constant {k} (#{declared.id}): {exc}") from None
        if (array.shape, dtype) != (declared.shape, declared.dtype):
            raise OnnxExportError(
                f"constant {k} (#{declared.id}) is declared {declared.shape} {declared.dtype}, "
                f"given {array.shape} {dtype}"
            )
        arrays.append(array.astype(to_numpy(dtype), copy=False))
    return arrays


def _batch_names(graph: GraphDef, dynamic_batch: DynamicBatch) -> list[str] | None:
    """The inputs whose dimension 0 is the batch; None for a static export."""
    if dynamic_batch is False:
        return None
    if dynamic_batch is True:
        return [t.name for t in graph.inputs[:1]]
    return [dynamic_batch] if isinstance(dynamic_batch, str) else list(dynamic_batch)


def _convert(
    graph: GraphDef,
    arrays: list[np.ndarray[Any, Any]],
    check: GraphCheck,
    batch_names: list[str] | None,
) -> Export:
    """Every op as ONNX nodes, in order; the declared names reserved for inputs and outputs.
    With ``batch_names``, each op's batch rule (``_onnx_batch``) runs before its converter."""
    names = {t.name for t in [*graph.inputs, *graph.outputs]}
    ex = Export(dict(check.metas), names)
    trace = None
    if batch_names is not None:
        try:
            trace = BatchTrace(graph, ex.metas, batch_names)
        except BatchDependent as exc:
            raise DynamicBatchError(f"cannot export with a dynamic batch: {exc}") from None
        ex.batch, ex.batch_source = trace.batch, trace.source
    for tensor in graph.inputs:
        ex.names[tensor.id] = tensor.name
    for declared, array in zip(graph.constants, arrays, strict=True):
        name = f"constant_{declared.id}"
        ex.names[declared.id] = ex.constant(array, ex.fresh(name) if name in names else name)
    for index, op in enumerate(graph.ops):
        convert = CONVERTERS.get(type(op))
        ex.node_prefix = f"op{index}:{op.name()}"
        try:
            if convert is None:
                raise NoCounterpart("no counterpart")
            if trace is not None:
                trace.step(index, op)
            convert(ex, op)
        except NoCounterpart as exc:
            raise OnnxExportError(
                f"cannot export op {index} ({op.describe()}) to ONNX: {exc}"
            ) from None
        except BatchDependent as exc:
            raise DynamicBatchError(
                f"cannot export op {index} ({op.describe()}) with a dynamic batch: {exc}"
            ) from None
    for tensor in graph.outputs:
        ex.nodes.append(_identity(ex.value(tensor.id), tensor.name))
    return ex


def _identity(value: str, name: str) -> onnx.NodeProto:
    from onnx import helper

    return helper.make_node("Identity", [value], [name], name=f"output:{name}")


def _model(graph: GraphDef, ex: Export, opset: int) -> onnx.ModelProto:
    from onnx import helper

    clash = {t.name for t in graph.inputs} & {t.name for t in graph.outputs}
    if clash:
        raise OnnxExportError(
            f"{sorted(clash)[0]!r} names both an input and an output; ONNX names each value once"
        )
    proto = helper.make_graph(
        ex.nodes,
        "tensorwire",
        [_value_info(t, ex.batch.get(t.id)) for t in graph.inputs],
        [_value_info(t, ex.batch.get(t.id)) for t in graph.outputs],
        initializer=ex.initializers,
    )
    opset_id = helper.make_opsetid("", opset)
    model = helper.make_model(proto, opset_imports=[opset_id], producer_name="tensorwire")
    # the oldest IR version that carries this opset, so older runtimes load the file too
    model.ir_version = helper.find_min_ir_version_for([opset_id])
    return model


def _value_info(tensor: GraphTensor, batch: Batch | None) -> onnx.ValueInfoProto:
    """A declared input's or output's type; where it holds the batch, that dimension is
    symbolic (``batch``, or ``3*batch`` where the batch was merged with an axis of 3)."""
    from onnx import helper

    shape: list[int | str] = list(tensor.shape)
    if batch is not None:
        shape[batch.axis] = BATCH if batch.factor == 1 else f"{batch.factor}*{BATCH}"
    return helper.make_tensor_value_info(tensor.name, onnx_dtype(tensor.dtype), shape)


# --- in-place writes --------------------------------------------------------------------------


def _view_base(op: AnyOp) -> int | None:
    """The input whose memory ``op``'s output may share on the server (numpy decides), or
    None for an op that always makes a new array."""
    if isinstance(op, GetItem) and not any(isinstance(k, ArrayIndex) for k in op.key):
        return op.x
    if isinstance(op, Reshape | PermuteDims | Axes | MoveAxis | BroadcastTo):
        return op.x
    if isinstance(op, Unary) and op.op == "real":
        return op.x
    return None


def _refuse_hidden_writes(graph: GraphDef, check: GraphCheck) -> None:
    """Refuse an in-place write that something else would see: an input's or a constant's
    memory, or that of a tensor made before the write and read after it (views share memory
    on the server, as in numpy). An ONNX value cannot change, so only the target's new name
    would see it."""
    declared = {t.id: f"input {t.name!r}" for t in graph.inputs}
    declared |= {c.id: f"constant #{c.id}" for c in graph.constants}
    made = dict.fromkeys(declared, -1)  # id -> the op that made it
    family = {i: [i] for i in declared}  # id -> every id that may share its memory
    read_at_end = {t.id: len(graph.ops) for t in graph.outputs}
    for index, op in enumerate(graph.ops):
        if not op.inplace:
            base = _view_base(op)
            for out in op.outputs():
                made[out] = index
                family[out] = family[base] if base is not None else []
                family[out].append(out)
            continue
        for other in family[op.out]:
            why = declared.get(other)
            last_read = max(check.last_use.get(other, -1), read_at_end.get(other, -1))
            if why is None and other != op.out and made[other] < index < last_read:
                why = f"#{other}, read afterwards,"
            if why is not None:
                raise OnnxExportError(
                    f"cannot export op {index} ({op.describe()}) to ONNX: it writes in place "
                    f"into memory that {why} shares; ONNX values never change"
                )
