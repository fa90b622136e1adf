"""The ONNX graph that an export builds, shared by the op converters (:mod:`._onnx_ops`,
:mod:`._onnx_shapes`, :mod:`._onnx_nn`): :class:`Export` holds the nodes, the initializers and
the value name each graph id has now, and, with a dynamic batch, where the batch is in each
(:class:`Batch`, from the rules of :mod:`._onnx_batch`); a converter that finds no exact
counterpart raises :class:`NoCounterpart`.

``onnx`` is imported where a node or a tensor is made, not here: the export is optional, and
this module loads without it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from protocol.dtypes import DType, to_numpy
from protocol.ops import SliceSpec, TensorMeta

if TYPE_CHECKING:
    from onnx import NodeProto, TensorProto

INT64_MIN = -(2**63)  # a Slice end before index 0, for a negative step
INT64_MAX = 2**63 - 1  # a Slice end past the last index, whatever the size


class NoCounterpart(Exception):
    """The op has no exact ONNX counterpart; the message says why."""


class Batch(NamedTuple):
    """Where the batch is in an array, in an export with a dynamic batch: axis ``axis`` has
    ``factor`` times the batch's size, batch element ``b`` owning the ``factor`` indices from
    ``b * factor`` on (a reshape of (B, T) to (B * T,) makes factor T)."""

    axis: int
    factor: int = 1


def batch_bounds(item: int | SliceSpec, n: int) -> tuple[int, int, int] | None:
    """The Slice bounds that take ``item`` from an axis holding the batch (of ``n`` now)
    whatever its size, or None where there are none: a slice that covers the whole batch,
    forwards or backwards (one reaching past its end, ``x[:n]``, included), and an integer,
    kept negative as given (``x[-1]`` is the last one of any batch)."""
    if isinstance(item, int):
        return item, item + 1 if item != -1 else INT64_MAX, 1
    bounds = item.to_slice().indices(n)
    if bounds == (0, n, 1):
        return 0, INT64_MAX, 1
    if bounds == (n - 1, -1, -1):
        return -1, INT64_MIN, -1
    return None


class Export:
    """The ONNX graph being built: its nodes and initializers, and the value name each graph id
    has now (an in-place op gives its target a new one: ONNX values are assigned once)."""

    def __init__(self, metas: dict[int, TensorMeta], reserved: set[str]) -> None:
        self.metas = metas
        self.names: dict[int, str] = {}
        self.nodes: list[NodeProto] = []
        self.initializers: list[TensorProto] = []
        self.node_prefix = ""
        self.batch: dict[int, Batch] = {}  # with a dynamic batch: the ids that carry it
        self.batch_source: str | None = None  # the input whose dimension 0 is the batch
        self._batch_size: str | None = None
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

    def shape(self, shape: Sequence[int], batch: Batch | None) -> str:
        """``shape`` as a 1-D int64 value, for the ops that take one: a constant, or, with the
        batch at ``batch.axis``, the batch's size (times the factor) read at run time there."""
        if batch is None:
            return self.ints(shape)
        size = self.batch_size()
        if batch.factor != 1:
            size = self.node("Mul", [size, self.ints([batch.factor])])
        before, after = shape[: batch.axis], shape[batch.axis + 1 :]
        parts = [*([self.ints(before)] if before else []), size]
        return self.node("Concat", [*parts, *([self.ints(after)] if after else [])], axis=0)

    def shape_of(self, tensor_id: int) -> str:
        """The shape of graph tensor ``tensor_id``, as :meth:`shape` gives it."""
        return self.shape(self.metas[tensor_id].shape, self.batch.get(tensor_id))

    def batch_size(self) -> str:
        """The batch's size, a 1-D int64 value of one element read from the batch's input (a
        node made once, where it is first needed: it reads a graph input only)."""
        if self._batch_size is None:
            assert self.batch_source is not None, "no dynamic batch in this export"
            self._batch_size = self.node("Shape", [self.batch_source], start=0, end=1)
        return self._batch_size

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
