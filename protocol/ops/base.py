"""What every op family shares: tensor metas, the id and integer types of the wire, the op base
classes, and the shape helpers of the inference rules.

Every op names its output id (``out``), chosen by the client, so no op waits for the server.
``op.infer_all(*input_metas)`` returns one :class:`TensorMeta` per output, or raises an
:class:`~protocol.errors.InvalidOpError`. The client runs it to know ``x.shape`` and ``x.dtype``
without a round trip; the server runs it again to check an op completely before numpy sees it
(ARCHITECTURE.md, invariants 3 and 4).
"""

from __future__ import annotations

import math
from typing import Annotated, ClassVar, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ..dtypes import DType
from ..errors import OpAxisError, OpShapeError

MAX_NDIM = 64  # numpy's own limit
UNKNOWN = -1  # a dimension that only running the op tells (nonzero, unique_*, boolean masks)
TensorId = Annotated[int, Field(ge=0, lt=2**63)]
Dim = Annotated[int, Field(ge=0, lt=2**63)]
I64 = Annotated[int, Field(ge=-(2**63), lt=2**63)]  # any other integer on the wire: no bignums


class TensorMeta(NamedTuple):
    """What the client knows of a tensor without asking: its shape and dtype."""

    shape: tuple[int, ...]
    dtype: DType


class BaseOp(BaseModel):
    """One op of the catalogue: a frozen, strict model discriminated by ``kind``."""

    model_config = ConfigDict(
        frozen=True, extra="forbid", strict=True, ser_json_inf_nan="constants"
    )
    kind: str
    out: TensorId
    # An in-place op replaces the tensor stored under ``out``, which must exist (and is also
    # its first input); every other op creates ``out``, which must not exist yet.
    inplace: ClassVar[bool] = False

    def inputs(self) -> tuple[int, ...]:
        """The tensor ids this op reads, in the order :meth:`infer` takes their metas."""
        return ()

    def outputs(self) -> tuple[int, ...]:
        """The tensor ids this op writes, in the order :meth:`infer_all` describes them."""
        return (self.out,)

    def infer(self, *args: TensorMeta) -> TensorMeta:
        raise NotImplementedError

    def infer_all(self, *args: TensorMeta) -> tuple[TensorMeta, ...]:
        """One meta per output. A dimension of :data:`UNKNOWN` is data-dependent."""
        return (self.infer(*args),)

    def name(self) -> str:
        """The op's name: its ``op`` field where the family has one, else its kind."""
        return getattr(self, "op", None) or self.kind

    def describe(self) -> str:
        """One line naming the op, for error messages: ``matmul(#3, #4) -> #5``."""
        args = ", ".join(f"#{i}" for i in self.inputs())
        outs = ", ".join(f"#{i}" for i in self.outputs())
        return f"{self.name()}({args}) -> {outs}"


class MultiOutputOp(BaseOp):
    """An op with several outputs: the first is named in ``out``, the others in ``more``."""

    more: tuple[TensorId, ...] = ()

    @model_validator(mode="after")
    def _distinct_outputs(self) -> MultiOutputOp:
        self.check_joined()
        return self

    def check_joined(self) -> None:
        """Two outputs cannot share an id: the message is malformed (refused at decode; also
        when the op was validated in parts, ``protocol/stepwise.py``). Raises ValueError."""
        if len(set(self.outputs())) != len(self.outputs()):
            raise ValueError(f"output ids {list(self.outputs())} are not distinct")

    def outputs(self) -> tuple[int, ...]:
        return (self.out, *self.more)

    def infer_all(self, *args: TensorMeta) -> tuple[TensorMeta, ...]:
        metas = self._infer_all(*args)
        if len(metas) != len(self.outputs()):
            raise OpShapeError(
                f"{self.describe()} has {len(metas)} outputs; {len(self.outputs())} ids given"
            )
        return metas

    def _infer_all(self, *args: TensorMeta) -> tuple[TensorMeta, ...]:
        raise NotImplementedError

    def infer(self, *args: TensorMeta) -> TensorMeta:
        return self.infer_all(*args)[0]


# --- shape helpers --------------------------------------------------------------------------


def normalize_axis(axis: int, ndim: int) -> int:
    """``axis`` in ``0..ndim-1``. Raises :class:`OpAxisError` when it is out of range."""
    if not -ndim <= axis < ndim:
        raise OpAxisError(f"axis {axis} is out of bounds for an array of {ndim} dimensions")
    return axis % ndim


def normalize_axes(axes: tuple[int, ...] | None, ndim: int) -> tuple[int, ...]:
    """Every axis normalized (None: all of them). Raises on a repeated or bad axis."""
    if axes is None:
        return tuple(range(ndim))
    norm = tuple(normalize_axis(a, ndim) for a in axes)
    if len(set(norm)) != len(norm):
        raise OpShapeError(f"repeated axis in {axes}")
    return norm


def check_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
    """``shape``, if numpy can make it. Raises :class:`OpShapeError` otherwise."""
    if len(shape) > MAX_NDIM:
        raise OpShapeError(f"{len(shape)} dimensions exceed the limit of {MAX_NDIM}")
    if any(d < 0 for d in shape):
        raise OpShapeError(f"negative dimension in shape {shape}")
    return shape


def broadcast_shapes(*shapes: tuple[int, ...]) -> tuple[int, ...]:
    """numpy broadcasting, computed with Python ints."""
    if len(shapes) == 2:  # the common cases, on the pipelined hot path: no loop for them
        a, b = shapes
        if a == b or not b:  # equal shapes, or a 0-d operand (a Python scalar's)
            return a
        if not a:
            return b
    ndim = max((len(s) for s in shapes), default=0)
    out: list[int] = []
    for i in range(-ndim, 0):
        dims = {s[i] for s in shapes if len(s) >= -i} - {1}
        if len(dims) > 1:
            together = " ".join(map(str, shapes))  # numpy's words, which libraries' tests match
            raise OpShapeError(f"operands could not be broadcast together with shapes {together}")
        out.append(dims.pop() if dims else 1)
    return tuple(out)


def reduced_shape(shape: tuple[int, ...], axes: tuple[int, ...], keepdims: bool) -> tuple[int, ...]:
    """``shape`` reduced along the normalized ``axes`` (kept as 1s with ``keepdims``)."""
    if keepdims:
        return tuple(1 if i in axes else d for i, d in enumerate(shape))
    return tuple(d for i, d in enumerate(shape) if i not in axes)


def numel(shape: tuple[int, ...]) -> int:
    return math.prod(shape)
