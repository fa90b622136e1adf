"""Creation ops: ``from_buffer`` (an upload), ``full``, ``arange``, ``eye``, ``linspace``."""

from __future__ import annotations

import math
from typing import Annotated, Literal

from pydantic import Field

from ..dtypes import DType, to_numpy
from ..errors import OpDTypeError, OpShapeError
from ..scalars import Scalar, check_fits, scalar_to_python
from .base import I64, BaseOp, Dim, TensorMeta, check_shape, numel


class FromBuffer(BaseOp):
    """A tensor whose bytes travel in buffer number ``buffer`` of the same message."""

    kind: Literal["from_buffer"] = "from_buffer"
    shape: tuple[Dim, ...]
    dtype: DType
    buffer: Annotated[int, Field(ge=0, lt=2**63)]

    def infer(self, *args: TensorMeta) -> TensorMeta:
        return TensorMeta(check_shape(self.shape), self.dtype)

    def nbytes(self) -> int:
        return numel(self.shape) * to_numpy(self.dtype).itemsize


class Full(BaseOp):
    """``full(shape, value, dtype)``; zeros and ones are fulls."""

    kind: Literal["full"] = "full"
    shape: tuple[Dim, ...]
    dtype: DType
    value: Scalar

    def infer(self, *args: TensorMeta) -> TensorMeta:
        check_fits(scalar_to_python(self.value), self.dtype)
        return TensorMeta(check_shape(self.shape), self.dtype)


class Arange(BaseOp):
    kind: Literal["arange"] = "arange"
    start: I64 | float
    stop: I64 | float
    step: I64 | float = 1
    dtype: DType

    def length(self) -> int:
        if self.step == 0:
            raise OpShapeError("arange step must not be zero")
        if all(isinstance(v, int) for v in (self.start, self.stop, self.step)):
            return max(0, -(-(int(self.stop) - int(self.start)) // int(self.step)))
        span = (float(self.stop) - float(self.start)) / float(self.step)
        if not math.isfinite(span):
            raise OpShapeError("arange bounds must be finite")
        return max(0, math.ceil(span))

    def infer(self, *args: TensorMeta) -> TensorMeta:
        length = self.length()
        if self.dtype == "bool" and length > 2:  # numpy's and array_api_strict's rule
            raise OpDTypeError("arange produces bool only for a result of at most 2 elements")
        return TensorMeta((length,), self.dtype)


class Eye(BaseOp):
    kind: Literal["eye"] = "eye"
    n_rows: Dim
    n_cols: Dim
    k: I64 = 0
    dtype: DType

    def infer(self, *args: TensorMeta) -> TensorMeta:
        return TensorMeta((self.n_rows, self.n_cols), self.dtype)


class Linspace(BaseOp):
    kind: Literal["linspace"] = "linspace"
    start: float
    stop: float
    start_imag: float = 0.0
    stop_imag: float = 0.0
    num: Dim
    endpoint: bool = True
    dtype: DType

    def infer(self, *args: TensorMeta) -> TensorMeta:
        # every dtype, as numpy's: an integer one takes the floor of the values
        return TensorMeta((self.num,), self.dtype)
