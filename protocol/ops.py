"""The op catalogue: typed op families, each with its shape and dtype inference rule.

Rule: this module imports numpy, pydantic and ``protocol`` siblings only. No I/O.

Every op names its output id (``out``), chosen by the client, so no op waits for the server.
``Op.infer(*inputs)`` returns the output's :class:`TensorMeta` from the inputs' metas, or raises
:class:`InvalidOpError` (``OpShapeError`` is a ``ValueError``, ``OpDTypeError`` a ``TypeError``).
The client runs it to know ``x.shape`` and ``x.dtype`` without a round trip; the server runs it
again to check an op completely before numpy sees it (ARCHITECTURE invariants 3 and 4).

Dtype rules follow numpy 2 (NEP 50) by running the numpy function on empty dummies of the input
dtypes, cached. # Note: where numpy would produce float16 (``exp`` of ``int8``), which the wire
does not carry, the inputs are computed as float64 instead (:func:`elementwise_rule`).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from functools import lru_cache
from typing import Annotated, Any, ClassVar, Literal, NamedTuple

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from .dtypes import DTYPES, DType, from_numpy, is_integer, to_numpy

MAX_NDIM = 64  # numpy's own limit
UNKNOWN = -1  # a dimension that only running the op tells (nonzero, unique_*, boolean masks)
TensorId = Annotated[int, Field(ge=0, lt=2**63)]
Dim = Annotated[int, Field(ge=0, lt=2**63)]
I64 = Annotated[int, Field(ge=-(2**63), lt=2**63)]  # any other integer on the wire: no bignums


class TensorMeta(NamedTuple):
    """What the client knows of a tensor without asking: its shape and dtype."""

    shape: tuple[int, ...]
    dtype: DType


class InvalidOpError(Exception):
    """An op that its inference rule refuses; it never reaches numpy."""


class OpShapeError(InvalidOpError, ValueError):
    """Shapes that do not fit the op (matmul mismatch, bad axis, bad reshape, ...)."""


class OpAxisError(OpShapeError, IndexError):
    """An axis out of range: both a ``ValueError`` and an ``IndexError``, as numpy's AxisError
    (the standard asks for an ``IndexError`` in places)."""


class OpDTypeError(InvalidOpError, TypeError):
    """Dtypes the op does not accept (bitwise ops on floats, ...)."""


class OpOverflowError(InvalidOpError, OverflowError):
    """A Python integer that the target integer dtype cannot hold."""


class ComplexValue(BaseModel):
    """A complex scalar on the wire (JSON has no complex numbers)."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)
    real: float
    imag: float


Scalar = bool | int | float | ComplexValue


def scalar_to_python(value: Scalar) -> bool | int | float | complex:
    if isinstance(value, ComplexValue):
        return complex(value.real, value.imag)
    return value


def scalar_from_python(value: bool | int | float | complex) -> Scalar:
    if isinstance(value, complex):
        return ComplexValue(real=value.real, imag=value.imag)
    return value


class _Op(BaseModel):
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

    def describe(self) -> str:
        """One line naming the op, for error messages: ``matmul(#3, #4) -> #5``."""
        name = getattr(self, "op", None) or self.kind
        args = ", ".join(f"#{i}" for i in self.inputs())
        return f"{name}({args}) -> #{self.out}"


# --- dtype rules ------------------------------------------------------------------------------


def _dummy(dtype: DType, ndim: int = 1) -> np.ndarray[Any, Any]:
    return np.zeros((1,) * ndim, dtype=to_numpy(dtype))


@lru_cache(maxsize=4096)
def elementwise_rule(name: str, dtypes: tuple[DType, ...]) -> tuple[DType, DType | None]:
    """``(output dtype, compute dtype or None)`` for numpy function ``name`` on ``dtypes``.

    The compute dtype, when not None, is what the inputs are cast to before the call.

    Raises:
        OpDTypeError: numpy has no loop for these dtypes.
    """
    fn: Callable[..., Any] = getattr(np, name)
    ndim = 2 if name == "matmul" else 1
    for compute in (None, "float64"):
        args = [_dummy(compute or d, ndim) for d in dtypes]
        try:
            with np.errstate(all="ignore"), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                result = fn(*args)
        except TypeError as exc:
            raise OpDTypeError(f"{name} does not support dtypes {', '.join(dtypes)}") from exc
        try:
            return from_numpy(np.asarray(result).dtype), compute
        except TypeError:
            continue  # float16 and friends: compute in float64 instead
    raise OpDTypeError(f"{name} does not support dtypes {', '.join(dtypes)}")


def _normalize_axis(axis: int, ndim: int) -> int:
    if not -ndim <= axis < ndim:
        raise OpAxisError(f"axis {axis} is out of bounds for an array of {ndim} dimensions")
    return axis % ndim


def _normalize_axes(axes: tuple[int, ...] | None, ndim: int) -> tuple[int, ...]:
    if axes is None:
        return tuple(range(ndim))
    norm = tuple(_normalize_axis(a, ndim) for a in axes)
    if len(set(norm)) != len(norm):
        raise OpShapeError(f"repeated axis in {axes}")
    return norm


def _check_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
    if len(shape) > MAX_NDIM:
        raise OpShapeError(f"{len(shape)} dimensions exceed the limit of {MAX_NDIM}")
    if any(d < 0 for d in shape):
        raise OpShapeError(f"negative dimension in shape {shape}")
    return shape


def broadcast_shapes(*shapes: tuple[int, ...]) -> tuple[int, ...]:
    """numpy broadcasting, computed with Python ints."""
    if len(shapes) == 2 and shapes[0] == shapes[1]:
        return shapes[0]  # the common case, and the pipelined hot path: equal shapes
    ndim = max((len(s) for s in shapes), default=0)
    out: list[int] = []
    for i in range(-ndim, 0):
        dims = {s[i] for s in shapes if len(s) >= -i} - {1}
        if len(dims) > 1:
            raise OpShapeError(f"shapes {', '.join(map(str, shapes))} do not broadcast")
        out.append(dims.pop() if dims else 1)
    return tuple(out)


def numel(shape: tuple[int, ...]) -> int:
    return math.prod(shape)


# --- creation ---------------------------------------------------------------------------------


class FromBuffer(_Op):
    """A tensor whose bytes travel in buffer number ``buffer`` of the same message."""

    kind: Literal["from_buffer"] = "from_buffer"
    shape: tuple[Dim, ...]
    dtype: DType
    buffer: Annotated[int, Field(ge=0, lt=2**63)]

    def infer(self, *args: TensorMeta) -> TensorMeta:
        return TensorMeta(_check_shape(self.shape), self.dtype)

    def nbytes(self) -> int:
        return numel(self.shape) * to_numpy(self.dtype).itemsize


class Full(_Op):
    """``full(shape, value, dtype)``; zeros and ones are fulls."""

    kind: Literal["full"] = "full"
    shape: tuple[Dim, ...]
    dtype: DType
    value: Scalar

    def infer(self, *args: TensorMeta) -> TensorMeta:
        value = scalar_to_python(self.value)
        if is_integer(self.dtype) and not isinstance(value, bool) and isinstance(value, int):
            info = np.iinfo(to_numpy(self.dtype))  # type: ignore[type-var]
            if not info.min <= value <= info.max:
                raise OpOverflowError(f"Python integer {value} out of bounds for {self.dtype}")
        if isinstance(value, int) and not is_integer(self.dtype):
            try:
                float(value)
            except OverflowError:
                raise OpOverflowError(
                    f"Python integer {value} out of range for {self.dtype}"
                ) from None
        if isinstance(value, complex) and not self.dtype.startswith("complex"):
            raise OpDTypeError(f"a complex fill value cannot fill a {self.dtype} array")
        return TensorMeta(_check_shape(self.shape), self.dtype)


class Arange(_Op):
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
        if self.dtype == "bool" or self.dtype.startswith("complex"):
            raise OpDTypeError(f"arange does not produce {self.dtype}")
        return TensorMeta((self.length(),), self.dtype)


class Eye(_Op):
    kind: Literal["eye"] = "eye"
    n_rows: Dim
    n_cols: Dim
    k: I64 = 0
    dtype: DType

    def infer(self, *args: TensorMeta) -> TensorMeta:
        return TensorMeta((self.n_rows, self.n_cols), self.dtype)


# --- element-wise -----------------------------------------------------------------------------

UnaryName = Literal[
    "abs", "negative", "positive", "exp", "expm1", "log", "log1p", "log2", "log10", "sqrt",
    "square", "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "tanh", "asinh",
    "acosh", "atanh", "floor", "ceil", "trunc", "round", "sign", "logical_not",
    "bitwise_invert", "isnan", "isinf", "isfinite", "real", "imag", "conj", "reciprocal",
    "signbit",
]  # fmt: skip

BinaryName = Literal[
    "add", "subtract", "multiply", "divide", "floor_divide", "remainder", "pow", "matmul",
    "maximum", "minimum", "equal", "not_equal", "less", "less_equal", "greater",
    "greater_equal", "logical_and", "logical_or", "logical_xor", "bitwise_and", "bitwise_or",
    "bitwise_xor", "bitwise_left_shift", "bitwise_right_shift", "atan2", "hypot", "copysign",
    "logaddexp", "nextafter",
]  # fmt: skip


class Unary(_Op):
    kind: Literal["unary"] = "unary"
    op: UnaryName
    x: TensorId

    def inputs(self) -> tuple[int, ...]:
        return (self.x,)

    def infer(self, *args: TensorMeta) -> TensorMeta:
        (x,) = args
        return TensorMeta(x.shape, elementwise_rule(self.op, (x.dtype,))[0])


class Binary(_Op):
    kind: Literal["binary"] = "binary"
    op: BinaryName
    x1: TensorId
    x2: TensorId

    def inputs(self) -> tuple[int, ...]:
        return (self.x1, self.x2)

    def infer(self, *args: TensorMeta) -> TensorMeta:
        a, b = args
        dtype = elementwise_rule(self.op, (a.dtype, b.dtype))[0]
        if self.op == "matmul":
            return TensorMeta(matmul_shape(a.shape, b.shape), dtype)
        return TensorMeta(broadcast_shapes(a.shape, b.shape), dtype)


def matmul_shape(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    if not a or not b:
        raise OpShapeError("matmul does not take 0-dimensional operands")
    a2 = a if len(a) >= 2 else (1, *a)
    b2 = b if len(b) >= 2 else (*b, 1)
    if a2[-1] != b2[-2]:
        raise OpShapeError(f"matmul shapes {a} and {b} do not align ({a2[-1]} != {b2[-2]})")
    out = (*broadcast_shapes(a2[:-2], b2[:-2]), a2[-2], b2[-1])
    if len(a) == 1:
        out = out[:-2] + out[-1:]
    if len(b) == 1:
        out = out[:-1]
    return out


class Where(_Op):
    kind: Literal["where"] = "where"
    condition: TensorId
    x1: TensorId
    x2: TensorId

    def inputs(self) -> tuple[int, ...]:
        return (self.condition, self.x1, self.x2)

    def infer(self, *args: TensorMeta) -> TensorMeta:
        c, a, b = args
        if c.dtype != "bool":
            raise OpDTypeError(f"where needs a bool condition, not {c.dtype}")
        dtype = from_numpy(np.result_type(to_numpy(a.dtype), to_numpy(b.dtype)))
        return TensorMeta(broadcast_shapes(c.shape, a.shape, b.shape), dtype)


class AsType(_Op):
    kind: Literal["astype"] = "astype"
    x: TensorId
    dtype: DType

    def inputs(self) -> tuple[int, ...]:
        return (self.x,)

    def infer(self, *args: TensorMeta) -> TensorMeta:
        return TensorMeta(args[0].shape, self.dtype)


# --- reductions -------------------------------------------------------------------------------

ReduceName = Literal["sum", "prod", "mean", "max", "min", "argmax", "argmin", "any", "all",
                     "std", "var"]  # fmt: skip
_NO_IDENTITY = {"max", "min", "argmax", "argmin"}


@lru_cache(maxsize=1024)
def reduce_rule(name: str, dtype: DType) -> tuple[DType, DType | None]:
    """``(output dtype, compute dtype or None)`` of reduction ``name`` on ``dtype``."""
    fn: Callable[..., Any] = getattr(np, name)
    for compute in (None, "float64"):
        try:
            with np.errstate(all="ignore"), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                result = np.asarray(fn(_dummy(compute or dtype)))
        except TypeError as exc:
            raise OpDTypeError(f"{name} does not support dtype {dtype}") from exc
        if result.dtype.name in DTYPES:
            return from_numpy(result.dtype), compute
    raise OpDTypeError(f"{name} does not support dtype {dtype}")


class Reduce(_Op):
    kind: Literal["reduce"] = "reduce"
    op: ReduceName
    x: TensorId
    axis: tuple[I64, ...] | None = None
    keepdims: bool = False
    correction: float = 0.0  # std and var: degrees of freedom removed (numpy's ddof)

    def inputs(self) -> tuple[int, ...]:
        return (self.x,)

    def infer(self, *args: TensorMeta) -> TensorMeta:
        (x,) = args
        if self.op in ("argmax", "argmin") and self.axis is not None and len(self.axis) != 1:
            raise OpShapeError(f"{self.op} takes a single axis or None")
        axes = _normalize_axes(self.axis, len(x.shape))
        if self.op in _NO_IDENTITY and any(x.shape[a] == 0 for a in axes):
            raise OpShapeError(f"{self.op} of an empty axis has no identity")
        if self.keepdims:
            shape = tuple(1 if i in axes else d for i, d in enumerate(x.shape))
        elif self.op in ("argmax", "argmin") and self.axis is None:
            shape = ()
        else:
            shape = tuple(d for i, d in enumerate(x.shape) if i not in axes)
        return TensorMeta(shape, reduce_rule(self.op, x.dtype)[0])


# --- manipulation and indexing ----------------------------------------------------------------


class Reshape(_Op):
    kind: Literal["reshape"] = "reshape"
    x: TensorId
    shape: tuple[Annotated[int, Field(ge=-1, lt=2**63)], ...]

    def inputs(self) -> tuple[int, ...]:
        return (self.x,)

    def infer(self, *args: TensorMeta) -> TensorMeta:
        (x,) = args
        size = numel(x.shape)
        unknown = [i for i, d in enumerate(self.shape) if d == -1]
        if len(unknown) > 1:
            raise OpShapeError("reshape takes at most one -1")
        known = numel(tuple(d for d in self.shape if d != -1))
        shape = list(self.shape)
        if unknown:
            if known == 0 or size % known:
                raise OpShapeError(f"cannot reshape {x.shape} into {self.shape}")
            shape[unknown[0]] = size // known
        elif known != size:
            raise OpShapeError(f"cannot reshape {x.shape} ({size} elements) into {self.shape}")
        return TensorMeta(_check_shape(tuple(shape)), x.dtype)


class PermuteDims(_Op):
    kind: Literal["permute_dims"] = "permute_dims"
    x: TensorId
    axes: tuple[I64, ...]

    def inputs(self) -> tuple[int, ...]:
        return (self.x,)

    def infer(self, *args: TensorMeta) -> TensorMeta:
        (x,) = args
        if len(self.axes) != len(x.shape):
            raise OpShapeError(f"axes {self.axes} do not match {len(x.shape)} dimensions")
        axes = _normalize_axes(self.axes, len(x.shape))
        return TensorMeta(tuple(x.shape[a] for a in axes), x.dtype)


# The other families live in sibling modules, which import this one's base (no cycle at run
# time: ``protocol/__init__`` always imports this module first).
from .ops_data import Cumulative as Cumulative  # noqa: E402
from .ops_data import Nonzero as Nonzero  # noqa: E402
from .ops_data import SearchSorted as SearchSorted  # noqa: E402
from .ops_data import Sort as Sort  # noqa: E402
from .ops_data import Unique as Unique  # noqa: E402
from .ops_index import GetItem as GetItem  # noqa: E402
from .ops_index import IndexItem as IndexItem  # noqa: E402
from .ops_index import SetItem as SetItem  # noqa: E402
from .ops_index import SliceSpec as SliceSpec  # noqa: E402
from .ops_index import Take as Take  # noqa: E402
from .ops_linalg import FFT as FFT  # noqa: E402
from .ops_linalg import Linalg as Linalg  # noqa: E402
from .ops_shape import Axes as Axes  # noqa: E402
from .ops_shape import BroadcastTo as BroadcastTo  # noqa: E402
from .ops_shape import Join as Join  # noqa: E402
from .ops_shape import Linspace as Linspace  # noqa: E402
from .ops_shape import MoveAxis as MoveAxis  # noqa: E402
from .ops_shape import Repeat as Repeat  # noqa: E402
from .ops_shape import Roll as Roll  # noqa: E402
from .ops_shape import Tile as Tile  # noqa: E402
from .ops_shape import Triangle as Triangle  # noqa: E402

AnyOp = (
    FromBuffer
    | Full
    | Arange
    | Eye
    | Linspace
    | Unary
    | Binary
    | Where
    | AsType
    | Reduce
    | Reshape
    | PermuteDims
    | GetItem
    | SetItem
    | Take
    | Join
    | Axes
    | Roll
    | MoveAxis
    | BroadcastTo
    | Tile
    | Repeat
    | Triangle
    | Sort
    | Cumulative
    | SearchSorted
    | Nonzero
    | Unique
    | Linalg
    | FFT
)
Op = Annotated[AnyOp, Field(discriminator="kind")]
