"""``Graph``: a captured op stream with its constants, to save, load, inspect, replay on any
device, register on a server to run by id, and export to ONNX.

A graph file (``graph_file.py``) is checked whole, with the protocol's pydantic models and
``protocol.graphs``' checks, before anything can run it: nothing in it is evaluated or
unpickled, and loading it takes memory in proportion to its size.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

import numpy as np

from protocol import TensorMeta
from protocol.codec import byte_view
from protocol.errors import GraphError
from protocol.graphs import GraphCheck, GraphDef, GraphTensor, check_graph, renumber
from protocol.ops import AnyOp, RunGraph
from protocol.ops.graph import check_arguments

from .._building import upload
from .._known import viewing
from ..device import Device, new_handle
from .graph_file import FileOps, read_graph_file, write_graph_file

if TYPE_CHECKING:
    import onnx

    from ..array import RemoteArray

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
        self._declared = definition  # its inputs, outputs and constants
        self._definition: GraphDef | None = definition
        self._file_ops: FileOps | None = None  # a loaded graph's ops, until ``definition``
        self._facts: tuple[Counter[str], int] | None = None  # op counts, peak bytes
        self.constants = list(constants)

    def __repr__(self) -> str:
        names = ", ".join(t.name for t in self.inputs)
        outs = ", ".join(t.name for t in self.outputs)
        return f"Graph(({names}) -> ({outs}), {self._op_count} ops)"

    @property
    def definition(self) -> GraphDef:
        """The whole graph. A loaded graph makes its ops' models on the first call (a model
        takes about ten times its JSON); inspecting or replaying it does not need them."""
        if self._definition is None:
            assert self._file_ops is not None
            self._definition = self._declared.model_copy(update={"ops": list(self._file_ops)})
            self._file_ops = None
        return self._definition

    @property
    def inputs(self) -> list[GraphTensor]:
        return self._declared.inputs

    @property
    def outputs(self) -> list[GraphTensor]:
        return self._declared.outputs

    @property
    def _op_count(self) -> int:
        return len(self.definition.ops) if self._file_ops is None else self._file_ops.count

    def _ops(self) -> Iterable[AnyOp]:
        """The ops in order: a loaded graph's made a piece at a time, and let go."""
        return self.definition.ops if self._file_ops is None else self._file_ops

    @cached_property
    def check(self) -> GraphCheck:
        """Every id's meta, last uses, the peak of live bytes (``protocol.graphs``)."""
        return check_graph(self.definition)

    def summary(self) -> GraphSummary:
        op_counts, peak_bytes = self._facts or (self.check.op_counts, self.check.peak_bytes)
        return GraphSummary(
            ops=self._op_count,
            op_counts=Counter(op_counts),
            constants=len(self.constants),
            constant_bytes=sum(c.nbytes for c in self._declared.constants),
            peak_bytes=peak_bytes,
            inputs=list(self.inputs),
            outputs=list(self.outputs),
        )

    def constant_bytes(self) -> list[memoryview]:
        """The constants as the wire and the file carry them: little-endian, C order."""
        return [byte_view(np.asarray(c, dtype=c.dtype.newbyteorder("<"))) for c in self.constants]

    # --- files ----------------------------------------------------------------------------------

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the graph and its constants to ``path`` (``graph_file.py``)."""
        write_graph_file(path, self.definition, self.constant_bytes())

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Graph:
        """The graph in ``path``, validated whole before it is returned.

        Raises:
            GraphFileError: the file is not a graph of this format, is truncated or has bytes
                to spare, or holds a graph that does not hold together.
            OSError: the file cannot be read.
        """
        loaded = read_graph_file(path)
        graph = cls(loaded.declared, loaded.constants)
        graph._definition, graph._file_ops = None, loaded.ops
        graph._facts = (loaded.op_counts, loaded.peak_bytes)
        return graph

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
        ids.update((c.id, h.tensor_id) for c, h in zip(self._declared.constants, held, strict=True))
        made: list[int] = []
        for op in self._ops():
            for graph_id in () if op.inplace else op.outputs():
                ids[graph_id] = device.new_id()
                made.append(ids[graph_id])
            device.submit(renumber(op, ids))
        outputs = {t.name: viewing(new_handle(device, ids[t.id], t.meta)) for t in self.outputs}
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
        return [viewing(new_handle(device, i, m)) for i, m in zip(outs, out_metas, strict=True)]

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


def _on_device(value: Any, device: Device, name: str) -> RemoteArray:
    if getattr(value, "device", None) is device and hasattr(value, "tensor_id"):
        array: RemoteArray = value
        return array
    if hasattr(value, "tensor_id"):
        raise GraphError(f"input {name!r} is on {value.device!r}, not {device!r}")
    return upload(np.asarray(value), device)
