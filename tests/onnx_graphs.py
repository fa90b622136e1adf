"""Graphs written op by op for the ONNX export's tests (``tests/test_onnx_export.py``,
``tests/test_onnx_nn.py``): a :class:`Builder` gives each op's output the next graph-relative
id, as a capture records them; :func:`export_and_compare` exports the graph, runs it on
onnxruntime and compares it with the server's numpy runners (``server.executor``) on the same
inputs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
import onnxruntime

from client.capture.onnx import to_onnx
from protocol.dtypes import DType, from_numpy
from protocol.graphs import GraphConstant, GraphDef, GraphTensor, check_graph
from protocol.ops import TensorMeta
from protocol.ops.base import BaseOp
from server import executor

Array = np.ndarray[Any, Any]
RTOL = {"float32": 1e-5, "float64": 1e-12}
RNG = np.random.default_rng(16)


class Builder:
    """A graph written op by op: each op's output gets the next graph-relative id."""

    def __init__(self) -> None:
        self.inputs: list[GraphTensor] = []
        self.constants: list[GraphConstant] = []
        self.arrays: list[Array] = []
        self.feeds: dict[str, Array] = {}
        self.ops: list[BaseOp] = []
        self._next = 0

    def _id(self) -> int:
        self._next += 1
        return self._next - 1

    def input(self, name: str, array: Array) -> int:
        i = self._id()
        self.inputs.append(
            GraphTensor(name=name, id=i, shape=array.shape, dtype=from_numpy(array.dtype))
        )
        self.feeds[name] = array
        return i

    def constant(self, array: Array) -> int:
        i = self._id()
        self.constants.append(GraphConstant(id=i, shape=array.shape, dtype=from_numpy(array.dtype)))
        self.arrays.append(array)
        return i

    def op(self, make: Callable[[int], BaseOp]) -> int:
        out = self._id()
        self.ops.append(make(out))
        return out

    def inplace(self, op: BaseOp) -> None:
        self.ops.append(op)

    def graph(self, **outputs: int) -> GraphDef:
        fields: dict[str, Any] = {
            "inputs": self.inputs,
            "constants": self.constants,
            "ops": self.ops,
        }
        metas = check_graph(GraphDef(**fields)).metas
        declared = [
            GraphTensor(name=name, id=i, shape=metas[i].shape, dtype=metas[i].dtype)
            for name, i in outputs.items()
        ]
        graph = GraphDef(**fields, outputs=declared)
        check_graph(graph)
        return graph


def run_numpy(graph: GraphDef, arrays: list[Array], feeds: dict[str, Array]) -> dict[str, Array]:
    """The graph run by the server's runners, op by op, each result a new array."""
    values: dict[int, Array] = {t.id: feeds[t.name] for t in graph.inputs}
    values |= {c.id: a for c, a in zip(graph.constants, arrays, strict=True)}
    for op in graph.ops:
        args = [values[i] for i in op.inputs()]
        metas = op.infer_all(*(TensorMeta(a.shape, from_numpy(a.dtype)) for a in args))
        values.update(zip(op.outputs(), executor.run(op, args, [], metas), strict=True))
    return {t.name: values[t.id] for t in graph.outputs}


def run_onnx(model: onnx.ModelProto, feeds: dict[str, Array]) -> dict[str, Array]:
    options = onnxruntime.SessionOptions()
    options.log_severity_level = 3  # errors only: a session warns about unused initializers
    session = onnxruntime.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(None, feeds), strict=True))


def assert_same(got: Array, want: Array, scale: float = 0.0) -> None:
    """Equal shapes and dtypes; equal values, within the float tolerance relative to each
    value, or to ``scale`` where a result is a difference of operands that large (an ulp of
    those survives the cancellation)."""
    assert (got.shape, got.dtype) == (want.shape, want.dtype)
    dtype: DType = from_numpy(want.dtype)
    if dtype in RTOL:
        np.testing.assert_allclose(got, want, rtol=RTOL[dtype], atol=RTOL[dtype] * scale)
    else:
        np.testing.assert_array_equal(got, want)


def export_and_compare(b: Builder, scale: float = 0.0, **outputs: int) -> onnx.ModelProto:
    graph = b.graph(**outputs)
    model = to_onnx(graph, b.arrays)
    got, want = run_onnx(model, b.feeds), run_numpy(graph, b.arrays, b.feeds)
    assert list(got) == list(outputs)
    for name in outputs:
        assert_same(got[name], want[name], scale)
    return model


def floats(*shape: int, dtype: str = "float32", low: float = -2, high: float = 2) -> Array:
    return RNG.uniform(low, high, shape).astype(dtype)
