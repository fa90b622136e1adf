"""The ONNX graph that an export builds, shared by the op converters (:mod:`._onnx_ops`,
:mod:`._onnx_shapes`): :class:`Export` holds the nodes, the initializers and the value name each
graph id has now; a converter that finds no exact counterpart raises :class:`NoCounterpart`.

``onnx`` is imported where a node or a tensor is made, not here: the export is optional, and
this module loads without it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from protocol.dtypes import DType, to_numpy
from protocol.ops import TensorMeta

if TYPE_CHECKING:
    from onnx import NodeProto, TensorProto

INT64_MIN = -(2**63)  # a Slice end before index 0, for a negative step


class NoCounterpart(Exception):
    """The op has no exact ONNX counterpart; the message says why."""


class Export:
    """The ONNX graph being built: its nodes and initializers, and the value name each graph id
    has now (an in-place op gives its target a new one: ONNX values are assigned once)."""

    def __init__(self, metas: dict[int, TensorMeta], reserved: set[str]) -> None:
        self.metas = metas
        self.names: dict[int, str] = {}
        self.nodes: list[NodeProto] = []
        self.initializers: list[TensorProto] = []
        self.node_prefix = ""
        self._taken = set(reserved)  # the declared names, which no made-up name may take
        self._count = 0

    def fresh(self, hint: str) -> str:
        """A value name not used yet."""
        while True:
            self._count += 1
            name = f"{hint}_{self._count}"
            if name not in self._taken:
                self._taken.add(name)
                return name

    def value(self, tensor_id: int) -> str:
        return self.names[tensor_id]

    def constant(self, array: np.ndarray[Any, Any], name: str | None = None) -> str:
        """An initializer holding ``array``; its value name."""
        from onnx import numpy_helper

        name = name or self.fresh("const")
        self._taken.add(name)
        self.initializers.append(numpy_helper.from_array(np.asarray(array, order="C"), name))
        return name

    def ints(self, values: Sequence[int]) -> str:
        """A 1-D int64 initializer: the shapes, axes and indices ONNX takes as inputs."""
        return self.constant(np.asarray(values, dtype=np.int64).reshape(len(values)))

    def scalar(self, value: complex | float, dtype: DType) -> str:
        return self.constant(np.asarray(value, dtype=to_numpy(dtype)))

    def node(self, op_type: str, inputs: Sequence[str], outputs: int = 1, **attrs: Any) -> str:
        """Add one node; the name of its (first) output value."""
        return self.node_outputs(op_type, inputs, outputs, **attrs)[0]

    def node_outputs(
        self, op_type: str, inputs: Sequence[str], outputs: int, **attrs: Any
    ) -> list[str]:
        from onnx import helper

        names = [self.fresh(op_type.lower()) for _ in range(outputs)]
        label = f"{self.node_prefix}/{op_type}_{len(self.nodes)}"
        self.nodes.append(helper.make_node(op_type, inputs, names, name=label, **attrs))
        return names

    def cast(self, name: str, have: DType, want: DType) -> str:
        if have == want:
            return name
        return self.node("Cast", [name], to=onnx_dtype(want))


def onnx_dtype(dtype: DType) -> int:
    from onnx import helper

    return int(helper.np_dtype_to_tensor_dtype(to_numpy(dtype)))


Converter = Callable[[Export, Any], None]
