"""numpy's array methods on the SDK's array types, each a thin alias of the array's namespace
function (``x.sum(axis=0)`` is ``xp.sum(x, axis=0)``), with numpy's parameter names.

:class:`ArrayMethods` is a mixin of :class:`~client.array.RemoteArray` and of the autodiff
:class:`~client.autodiff.tensor.Tensor`: it finds the namespace through
``__array_namespace__``, so a tensor's methods record their gradients as its namespace's
functions do. numpy's ``out=`` (writing into an existing array) and ``order=`` (memory
layouts) are not taken: a remote array's memory is the server's.
"""

from __future__ import annotations

import math
import operator
from typing import TYPE_CHECKING, Any, Self

import numpy as np

Axis = int | tuple[int, ...] | None


class ArrayMethods:
    """numpy's methods, from the array's namespace (see the module docstring)."""

    __slots__ = ()

    if TYPE_CHECKING:  # what the classes that mix it in have

        @property
        def shape(self) -> Any: ...
        @property
        def dtype(self) -> Any: ...
        @property
        def ndim(self) -> int: ...
        def __getitem__(self, key: Any) -> Self: ...
        def __array_namespace__(self, *, api_version: str | None = None) -> Any: ...

    def _call(self, name: str, *args: Any, **kwargs: Any) -> Self:
        """The namespace's function ``name`` of this array and ``args``."""
        result: Self = getattr(self.__array_namespace__(), name)(self, *args, **kwargs)
        return result

    # --- values -------------------------------------------------------------------------------

    def item(self, *index: Any) -> Any:
        """One element as a Python scalar (one read of that element alone): ``x.item()`` of a
        one-element array, ``x.item(i)`` by flat index, ``x.item(i, j)`` by position.

        Raises:
            ValueError: no index, and more than one element (numpy's message).
            IndexError: an index out of range.
        """
        shape = tuple(self.shape)
        if not index:
            if math.prod(shape) != 1:
                raise ValueError("can only convert an array of size 1 to a Python scalar")
            return np.asarray(self).reshape(()).item()
        if len(index) == 1 and isinstance(index[0], tuple):
            index = index[0]
        if len(index) == 1:
            size, flat = math.prod(shape), operator.index(index[0])
            if not -size <= flat < size:
                raise IndexError(f"index {flat} is out of bounds for size {size}")
            index = np.unravel_index(flat % size, shape)
        element = self[tuple(operator.index(i) for i in index)]
        return np.asarray(element).item()

    def tolist(self) -> Any:
        """The values as nested Python lists of Python scalars (one read), as numpy's."""
        return np.asarray(self).tolist()

    # --- reductions ---------------------------------------------------------------------------

    def sum(self, axis: Axis = None, dtype: Any = None, keepdims: bool = False) -> Self:
        return self._call("sum", axis=axis, dtype=dtype, keepdims=keepdims)

    def prod(self, axis: Axis = None, dtype: Any = None, keepdims: bool = False) -> Self:
        return self._call("prod", axis=axis, dtype=dtype, keepdims=keepdims)

    def mean(self, axis: Axis = None, dtype: Any = None, keepdims: bool = False) -> Self:
        x = self if dtype is None else self.astype(dtype)
        return x._call("mean", axis=axis, keepdims=keepdims)

    def std(
        self, axis: Axis = None, dtype: Any = None, ddof: float = 0, keepdims: bool = False
    ) -> Self:
        x = self if dtype is None else self.astype(dtype)
        return x._call("std", axis=axis, correction=ddof, keepdims=keepdims)

    def var(
        self, axis: Axis = None, dtype: Any = None, ddof: float = 0, keepdims: bool = False
    ) -> Self:
        x = self if dtype is None else self.astype(dtype)
        return x._call("var", axis=axis, correction=ddof, keepdims=keepdims)

    def min(self, axis: Axis = None, keepdims: bool = False) -> Self:
        return self._call("min", axis=axis, keepdims=keepdims)

    def max(self, axis: Axis = None, keepdims: bool = False) -> Self:
        return self._call("max", axis=axis, keepdims=keepdims)

    def argmin(self, axis: int | None = None, keepdims: bool = False) -> Self:
        return self._call("argmin", axis=axis, keepdims=keepdims)

    def argmax(self, axis: int | None = None, keepdims: bool = False) -> Self:
        return self._call("argmax", axis=axis, keepdims=keepdims)

    def any(self, axis: Axis = None, keepdims: bool = False) -> Self:
        return self._call("any", axis=axis, keepdims=keepdims)

    def all(self, axis: Axis = None, keepdims: bool = False) -> Self:
        return self._call("all", axis=axis, keepdims=keepdims)

    def cumsum(self, axis: int | None = None, dtype: Any = None) -> Self:
        """numpy's ``cumsum``: of the flattened array when ``axis`` is None."""
        x = self.ravel() if axis is None else self
        return x._call("cumulative_sum", axis=0 if axis is None else axis, dtype=dtype)

    def cumprod(self, axis: int | None = None, dtype: Any = None) -> Self:
        """numpy's ``cumprod``: of the flattened array when ``axis`` is None."""
        x = self.ravel() if axis is None else self
        return x._call("cumulative_prod", axis=0 if axis is None else axis, dtype=dtype)

    # --- shapes -------------------------------------------------------------------------------

    def astype(self, dtype: Any, *, copy: bool = True) -> Self:
        return self._call("astype", dtype, copy=copy)

    def reshape(self, *shape: Any) -> Self:
        """``x.reshape(2, 3)`` or ``x.reshape((2, 3))``."""
        if len(shape) == 1 and isinstance(shape[0], tuple | list):
            shape = tuple(shape[0])
        return self._call("reshape", shape)

    def transpose(self, *axes: Any) -> Self:
        """The axes reversed, or in the order given: ``x.transpose(1, 0)``, ``x.transpose((1,
        0))``."""
        if len(axes) == 1 and (axes[0] is None or isinstance(axes[0], tuple | list)):
            axes = () if axes[0] is None else tuple(axes[0])
        order = tuple(axes) if axes else tuple(reversed(range(self.ndim)))
        return self._call("permute_dims", order)

    def ravel(self) -> Self:
        return self.reshape((-1,))

    def flatten(self) -> Self:
        """A flat copy (never a view of this array)."""
        return self._call("reshape", (-1,), copy=True)

    def squeeze(self, axis: Axis = None) -> Self:
        """Without the axes of length one (all of them when ``axis`` is None)."""
        if axis is None:
            axis = tuple(i for i, d in enumerate(self.shape) if d == 1)
        return self._call("squeeze", axis=axis)

    def copy(self) -> Self:
        return self.astype(self.dtype, copy=True)

    def take(self, indices: Any, axis: int | None = None) -> Self:
        """numpy's ``take``: along ``axis``, or from the flattened array when it is None."""
        x = self.ravel() if axis is None else self
        if not hasattr(indices, "__array_namespace__"):
            indices = self.__array_namespace__().asarray(indices)
        return x._call("take", indices, axis=0 if axis is None else axis)

    # --- element-wise -------------------------------------------------------------------------

    def clip(self, min: Any = None, max: Any = None) -> Self:  # noqa: A002 - numpy's names
        return self._call("clip", min, max)

    def round(self, decimals: int = 0) -> Self:
        """numpy's ``round``: to ``decimals`` places, halves to even; ``decimals`` other than
        0 as numpy computes it for floats (scaled by a power of ten, rounded, scaled back)."""
        if decimals == 0:
            return self._call("round")
        scale = 10.0**decimals
        return self._call("multiply", scale)._call("round")._call("divide", scale)

    def conj(self) -> Self:
        return self._call("conj")

    def nonzero(self) -> tuple[Self, ...]:
        """The indices of the non-zero elements, one array an axis (their count is only known
        once the array has run: one round trip)."""
        return tuple(self.__array_namespace__().nonzero(self))

    def dot(self, other: Any) -> Self:
        """numpy's ``dot``: a product for a 0-d operand, ``matmul`` up to two dimensions, and
        beyond them the sum over this array's last axis and ``other``'s second to last."""
        other_ndim = other.ndim if hasattr(other, "ndim") else np.ndim(other)
        if self.ndim == 0 or other_ndim == 0:
            return self._call("multiply", other)
        if self.ndim <= 2 and other_ndim <= 2:
            return self._call("matmul", other)
        return self._call("tensordot", other, axes=([self.ndim - 1], [max(other_ndim - 2, 0)]))

    def view(self, dtype: Any = None) -> Self:
        """numpy's ``view`` for what SciPy asks of it: the same dtype (this array), or complex
        values as their real and imaginary parts interleaved along the last axis (``c.view(
        float)``) and back. A copy, not a view: the server holds the memory.

        Raises:
            TypeError: any other reinterpretation of the bytes.
        """
        target = self.dtype if dtype is None else np.dtype(dtype)
        source = np.dtype(self.dtype)
        if target == source:
            return self
        if source.kind == "c" and target == np.dtype(f"f{source.itemsize // 2}") and self.ndim:
            xp = self.__array_namespace__()
            parts: Self = xp.stack([xp.real(self), xp.imag(self)], axis=-1)
            return parts.reshape((*self.shape[:-1], 2 * self.shape[-1]))
        if source.kind == "f" and target == np.dtype(f"c{2 * source.itemsize}") and self.ndim:
            if self.shape[-1] % 2:
                raise ValueError("view as complex needs an even last axis")
            xp = self.__array_namespace__()
            pairs = self.reshape((*self.shape[:-1], self.shape[-1] // 2, 2))
            real, imag = (pairs[..., i].astype(target) for i in (0, 1))
            values: Self = xp.add(real, xp.multiply(imag, 1j))
            return values
        raise TypeError(
            f"view({target}) of a {source} array: a remote array's bytes cannot be "
            "reinterpreted; only complex <-> float views of the same precision are supported "
            "(use astype to convert values)"
        )
