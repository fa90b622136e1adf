"""``RemoteArray``: a handle on a tensor that lives on a server, and the core that builds ops.

A handle knows its id, shape, dtype and device locally. Operators build ops and return new
handles at once; only :meth:`RemoteArray.numpy` (and what needs a value: ``bool(x)``,
``float(x)``, ``np.asarray(x)``) waits for the server. Dropping the last reference frees the
tensor on the server (batched with the next flush).

Each core function builds a typed op with a client-allocated output id, runs the protocol's
inference rule (so a shape or dtype error is raised here, before anything is sent), queues the
op and returns the new handle at once. This module calls the device API (``client.device``)
below it; the categories of the standard (``client.standard``) build on it, and the namespace
above it is reached only through :func:`register_namespace`.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from protocol.ops import (
    AsType,
    Binary,
    BinaryName,
    BinaryScalar,
    GetItem,
    IndexItem,
    InPlaceBinary,
    InPlaceBinaryScalar,
    PermuteDims,
    Reshape,
    SetItem,
    Unary,
    UnaryName,
)
from protocol.scalars import PyScalar, scalar_dtype, scalar_from_python

from ._array_methods import ArrayMethods
from ._building import apply, apply_inplace, full, upload
from ._handle import Handle, checked_device, index_key, wire_dtype
from ._python_protocols import PythonProtocols
from ._ufuncs import NumpyUfuncs
from .device import register_array_type
from .transfer import to_device

if TYPE_CHECKING:
    from .device import Device
    from .namespace import Namespace

# How __array_namespace__ finds a device's namespace. The namespace is the top layer, so it
# registers itself here once, on import (client/__init__ imports it), instead of this module
# importing upward.
_namespace_of: Callable[[Device], Namespace] | None = None


def register_namespace(namespace_of: Callable[[Device], Namespace]) -> None:
    """Make ``x.__array_namespace__()`` return ``namespace_of(x.device)``. Called once by
    ``client.namespace``."""
    global _namespace_of
    _namespace_of = namespace_of


_iterate: Callable[[RemoteArray], Iterator[RemoteArray]] | None = None


def register_iteration(iterate: Callable[[RemoteArray], Iterator[RemoteArray]]) -> None:
    """Make ``iter(x)`` return ``iterate(x)``. Called once by ``client._elements``."""
    global _iterate
    _iterate = iterate


# --- the operators, from factories (each is a plain method to Python and to mypy) -------------

Operator = Callable[["RemoteArray", Any], "RemoteArray"]


def _unary_operator(name: UnaryName) -> Callable[[RemoteArray], RemoteArray]:
    def unary_operator(self: RemoteArray) -> RemoteArray:
        return unary(name, self)

    unary_operator.__doc__ = f"Element-wise ``{name}``."
    return unary_operator


def _binary_operator(name: BinaryName, reflected: bool = False) -> Operator:
    def binary_operator_(self: RemoteArray, other: Any) -> RemoteArray:
        return binary_operator(name, self, other, reflected)

    order = "``other`` and this array" if reflected else "this array and ``other``"
    binary_operator_.__doc__ = f"Element-wise ``{name}`` of {order}."
    return binary_operator_


def _operators(name: BinaryName) -> tuple[Operator, Operator, Operator]:
    """The operator for ``name``, its reflected form and its in-place form."""

    def inplace_operator_(self: RemoteArray, other: Any) -> RemoteArray:
        return inplace_operator(name, self, other)

    inplace_operator_.__doc__ = f"In-place ``{name}``: one op that keeps this array's id."
    return _binary_operator(name), _binary_operator(name, reflected=True), inplace_operator_


class RemoteArray(ArrayMethods, PythonProtocols, NumpyUfuncs, Handle):
    """A tensor on a remote device. Create them with a namespace: ``client.namespace(dev)``.
    numpy's methods (``x.sum()``, ``x.mean(axis=0)``, ...) are ``client._array_methods``'."""

    __slots__ = ()
    __hash__ = None  # type: ignore[assignment]  # __eq__ is element-wise, as in numpy

    @property
    def T(self) -> RemoteArray:  # noqa: N802 - the standard's name
        return permute_dims(self, tuple(reversed(range(self.ndim))))

    @property
    def mT(self) -> RemoteArray:  # noqa: N802 - the standard's name
        return matrix_transpose(self)

    def __iter__(self) -> Iterator[RemoteArray]:
        """One read for a 1-d array, none for an n-d one (``client._elements``, a subclass
        of this one, which registers its iteration here on import).

        Raises:
            TypeError: a 0-d array, at once.
        """
        assert _iterate is not None, "client._elements registers itself on import"
        return _iterate(self)

    def __array_namespace__(self, *, api_version: str | None = None) -> Namespace:
        if api_version not in (None, "2021.12", "2022.12", "2023.12", "2024.12"):
            raise ValueError(f"unsupported array API version {api_version!r}")
        assert _namespace_of is not None, "client.namespace registers itself on import"
        return _namespace_of(self._device)

    def astype(self, dtype: Any, *, copy: bool = True, device: Any = None) -> RemoteArray:
        """``xp.astype(self, dtype, copy=copy, device=device)``, as numpy's method is called
        (array-api-compat's numpy path calls it so)."""
        x = self if device is None else self.to_device(device)
        return astype(x, dtype, copy=copy and x is self)

    def reshape(self, *shape: Any) -> RemoteArray:
        if len(shape) == 1 and isinstance(shape[0], tuple | list):
            shape = tuple(shape[0])
        return reshape(self, shape)

    # numpy's method names that array-api-compat's numpy path calls on arrays: thin aliases
    def copy(self) -> RemoteArray:
        return astype(self, self.dtype)

    def ravel(self) -> RemoteArray:
        return reshape(self, (-1,))

    def __getitem__(self, key: Any) -> RemoteArray:
        return getitem(self, key)

    def __setitem__(self, key: Any, value: Any) -> None:
        setitem(self, key, value)

    def to_device(self, device: Any, /, *, stream: Any = None) -> RemoteArray:
        """This array on ``device``: itself when already there, else a copy, moved the
        shortest way (``client.transfer``: between servers, server to server)."""
        if stream is not None:
            raise ValueError("remote devices have no streams")
        if device is self._device:
            return self
        return to_device(self, checked_device(device))

    __neg__ = _unary_operator("negative")
    __pos__ = _unary_operator("positive")
    __abs__ = _unary_operator("abs")
    __invert__ = _unary_operator("bitwise_invert")

    __add__, __radd__, __iadd__ = _operators("add")
    __sub__, __rsub__, __isub__ = _operators("subtract")
    __mul__, __rmul__, __imul__ = _operators("multiply")
    __truediv__, __rtruediv__, __itruediv__ = _operators("divide")
    __floordiv__, __rfloordiv__, __ifloordiv__ = _operators("floor_divide")
    __mod__, __rmod__, __imod__ = _operators("remainder")
    __pow__, __rpow__, __ipow__ = _operators("pow")
    __matmul__, __rmatmul__, __imatmul__ = _operators("matmul")
    __and__, __rand__, __iand__ = _operators("bitwise_and")
    __or__, __ror__, __ior__ = _operators("bitwise_or")
    __xor__, __rxor__, __ixor__ = _operators("bitwise_xor")
    __lshift__, __rlshift__, __ilshift__ = _operators("bitwise_left_shift")
    __rshift__, __rrshift__, __irshift__ = _operators("bitwise_right_shift")

    __lt__ = _binary_operator("less")
    __le__ = _binary_operator("less_equal")
    __gt__ = _binary_operator("greater")
    __ge__ = _binary_operator("greater_equal")
    __eq__ = _binary_operator("equal")  # type: ignore[assignment]
    __ne__ = _binary_operator("not_equal")  # type: ignore[assignment]


register_array_type(RemoteArray)


# --- element-wise -----------------------------------------------------------------------------


PY_SCALARS = (bool, int, float, complex)  # for isinstance: a Union would be built per op
# The types whose values travel inside an op: exactly these, not subclasses, because numpy's
# float64 and complex128 are float and complex subclasses and keep their own (strong) dtype.
EXACT_SCALARS = frozenset(PY_SCALARS)


def operand(value: Any, like: RemoteArray) -> RemoteArray | None:
    """``value`` as an array on ``like``'s device, or None if it cannot take part in an op."""
    if isinstance(value, RemoteArray):
        return value
    if isinstance(value, np.generic):
        value = np.asarray(value)
    if isinstance(value, np.ndarray):
        return upload(value, like.device)
    if isinstance(value, PY_SCALARS):
        return full((), value, scalar_dtype(value, like.wire_dtype), like.device)
    return None


def binary(name: BinaryName, x1: RemoteArray, x2: RemoteArray) -> RemoteArray:
    return apply(lambda out: Binary(op=name, out=out, x1=x1.tensor_id, x2=x2.tensor_id), x1, x2)


def binary_scalar(
    name: BinaryName, x: RemoteArray, value: PyScalar, scalar_first: bool = False
) -> RemoteArray:
    """``x <op> value`` (``value <op> x`` if ``scalar_first``) as one op: the Python scalar
    travels inside it and takes the standard's dtype beside ``x``."""
    s = scalar_from_python(value)
    return apply(
        lambda out: BinaryScalar(
            op=name, out=out, x=x.tensor_id, scalar=s, scalar_first=scalar_first
        ),
        x,
    )


def unary(name: UnaryName, x: RemoteArray) -> RemoteArray:
    return apply(lambda out: Unary(op=name, out=out, x=x.tensor_id), x)


def binary_operator(
    name: BinaryName, self: RemoteArray, other: Any, reflected: bool
) -> RemoteArray:
    """``self <op> other`` (``other <op> self`` if ``reflected``), or NotImplemented when
    ``other`` cannot take part, so that Python tries the other operand. A Python scalar
    travels inside the op."""
    if type(other) in EXACT_SCALARS:
        return binary_scalar(name, self, other, scalar_first=reflected)
    other_array = operand(other, self)
    if other_array is None:
        result: RemoteArray = NotImplemented
        return result
    return binary(name, other_array, self) if reflected else binary(name, self, other_array)


def inplace_operator(name: BinaryName, self: RemoteArray, other: Any) -> RemoteArray:
    """``self op= other``: one op that writes ``self``'s memory (its views see it) and keeps
    its id, shape and dtype; a Python scalar travels inside it.

    Raises:
        ValueError: the result would not have ``self``'s shape.
        TypeError: the result's dtype cannot be cast back to ``self``'s (int ``/=``, ...).
    """
    if type(other) in EXACT_SCALARS:
        s = scalar_from_python(other)
        return apply_inplace(lambda out: InPlaceBinaryScalar(op=name, out=out, scalar=s), self)
    other_array = operand(other, self)
    if other_array is None:
        return NotImplemented  # type: ignore[no-any-return]
    o = other_array
    return apply_inplace(lambda out: InPlaceBinary(op=name, out=out, x2=o.tensor_id), self, o)


def astype(x: RemoteArray, dtype: Any, copy: bool = True) -> RemoteArray:
    """``x`` as ``dtype``: a new array, or ``x`` itself when ``copy`` is false and ``x`` has
    ``dtype`` already."""
    target = wire_dtype(dtype)
    if not copy and target == x.wire_dtype:
        return x
    return apply(lambda out: AsType(out=out, x=x.tensor_id, dtype=target), x)


# --- shapes and indexing ----------------------------------------------------------------------


def reshape(x: RemoteArray, shape: Sequence[int]) -> RemoteArray:
    dims = tuple(operator.index(d) for d in shape)
    return apply(lambda out: Reshape(out=out, x=x.tensor_id, shape=dims), x)


def permute_dims(x: RemoteArray, axes: Sequence[int]) -> RemoteArray:
    order = tuple(operator.index(a) for a in axes)
    return apply(lambda out: PermuteDims(out=out, x=x.tensor_id, axes=order), x)


def matrix_transpose(x: RemoteArray) -> RemoteArray:
    if x.ndim < 2:
        raise ValueError(f"matrix_transpose needs at least 2 dimensions, not {x.ndim}")
    axes = list(range(x.ndim))
    axes[-2], axes[-1] = axes[-1], axes[-2]
    return permute_dims(x, axes)


def _key(x: RemoteArray, key: Any) -> tuple[tuple[IndexItem, ...], list[RemoteArray]]:
    def index_array(item: Any) -> RemoteArray:
        array = item if isinstance(item, RemoteArray) else upload(np.asarray(item), x.device)
        if array.device is not x.device:
            raise ValueError("an index array must be on the indexed array's device")
        return array

    return index_key(key, index_array)


def getitem(x: RemoteArray, key: Any) -> RemoteArray:
    index, arrays = _key(x, key)
    return apply(lambda out: GetItem(out=out, x=x.tensor_id, key=index), x, *arrays)


def setitem(x: RemoteArray, key: Any, value: Any) -> None:
    """``x[key] = value`` as an in-place op: ``x`` keeps its id; nothing travels back."""
    index, arrays = _key(x, key)
    if not isinstance(value, RemoteArray):
        value_array = operand(value, x)
        if value_array is None:
            raise TypeError(f"cannot assign {type(value).__name__} to an array")
        value = value_array
    v = value if value.wire_dtype == x.wire_dtype else astype(value, x.dtype)
    apply_inplace(lambda out: SetItem(out=out, key=index, value=v.tensor_id), x, v, *arrays)
