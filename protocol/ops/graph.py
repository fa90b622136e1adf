"""``run_graph``: run a graph the session registered (``protocol.graphs``) on new inputs.

One op stands for a whole captured step: its inputs are the tensors bound to the graph's
declared inputs, in order, and its outputs receive the graph's declared outputs, under ids the
client chose, as any op's. Its inference rule needs the graph's signature, which only the
session that registered it knows: :meth:`RunGraph.infer_signature` takes it; ``infer_all``
alone refuses.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Literal

from pydantic import Field

from ..dtypes import is_floating
from ..errors import InvalidOpError, OpDTypeError, OpShapeError
from .base import BaseOp, MultiOutputOp, TensorId, TensorMeta
from .creation import Full

GraphId = Annotated[int, Field(ge=0, lt=2**63)]


class RunGraph(MultiOutputOp):
    """Run registered graph ``graph`` with ``args`` bound to its inputs; its outputs go to
    ``out`` and ``more``, in the graph's output order."""

    kind: Literal["run_graph"] = "run_graph"
    graph: GraphId
    args: tuple[TensorId, ...]

    def inputs(self) -> tuple[int, ...]:
        return self.args

    def _infer_all(self, *args: TensorMeta) -> tuple[TensorMeta, ...]:
        raise InvalidOpError(
            f"{self.describe()}: run_graph is checked against its registered graph's signature"
        )

    def infer_signature(
        self,
        inputs: Sequence[tuple[str, TensorMeta]],
        outputs: Sequence[TensorMeta],
        *args: TensorMeta,
    ) -> tuple[TensorMeta, ...]:
        """The output metas, once ``args`` match the graph's declared ``inputs`` (name, meta)."""
        check_arguments(f"graph #{self.graph}", inputs, args)
        if len(outputs) != len(self.outputs()):
            raise OpShapeError(
                f"graph #{self.graph} has {len(outputs)} outputs; {len(self.outputs())} ids given"
            )
        return tuple(outputs)

    def describe(self) -> str:
        args = ", ".join(f"#{i}" for i in self.args)
        outs = ", ".join(f"#{i}" for i in self.outputs())
        return f"run_graph[{self.graph}]({args}) -> {outs}"


def check_arguments(
    graph: str, inputs: Sequence[tuple[str, TensorMeta]], args: Sequence[TensorMeta]
) -> None:
    """Refuse ``args`` unless they match the declared ``inputs`` (name, meta) one for one.

    Raises:
        OpShapeError, OpDTypeError: naming the first input that does not match.
    """
    if len(args) != len(inputs):
        raise OpShapeError(
            f"{graph} takes {len(inputs)} inputs ({', '.join(n for n, _ in inputs)}); "
            f"{len(args)} given"
        )
    for (name, want), got in zip(inputs, args, strict=True):
        if got.dtype != want.dtype:
            raise OpDTypeError(f"{graph}: input {name!r} is {want.dtype}, given {got.dtype}")
        if got.shape != want.shape:
            raise OpShapeError(f"{graph}: input {name!r} has shape {want.shape}, given {got.shape}")


class RunSegment(BaseOp):
    """Run registered graph ``graph`` as a *segment*: as if its ops came one by one, with the
    ids they had when the client first sent them (``client._segments``). The graph's declared
    inputs are numbered 0 to m - 1 and bound to ``args`` in order; any other id ``g`` of the
    graph stands for the tensor id ``out + g - m``, so ``out`` is the lowest id the segment
    makes. Its declared outputs are stored under those ids; the tensors it makes and does not
    declare are the segment's intermediates, which the client freed before it sent the segment
    (their frees travel in the batch all the same). Its outputs are known only to the session
    that registered the graph; ``infer_all`` alone refuses.

    ``scalars``: the values of the graph's ops that :func:`varies` (a learning rate a schedule
    writes every step), in op order, in place of the registered ones; none, or all of them."""

    kind: Literal["run_segment"] = "run_segment"
    graph: GraphId
    args: tuple[TensorId, ...]
    scalars: tuple[float, ...] = ()

    def inputs(self) -> tuple[int, ...]:
        return self.args

    def infer(self, *args: TensorMeta) -> TensorMeta:
        raise InvalidOpError(
            f"{self.describe()}: run_segment is checked against its registered graph's signature"
        )

    def describe(self) -> str:
        args = ", ".join(f"#{i}" for i in self.args)
        return f"run_segment[{self.graph}]({args}) -> from #{self.out}"


def varies(op: BaseOp) -> bool:
    """Whether ``op``'s value may change from one run of a segment to the next: a ``full`` of a
    float into a floating dtype, whose value changes no inference, cost or error (an integer
    may not fit its dtype, a NaN does not fit an integer one)."""
    return type(op) is Full and type(op.value) is float and is_floating(op.dtype)
