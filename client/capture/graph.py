"""``Graph``: a captured op stream with its constants, to save, load, inspect, replay on any
device, register on a server to run by id, and export to ONNX.

The file format is the protocol's own message layout (``protocol.codec``): a u32 length, the
graph as a versioned JSON header (``protocol.graphs.GraphDef``: ``"type": "graph"``,
``"format": 1``), then the constants' raw little-endian bytes. Loading validates the header
with the protocol's pydantic models and the whole graph with ``protocol.graphs.check_graph``
before anything can run it: nothing in a graph file is evaluated or unpickled.
"""

from __future__ import annotations

import math
import os
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from pydantic import TypeAdapter

from protocol import DecodeError, TensorMeta, to_numpy
from protocol.codec import byte_view, decode, encode
from protocol.errors import GraphError
from protocol.graphs import GraphCheck, GraphConstant, GraphDef, GraphTensor, check_graph, renumber
from protocol.ops import RunGraph
from protocol.ops.base import MAX_NDIM
from protocol.ops.graph import check_arguments

from .._building import upload
from ..device import Device, new_handle
from ..errors import GraphFileError

if TYPE_CHECKING:
    import onnx

    from ..array import RemoteArray

_FILE_ADAPTER: TypeAdapter[GraphDef] = TypeAdapter(GraphDef)
MAX_FILE_BYTES = 2**40  # a guard against a length that cannot be a graph, not a policy

Inputs = Mapping[str, Any] | Sequence[Any]


@dataclass(frozen=True)
class GraphSummary:
    """What a graph holds, for people: ``str()`` is a table."""

    ops: int
    op_counts: Counter[str]
    constants: int
    constant_bytes: int
    peak_bytes: int
    inputs: list[GraphTensor] = field(default_factory=list)
    outputs: list[GraphTensor] = field(default_factory=list)

    def __str__(self) -> str:
        rows = [
            ("ops", str(self.ops)),
            ("constants", f"{self.constants} ({_size(self.constant_bytes)})"),
            ("peak live tensor bytes", _size(self.peak_bytes)),
        ]
        rows += [(f"input {t.name}", _signature(t)) for t in self.inputs]
        rows += [(f"output {t.name}", _signature(t)) for t in self.outputs]
        rows += [
            (f"  {name}", str(n))
            for name, n in sorted(self.op_counts.items(), key=lambda kv: (-kv[1], kv[0]))
        ]
        width = max(len(k) for k, _ in rows)
        return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def _signature(tensor: GraphTensor) -> str:
    return f"{tensor.dtype}[{', '.join(map(str, tensor.shape))}]"


def _size(nbytes: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit} ({nbytes} B)"
    return f"{nbytes} B"


class Graph:
    """A graph (``definition``) and its constants' values, in the order it declares them."""

    def __init__(self, definition: GraphDef, constants: Sequence[np.ndarray[Any, Any]]) -> None:
        if len(constants) != len(definition.constants):
            raise GraphError(
                f"the graph declares {len(definition.constants)} constants; {len(constants)} given"
            )
        self.definition = definition
        self.constants = list(constants)

    def __repr__(self) -> str:
        names = ", ".join(t.name for t in self.inputs)
        outs = ", ".join(t.name for t in self.outputs)
        return f"Graph(({names}) -> ({outs}), {len(self.definition.ops)} ops)"

    @property
    def inputs(self) -> list[GraphTensor]:
        return self.definition.inputs

    @property
    def outputs(self) -> list[GraphTensor]:
        return self.definition.outputs

    @cached_property
    def check(self) -> GraphCheck:
        """Every id's meta, last uses, the peak of live bytes (``protocol.graphs``)."""
        return check_graph(self.definition)

    def summary(self) -> GraphSummary:
        return GraphSummary(
            ops=len(self.definition.ops),
            op_counts=Counter(op.name() for op in self.definition.ops),
            constants=len(self.constants),
            constant_bytes=sum(c.nbytes for c in self.definition.constants),
            peak_bytes=self.check.peak_bytes,
            inputs=list(self.inputs),
            outputs=list(self.outputs),
        )

    def constant_bytes(self) -> list[memoryview]:
        """The constants as the wire and the file carry them: little-endian, C order."""
        return [byte_view(np.asarray(c, dtype=c.dtype.newbyteorder("<"))) for c in self.constants]

    # --- files ----------------------------------------------------------------------------------

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the graph and its constants to ``path`` (see the module docstring)."""
        with open(path, "wb") as file:
            for chunk in encode(self.definition, self.constant_bytes()):
                file.write(chunk)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Graph:
        """The graph in ``path``, validated whole before it is returned.

        Raises:
            GraphFileError: the file is not a graph of this format, is truncated or has bytes
                to spare, or holds a graph that does not hold together.
            OSError: the file cannot be read.
        """
        size = Path(path).stat().st_size
        if size > MAX_FILE_BYTES:
            raise GraphFileError(f"{path}: {size} bytes is not a graph file")
        data = Path(path).read_bytes()
        if len(data) < 4 or 4 + int.from_bytes(data[:4], "little") > len(data):
            raise GraphFileError(f"{path} is not a Tensorwire graph file: truncated header")
        try:
            definition, buffers = decode(_FILE_ADAPTER, data)
        except DecodeError as exc:
            raise GraphFileError(f"{path} is not a Tensorwire graph file: {exc}") from None
        try:
            check_graph(definition)
        except GraphError as exc:
            raise GraphFileError(
                f"{path} holds a graph that does not hold together: {exc}"
            ) from None
        try:
            for constant in definition.constants:
                _check_makeable(constant)
        except GraphError as exc:
            raise GraphFileError(
                f"{path} holds a graph that does not hold together: {exc}"
            ) from None
        constants = [
            np.frombuffer(buffer, dtype=to_numpy(c.dtype).newbyteorder("<")).reshape(c.shape).copy()
            for c, buffer in zip(definition.constants, buffers, strict=True)
        ]
        return cls(definition, constants)

    # --- running it -----------------------------------------------------------------------------

    def bind(self, device: Device, inputs: Inputs) -> list[RemoteArray]:
        """``inputs`` (by name, or in the declared order) as arrays of ``device``, checked
        against the signature; numpy values are uploaded.

        Raises:
            GraphError: a missing, unknown or mismatched input.
        """
        if isinstance(inputs, Mapping):
            unknown = set(inputs) - {t.name for t in self.inputs}
            if unknown:
                raise GraphError(f"the graph has no input {sorted(unknown)[0]!r}")
            missing = [t.name for t in self.inputs if t.name not in inputs]
            if missing:
                raise GraphError(f"input {missing[0]!r} is not given")
            values = [inputs[t.name] for t in self.inputs]
        else:
            values = list(inputs)
            if len(values) != len(self.inputs):
                raise GraphError(f"the graph takes {len(self.inputs)} inputs; {len(values)} given")
        arrays = [_on_device(v, device, t.name) for v, t in zip(values, self.inputs, strict=True)]
        check_arguments(
            "the graph", [(t.name, t.meta) for t in self.inputs], [a.meta for a in arrays]
        )
        return arrays

    def replay(self, device: Device, inputs: Inputs) -> dict[str, RemoteArray]:
        """Run the graph's ops on ``device`` (any device: remote, local, another capture) with
        ``inputs``; the outputs by name. The ops travel as ops (no registration): for a step
        run many times on one server, :meth:`register` it once instead."""
        arrays = self.bind(device, inputs)
        ids = {t.id: a.tensor_id for t, a in zip(self.inputs, arrays, strict=True)}
        held = [upload(np.asarray(c), device) for c in self.constants]
        ids.update(
            (c.id, h.tensor_id) for c, h in zip(self.definition.constants, held, strict=True)
        )
        made: list[int] = []
        for op in self.definition.ops:
            for graph_id in () if op.inplace else op.outputs():
                ids[graph_id] = device.new_id()
                made.append(ids[graph_id])
            device.submit(renumber(op, ids))
        metas = self.check.metas
        outputs = {t.name: new_handle(device, ids[t.id], metas[t.id]) for t in self.outputs}
        kept = {ids[t.id] for t in self.outputs}
        for tensor_id in made:
            if tensor_id not in kept:
                device.release(tensor_id)
        return outputs

    def register(self, device: Device) -> RegisteredGraph:
        """Register the graph in ``device``'s session (validated and shape-checked there once,
        its constants uploaded once); :meth:`RegisteredGraph.run` then runs it by id."""
        return RegisteredGraph(self, device)

    def to_onnx(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        dynamic_batch: bool | str | Sequence[str] = False,
    ) -> onnx.ModelProto:
        """The graph as an ONNX model (written to ``path`` if given). Needs the ``onnx`` extra.
        ``dynamic_batch``: True makes dimension 0 of the first input a symbolic batch, or name
        the inputs that hold it (:func:`client.capture.onnx.to_onnx`).

        Raises:
            OnnxExportError: an op has no ONNX counterpart; the error names it.
            DynamicBatchError: an op bakes the batch size in; the error names it and why.
        """
        from .onnx import to_onnx

        return to_onnx(self.definition, self.constants, path, dynamic_batch=dynamic_batch)


class RegisteredGraph:
    """A graph registered in one device's session: :meth:`run` costs one op on the wire."""

    def __init__(self, graph: Graph, device: Device) -> None:
        if not graph.outputs:  # run_graph names its outputs' ids, as any op does
            raise GraphError(
                "a graph run by id needs at least one output (replay() runs one without)"
            )
        self.graph = graph
        self.device = device
        self.graph_id = device.new_graph_id()
        self._signature = [(t.name, t.meta) for t in graph.inputs]
        self._metas = [t.meta for t in graph.outputs]
        self._names = [t.name for t in graph.outputs]
        device.register_graph(self.graph_id, graph.definition, graph.constant_bytes())
        self._dropped = False

    def run_raw(self, ids: Sequence[int], metas: Sequence[TensorMeta]) -> list[RemoteArray]:
        """Run with the tensors ``ids`` of the device (whose metas are ``metas``) bound to the
        inputs in the declared order; the outputs in the declared order. Checked locally
        first, as an op is; one op on the wire."""
        device = self.device
        outs = [device.new_id() for _ in self._metas]
        op = RunGraph(out=outs[0], more=tuple(outs[1:]), graph=self.graph_id, args=tuple(ids))
        out_metas = op.infer_signature(self._signature, self._metas, *metas)
        device.submit(op)
        return [new_handle(device, i, m) for i, m in zip(outs, out_metas, strict=True)]

    def run(self, inputs: Inputs) -> dict[str, RemoteArray]:
        """Run with ``inputs`` (by name or in order; numpy values are uploaded)."""
        arrays = self.graph.bind(self.device, inputs)
        outputs = self.run_raw([a.tensor_id for a in arrays], [a.meta for a in arrays])
        return dict(zip(self._names, outputs, strict=True))

    def drop(self) -> None:
        """Free the graph and its constants in the session. Idempotent."""
        if not self._dropped:
            self._dropped = True
            self.device.drop_graph(self.graph_id)

    def __del__(self) -> None:
        try:
            self.drop()
        except Exception:  # noqa: S110 - at interpreter exit the session ends anyway
            pass


def _check_makeable(constant: GraphConstant) -> None:
    """Refuse a constant whose shape numpy cannot make an array of: more than
    :data:`MAX_NDIM` dimensions, or nonzero dimensions whose product in bytes passes
    ``2**63 - 1`` (numpy refuses it even when another dimension is 0).

    Raises:
        GraphError: naming the constant.
    """
    nbytes = to_numpy(constant.dtype).itemsize * math.prod(d for d in constant.shape if d)
    if len(constant.shape) > MAX_NDIM or nbytes >= 2**63:
        raise GraphError(
            f"constant #{constant.id} is declared {constant.dtype}{list(constant.shape)}: numpy "
            f"cannot make an array of that shape ({MAX_NDIM} dimensions and 2**63 - 1 bytes at "
            "most)"
        )


def _on_device(value: Any, device: Device, name: str) -> RemoteArray:
    if getattr(value, "device", None) is device and hasattr(value, "tensor_id"):
        array: RemoteArray = value
        return array
    if hasattr(value, "tensor_id"):
        raise GraphError(f"input {name!r} is on {value.device!r}, not {device!r}")
    return upload(np.asarray(value), device)
