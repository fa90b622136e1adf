"""Export a graph (:class:`protocol.graphs.GraphDef` and its constants) to ONNX, the standard
exchange format for computation graphs, which onnxruntime and most inference engines run.

The graph's declared inputs and outputs become the ONNX graph's, under the same names, shapes
and dtypes; its constants become initializers; each op becomes the nodes that compute what the
server computes for it (numpy's results and dtypes, ``server/executor/``). ONNX assigns each
value once, so an in-place op gives its target a new value name; an in-place write that numpy
would make visible through a view (``v = x[0:2]; v += 1`` changes ``x``) or in an input or a
constant cannot be expressed that way, and is refused. Ops with no exact counterpart (linalg,
fft, searching, ``cumulative_prod``, ...) are refused too, by :class:`OnnxExportError` naming
the op.

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

from ._onnx_builder import Converter, Export, NoCounterpart, onnx_dtype
from ._onnx_ops import ELEMENTWISE
from ._onnx_shapes import SHAPES

if TYPE_CHECKING:
    import onnx

MIN_OPSET = 18  # every Reduce* takes its axes as an input from 18 on: one form to emit
CONVERTERS: dict[type, Converter] = {**ELEMENTWISE, **SHAPES}


class OnnxExportError(ValueError):
    """A graph that ONNX cannot express as the server runs it: an op with no counterpart, an
    in-place write through a view, constants that do not match the graph."""


def to_onnx(
    graph: GraphDef,
    constants: Sequence[np.ndarray[Any, Any]],
    path: str | os.PathLike[str] | None = None,
    opset: int = 18,
) -> onnx.ModelProto:
    """The ONNX model of ``graph``, whose constants' values are ``constants`` (in the graph's
    order); written to ``path`` too, when given. The model passes ``onnx.checker`` (full check,
    with shape inference), at the default domain's ``opset``.

    Raises:
        ImportError: the ``onnx`` package is not installed.
        GraphError: ``graph`` does not hold together (:func:`~protocol.graphs.check_graph`).
        OnnxExportError: an op with no ONNX counterpart (named, with its index), an in-place
            write ONNX cannot express, constants that do not match the graph's, or a model
            ONNX's checker refuses.
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
    _refuse_hidden_writes(graph, check)
    ex = _convert(graph, arrays, check)
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


def _convert(graph: GraphDef, arrays: list[np.ndarray[Any, Any]], check: GraphCheck) -> Export:
    """Every op as ONNX nodes, in order; the declared names reserved for inputs and outputs."""
    names = {t.name for t in [*graph.inputs, *graph.outputs]}
    ex = Export(dict(check.metas), names)
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
            convert(ex, op)
        except NoCounterpart as exc:
            raise OnnxExportError(
                f"cannot export op {index} ({op.describe()}) to ONNX: {exc}"
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
        [_value_info(t) for t in graph.inputs],
        [_value_info(t) for t in graph.outputs],
        initializer=ex.initializers,
    )
    opset_id = helper.make_opsetid("", opset)
    model = helper.make_model(proto, opset_imports=[opset_id], producer_name="tensorwire")
    # the oldest IR version that carries this opset, so older runtimes load the file too
    model.ir_version = helper.find_min_ir_version_for([opset_id])
    return model


def _value_info(tensor: GraphTensor) -> onnx.ValueInfoProto:
    from onnx import helper

    return helper.make_tensor_value_info(tensor.name, onnx_dtype(tensor.dtype), tensor.shape)


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
