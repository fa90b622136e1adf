"""``client.namespace(dev)``: an array namespace whose default device is ``dev``.

The functions follow the Python Array API standard's signatures; this issue's starting set is
creation, element-wise math and comparisons, where, reductions, reshape/permute, astype and
basic indexing. Dtypes are numpy dtype objects (``xp.float32 == np.dtype("float32")``).
"""

from __future__ import annotations

import builtins
import math
import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np

from protocol import to_numpy

from . import _functions as _f
from ._info import FInfo, IInfo, Info, finfo, iinfo, isdtype
from ._standard import StandardFunctions
from .array import RemoteArray
from .device import Device
from .linalg import FFTNamespace, LinalgNamespace

PyScalar = bool | int | float | complex


class Namespace(StandardFunctions):
    """Array functions with ``device`` as the default device for new arrays."""

    __array_api_version__ = "2024.12"

    bool = np.dtype("bool")
    int8 = np.dtype("int8")
    int16 = np.dtype("int16")
    int32 = np.dtype("int32")
    int64 = np.dtype("int64")
    uint8 = np.dtype("uint8")
    uint16 = np.dtype("uint16")
    uint32 = np.dtype("uint32")
    uint64 = np.dtype("uint64")
    float32 = np.dtype("float32")
    float64 = np.dtype("float64")
    complex64 = np.dtype("complex64")
    complex128 = np.dtype("complex128")
    e = math.e
    pi = math.pi
    inf = math.inf
    nan = math.nan
    newaxis = None

    def __init__(self, device: Device) -> None:
        self.device = device
        self.linalg = LinalgNamespace(device)
        self.fft = FFTNamespace(device)

    def __array_namespace_info__(self) -> Info:
        return Info(self.device)

    def __repr__(self) -> str:
        return f"Namespace({self.device!r})"

    def _dev(self, device: Device | None) -> Device:
        return self.device if device is None else device

    # --- creation -----------------------------------------------------------------------------

    def asarray(self, obj: Any, /, *, dtype: Any = None, device: Device | None = None,
                copy: builtins.bool | None = None) -> RemoteArray:  # fmt: skip
        """An array on ``device`` from an array, a nested sequence or a scalar."""
        dev = self._dev(device)
        if isinstance(obj, RemoteArray):
            if obj.device is not dev:
                obj = _f.upload(obj.numpy(), dev)
            if dtype is not None and obj.dtype != np.dtype(dtype):
                return _f.astype(obj, dtype)
            return _f.astype(obj, obj.dtype) if copy else obj
        if copy is False:
            raise ValueError("copy=False: a local object cannot reach the device without a copy")
        values = np.asarray(obj, dtype=None if dtype is None else np.dtype(dtype))
        return _f.upload(values, dev)

    def full(self, shape: int | Sequence[int], fill_value: PyScalar, *, dtype: Any = None,
             device: Device | None = None) -> RemoteArray:  # fmt: skip
        wire = _f.default_dtype(fill_value) if dtype is None else _f.wire_dtype(dtype)
        return _f.full(shape, fill_value, wire, self._dev(device))

    def zeros(self, shape: int | Sequence[int], *, dtype: Any = None,
              device: Device | None = None) -> RemoteArray:  # fmt: skip
        return self.full(shape, 0, dtype=self.float64 if dtype is None else dtype, device=device)

    def ones(self, shape: int | Sequence[int], *, dtype: Any = None,
             device: Device | None = None) -> RemoteArray:  # fmt: skip
        return self.full(shape, 1, dtype=self.float64 if dtype is None else dtype, device=device)

    def empty(self, shape: int | Sequence[int], *, dtype: Any = None,
              device: Device | None = None) -> RemoteArray:  # fmt: skip
        return self.zeros(shape, dtype=dtype, device=device)

    def full_like(self, x: RemoteArray, /, fill_value: PyScalar, *, dtype: Any = None,
                  device: Device | None = None) -> RemoteArray:  # fmt: skip
        return self.full(
            x.shape,
            fill_value,
            dtype=x.dtype if dtype is None else dtype,
            device=x.device if device is None else device,
        )

    def zeros_like(self, x: RemoteArray, /, *, dtype: Any = None,
                   device: Device | None = None) -> RemoteArray:  # fmt: skip
        return self.full_like(x, 0, dtype=dtype, device=device)

    def ones_like(self, x: RemoteArray, /, *, dtype: Any = None,
                  device: Device | None = None) -> RemoteArray:  # fmt: skip
        return self.full_like(x, 1, dtype=dtype, device=device)

    def empty_like(self, x: RemoteArray, /, *, dtype: Any = None,
                   device: Device | None = None) -> RemoteArray:  # fmt: skip
        return self.zeros_like(x, dtype=dtype, device=device)

    def arange(self, start: int | float, /, stop: int | float | None = None, step: int | float = 1,
               *, dtype: Any = None, device: Device | None = None) -> RemoteArray:  # fmt: skip
        wire = None if dtype is None else _f.wire_dtype(dtype)
        return _f.arange(start, stop, step, wire, self._dev(device))

    def eye(self, n_rows: int, n_cols: int | None = None, /, *, k: int = 0, dtype: Any = None,
            device: Device | None = None) -> RemoteArray:  # fmt: skip
        wire = "float64" if dtype is None else _f.wire_dtype(dtype)
        return _f.eye(n_rows, n_cols, k, wire, self._dev(device))

    # --- data types ---------------------------------------------------------------------------

    def astype(self, x: RemoteArray, dtype: Any, /, *, copy: builtins.bool = True,
               device: Device | None = None) -> RemoteArray:  # fmt: skip
        if device is not None and device is not x.device:
            x = self.asarray(x, device=device)
        if not copy and x.dtype == np.dtype(dtype):
            return x
        return _f.astype(x, dtype)

    def result_type(self, *arrays_and_dtypes: Any) -> np.dtype[Any]:
        """The standard's promotion; Python scalars are weak (they take the arrays' dtype
        where their kind fits)."""
        items = [a.dtype if isinstance(a, RemoteArray) else a for a in arrays_and_dtypes]
        dtypes = [np.dtype(a) for a in items if not isinstance(a, bool | int | float | complex)]
        scalars = [a for a in items if isinstance(a, bool | int | float | complex)]
        if not dtypes:
            raise TypeError("result_type needs at least one array or dtype")
        result = _f.wire_dtype(np.result_type(*dtypes))
        for value in scalars:
            result = _f.wire_dtype(np.result_type(result, _f.scalar_dtype(value, result)))
        return to_numpy(result)

    @staticmethod
    def can_cast(from_: Any, to: Any, /) -> builtins.bool:
        source = from_.dtype if isinstance(from_, RemoteArray) else from_
        return builtins.bool(np.can_cast(np.dtype(source), np.dtype(to), casting="safe"))

    @staticmethod
    def finfo(type: Any, /) -> FInfo:  # noqa: A002
        return finfo(type.dtype if isinstance(type, RemoteArray) else type)

    @staticmethod
    def iinfo(type: Any, /) -> IInfo:  # noqa: A002
        return iinfo(type.dtype if isinstance(type, RemoteArray) else type)

    @staticmethod
    def isdtype(dtype: Any, kind: Any) -> builtins.bool:
        return isdtype(dtype, kind)

    # --- element-wise -------------------------------------------------------------------------

    def where(self, condition: RemoteArray, x1: Any, x2: Any, /) -> RemoteArray:
        return _f.where(condition, x1, x2)

    @staticmethod
    def abs(x: RemoteArray, /) -> RemoteArray:
        return _f.unary("abs", x)

    @staticmethod
    def negative(x: RemoteArray, /) -> RemoteArray:
        return _f.unary("negative", x)

    @staticmethod
    def positive(x: RemoteArray, /) -> RemoteArray:
        return _f.unary("positive", x)

    @staticmethod
    def exp(x: RemoteArray, /) -> RemoteArray:
        return _f.unary("exp", x)

    @staticmethod
    def expm1(x: RemoteArray, /) -> RemoteArray:
        return _f.unary("expm1", x)

    @staticmethod
    def log(x: RemoteArray, /) -> RemoteArray:
        return _f.unary("log", x)

    @staticmethod
    def log1p(x: RemoteArray, /) -> RemoteArray:
        return _f.unary("log1p", x)

    @staticmethod
    def log2(x: RemoteArray, /) -> RemoteArray:
        return _f.unary("log2", x)

    @staticmethod
    def log10(x: RemoteArray, /) -> RemoteArray:
        return _f.unary("log10", x)

    @staticmethod
    def sqrt(x: RemoteArray, /) -> RemoteArray:
        return _f.unary("sqrt", x)

    @staticmethod
    def square(x: RemoteArray, /) -> RemoteArray:
        return _f.unary("square", x)

    @staticmethod
    def sin(x: RemoteArray, /) -> RemoteArray:
        return _f.unary("sin", x)

    @staticmethod
    def cos(x: RemoteArray, /) -> RemoteArray:
        return _f.unary("cos", x)

    @staticmethod
    def tan(x: RemoteArray, /) -> RemoteArray:
        return _f.unary("tan", x)

    @staticmethod
    def asin(x: RemoteArray, /) -> RemoteArray:
        return _f.unary("asin", x)

    @staticmethod
    def acos(x: RemoteArray, /) -> RemoteArray:
        return _f.unary("acos", x)

    @staticmethod
    def atan(x: RemoteArray, /) -> RemoteArray:
        return _f.unary("atan", x)

    @staticmethod
    def sinh(x: RemoteArray, /) -> RemoteArray:
        return _f.unary("sinh", x)

    @staticmethod
    def cosh(x: RemoteArray, /) -> RemoteArray:
        return _f.unary("cosh", x)

    @staticmethod
    def tanh(x: RemoteArray, /) -> RemoteArray:
        return _f.unary("tanh", x)

    @staticmethod
    def asinh(x: RemoteArray, /) -> RemoteArray:
        return _f.unary("asinh", x)

    @staticmethod
    def acosh(x: RemoteArray, /) -> RemoteArray:
        return _f.unary("acosh", x)

    @staticmethod
    def atanh(x: RemoteArray, /) -> RemoteArray:
        return _f.unary("atanh", x)

    @staticmethod
    def floor(x: RemoteArray, /) -> RemoteArray:
        return _f.unary("floor", x)

    @staticmethod
    def ceil(x: RemoteArray, /) -> RemoteArray:
        return _f.unary("ceil", x)

    @staticmethod
    def trunc(x: RemoteArray, /) -> RemoteArray:
        return _f.unary("trunc", x)

    @staticmethod
    def round(x: RemoteArray, /) -> RemoteArray:
        return _f.unary("round", x)

    @staticmethod
    def sign(x: RemoteArray, /) -> RemoteArray:
        return _f.unary("sign", x)

    @staticmethod
    def logical_not(x: RemoteArray, /) -> RemoteArray:
        return _f.unary("logical_not", x)

    @staticmethod
    def bitwise_invert(x: RemoteArray, /) -> RemoteArray:
        return _f.unary("bitwise_invert", x)

    @staticmethod
    def isnan(x: RemoteArray, /) -> RemoteArray:
        return _f.unary("isnan", x)

    @staticmethod
    def isinf(x: RemoteArray, /) -> RemoteArray:
        return _f.unary("isinf", x)

    @staticmethod
    def isfinite(x: RemoteArray, /) -> RemoteArray:
        return _f.unary("isfinite", x)

    @staticmethod
    def real(x: RemoteArray, /) -> RemoteArray:
        return _f.unary("real", x)

    @staticmethod
    def imag(x: RemoteArray, /) -> RemoteArray:
        return _f.unary("imag", x)

    @staticmethod
    def conj(x: RemoteArray, /) -> RemoteArray:
        return _f.unary("conj", x)

    @staticmethod
    def reciprocal(x: RemoteArray, /) -> RemoteArray:
        return _f.unary("reciprocal", x)

    @staticmethod
    def signbit(x: RemoteArray, /) -> RemoteArray:
        return _f.unary("signbit", x)

    @staticmethod
    def add(x1: Any, x2: Any, /) -> RemoteArray:
        return _f.binary_function("add", x1, x2)

    @staticmethod
    def subtract(x1: Any, x2: Any, /) -> RemoteArray:
        return _f.binary_function("subtract", x1, x2)

    @staticmethod
    def multiply(x1: Any, x2: Any, /) -> RemoteArray:
        return _f.binary_function("multiply", x1, x2)

    @staticmethod
    def divide(x1: Any, x2: Any, /) -> RemoteArray:
        return _f.binary_function("divide", x1, x2)

    @staticmethod
    def floor_divide(x1: Any, x2: Any, /) -> RemoteArray:
        return _f.binary_function("floor_divide", x1, x2)

    @staticmethod
    def remainder(x1: Any, x2: Any, /) -> RemoteArray:
        return _f.binary_function("remainder", x1, x2)

    @staticmethod
    def pow(x1: Any, x2: Any, /) -> RemoteArray:
        return _f.binary_function("pow", x1, x2)

    @staticmethod
    def matmul(x1: Any, x2: Any, /) -> RemoteArray:
        return _f.binary_function("matmul", x1, x2)

    @staticmethod
    def maximum(x1: Any, x2: Any, /) -> RemoteArray:
        return _f.binary_function("maximum", x1, x2)

    @staticmethod
    def minimum(x1: Any, x2: Any, /) -> RemoteArray:
        return _f.binary_function("minimum", x1, x2)

    @staticmethod
    def equal(x1: Any, x2: Any, /) -> RemoteArray:
        return _f.binary_function("equal", x1, x2)

    @staticmethod
    def not_equal(x1: Any, x2: Any, /) -> RemoteArray:
        return _f.binary_function("not_equal", x1, x2)

    @staticmethod
    def less(x1: Any, x2: Any, /) -> RemoteArray:
        return _f.binary_function("less", x1, x2)

    @staticmethod
    def less_equal(x1: Any, x2: Any, /) -> RemoteArray:
        return _f.binary_function("less_equal", x1, x2)

    @staticmethod
    def greater(x1: Any, x2: Any, /) -> RemoteArray:
        return _f.binary_function("greater", x1, x2)

    @staticmethod
    def greater_equal(x1: Any, x2: Any, /) -> RemoteArray:
        return _f.binary_function("greater_equal", x1, x2)

    @staticmethod
    def logical_and(x1: Any, x2: Any, /) -> RemoteArray:
        return _f.binary_function("logical_and", x1, x2)

    @staticmethod
    def logical_or(x1: Any, x2: Any, /) -> RemoteArray:
        return _f.binary_function("logical_or", x1, x2)

    @staticmethod
    def logical_xor(x1: Any, x2: Any, /) -> RemoteArray:
        return _f.binary_function("logical_xor", x1, x2)

    @staticmethod
    def bitwise_and(x1: Any, x2: Any, /) -> RemoteArray:
        return _f.binary_function("bitwise_and", x1, x2)

    @staticmethod
    def bitwise_or(x1: Any, x2: Any, /) -> RemoteArray:
        return _f.binary_function("bitwise_or", x1, x2)

    @staticmethod
    def bitwise_xor(x1: Any, x2: Any, /) -> RemoteArray:
        return _f.binary_function("bitwise_xor", x1, x2)

    @staticmethod
    def bitwise_left_shift(x1: Any, x2: Any, /) -> RemoteArray:
        return _f.binary_function("bitwise_left_shift", x1, x2)

    @staticmethod
    def bitwise_right_shift(x1: Any, x2: Any, /) -> RemoteArray:
        return _f.binary_function("bitwise_right_shift", x1, x2)

    @staticmethod
    def atan2(x1: Any, x2: Any, /) -> RemoteArray:
        return _f.binary_function("atan2", x1, x2)

    @staticmethod
    def hypot(x1: Any, x2: Any, /) -> RemoteArray:
        return _f.binary_function("hypot", x1, x2)

    @staticmethod
    def copysign(x1: Any, x2: Any, /) -> RemoteArray:
        return _f.binary_function("copysign", x1, x2)

    @staticmethod
    def logaddexp(x1: Any, x2: Any, /) -> RemoteArray:
        return _f.binary_function("logaddexp", x1, x2)

    @staticmethod
    def nextafter(x1: Any, x2: Any, /) -> RemoteArray:
        return _f.binary_function("nextafter", x1, x2)

    # --- reductions ---------------------------------------------------------------------------

    @staticmethod
    def sum(x: RemoteArray, /, *, axis: int | Sequence[int] | None = None, dtype: Any = None,
            keepdims: builtins.bool = False) -> RemoteArray:  # fmt: skip
        return _f.reduce("sum", x, axis, keepdims, dtype)

    @staticmethod
    def prod(x: RemoteArray, /, *, axis: int | Sequence[int] | None = None, dtype: Any = None,
            keepdims: builtins.bool = False) -> RemoteArray:  # fmt: skip
        return _f.reduce("prod", x, axis, keepdims, dtype)

    @staticmethod
    def mean(x: RemoteArray, /, *, axis: int | Sequence[int] | None = None,
            keepdims: builtins.bool = False) -> RemoteArray:  # fmt: skip
        return _f.reduce("mean", x, axis, keepdims)

    @staticmethod
    def max(x: RemoteArray, /, *, axis: int | Sequence[int] | None = None,
            keepdims: builtins.bool = False) -> RemoteArray:  # fmt: skip
        return _f.reduce("max", x, axis, keepdims)

    @staticmethod
    def min(x: RemoteArray, /, *, axis: int | Sequence[int] | None = None,
            keepdims: builtins.bool = False) -> RemoteArray:  # fmt: skip
        return _f.reduce("min", x, axis, keepdims)

    @staticmethod
    def argmax(
        x: RemoteArray, /, *, axis: int | None = None, keepdims: builtins.bool = False
    ) -> RemoteArray:
        return _f.reduce("argmax", x, axis, keepdims)

    @staticmethod
    def argmin(
        x: RemoteArray, /, *, axis: int | None = None, keepdims: builtins.bool = False
    ) -> RemoteArray:
        return _f.reduce("argmin", x, axis, keepdims)

    @staticmethod
    def any(x: RemoteArray, /, *, axis: int | Sequence[int] | None = None,
            keepdims: builtins.bool = False) -> RemoteArray:  # fmt: skip
        return _f.reduce("any", x, axis, keepdims)

    @staticmethod
    def all(x: RemoteArray, /, *, axis: int | Sequence[int] | None = None,
            keepdims: builtins.bool = False) -> RemoteArray:  # fmt: skip
        return _f.reduce("all", x, axis, keepdims)

    @staticmethod
    def std(x: RemoteArray, /, *, axis: int | Sequence[int] | None = None,
            correction: int | float = 0.0,
            keepdims: builtins.bool = False) -> RemoteArray:  # fmt: skip
        return _f.reduce("std", x, axis, keepdims, correction=float(correction))

    @staticmethod
    def var(x: RemoteArray, /, *, axis: int | Sequence[int] | None = None,
            correction: int | float = 0.0,
            keepdims: builtins.bool = False) -> RemoteArray:  # fmt: skip
        return _f.reduce("var", x, axis, keepdims, correction=float(correction))

    # --- manipulation -------------------------------------------------------------------------

    @staticmethod
    def reshape(
        x: RemoteArray, /, shape: Sequence[int], *, copy: builtins.bool | None = None
    ) -> RemoteArray:
        return _f.reshape(x, shape)

    @staticmethod
    def permute_dims(x: RemoteArray, /, axes: Sequence[int]) -> RemoteArray:
        return _f.permute_dims(x, axes)

    @staticmethod
    def transpose(x: RemoteArray, /, axes: Sequence[int] | None = None) -> RemoteArray:
        """numpy's ``transpose``: reverses the axes unless ``axes`` is given."""
        return _f.permute_dims(x, tuple(reversed(range(x.ndim))) if axes is None else axes)

    @staticmethod
    def matrix_transpose(x: RemoteArray, /) -> RemoteArray:
        return _f.matrix_transpose(x)


def namespace(device: Device) -> Namespace:
    """The array namespace whose default device is ``device``: the same object while one is
    alive, so ``x.__array_namespace__() is xp``. The device holds it weakly (no cycle: dropping
    the last reference to a device still closes its session at once)."""
    ref: weakref.ref[Namespace] | None = device.__dict__.get("_namespace")
    space = None if ref is None else ref()
    if space is None:
        space = Namespace(device)
        device.__dict__["_namespace"] = weakref.ref(space)
    return space
