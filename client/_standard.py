"""The rest of the standard's main namespace: manipulation, searching, sorting, sets,
cumulative and utility functions, and the data-type functions.

Each function builds one op of a protocol family (``protocol.ops.manipulation``,
``protocol.ops.data``, ``protocol.ops.indexing``), or composes a few when the standard's
function is a thin layer over others (``unstack``, ``broadcast_arrays``, ``meshgrid``,
``vecdot``, ``diff``, ``clip``).
"""

from __future__ import annotations

import builtins
import operator
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np

from protocol.dtypes import is_complex, is_integer
from protocol.ops import (
    Axes,
    BinaryName,
    BroadcastTo,
    Cumulative,
    Join,
    Linalg,
    Linspace,
    MoveAxis,
    Nonzero,
    Repeat,
    Roll,
    SearchSorted,
    Sort,
    Take,
    Tile,
    Triangle,
    Unique,
    broadcast_shapes,
)
from protocol.ops.data import UNIQUE_OUTPUTS

from . import _functions as _f
from ._results import UniqueAll, UniqueCounts, UniqueInverse
from .array import RemoteArray
from .device import Device


def _ints(value: int | Sequence[int]) -> tuple[int, ...]:
    if isinstance(value, int | np.integer):
        return (operator.index(value),)
    return tuple(operator.index(v) for v in value)


def _opt_ints(value: int | Sequence[int] | None) -> tuple[int, ...] | None:
    return None if value is None else _ints(value)


def _opt_int(value: int | None) -> int | None:
    """A Python int (the wire's models are strict: numpy integers are converted here)."""
    return None if value is None else operator.index(value)


class StandardFunctions:
    """Mixed into :class:`~client.namespace.Namespace`; ``self.device`` is the default device."""

    device: Device

    # --- creation -----------------------------------------------------------------------------

    def linspace(self, start: int | float | complex, stop: int | float | complex, /, num: int,
                 *, dtype: Any = None, device: Device | None = None,
                 endpoint: builtins.bool = True) -> RemoteArray:  # fmt: skip
        is_c = isinstance(start, complex) or isinstance(stop, complex)
        wire = _f.wire_dtype(dtype) if dtype is not None else "complex128" if is_c else "float64"
        a, b = complex(start), complex(stop)
        dev = self.device if device is None else device
        num = operator.index(num)
        return _f.apply(
            lambda out: Linspace(out=out, start=a.real, stop=b.real, start_imag=a.imag,
                                 stop_imag=b.imag, num=num, endpoint=endpoint, dtype=wire),
            device=dev,
        )  # fmt: skip

    @staticmethod
    def meshgrid(*arrays: RemoteArray, indexing: str = "xy") -> list[RemoteArray]:
        if indexing not in ("xy", "ij"):
            raise ValueError("indexing must be 'xy' or 'ij'")
        dtypes = {a.wire_dtype for a in arrays}
        if len(dtypes) > 1:
            raise TypeError("meshgrid needs arrays of one dtype")
        sizes = [a.size for a in arrays]
        if indexing == "xy" and len(arrays) > 1:
            sizes[0], sizes[1] = sizes[1], sizes[0]
        out = []
        for i, a in enumerate(arrays):
            shape = [1] * len(arrays)
            axis = i
            if indexing == "xy" and len(arrays) > 1 and i < 2:
                axis = 1 - i
            shape[axis] = a.size
            out.append(StandardFunctions.broadcast_to(_f.reshape(a, shape), sizes))
        return out

    @staticmethod
    def tril(x: RemoteArray, /, *, k: int = 0) -> RemoteArray:
        k = operator.index(k)
        return _f.apply(lambda out: Triangle(out=out, op="tril", x=x.tensor_id, k=k), x)

    @staticmethod
    def triu(x: RemoteArray, /, *, k: int = 0) -> RemoteArray:
        k = operator.index(k)
        return _f.apply(lambda out: Triangle(out=out, op="triu", x=x.tensor_id, k=k), x)

    def from_dlpack(self, x: Any, /, *, device: Device | None = None,
                    copy: builtins.bool | None = None) -> RemoteArray:  # fmt: skip
        """Copies a local DLPack-capable array (numpy, torch CPU, ...) to the device."""
        target = self.device if device is None else device
        if isinstance(x, RemoteArray) and (x.device is target or copy is not False):
            return _f.astype(x, x.dtype) if copy else x.to_device(target)
        if copy is False:
            raise BufferError("a remote device cannot share a local array's memory")
        return _f.upload(np.from_dlpack(x), target)

    # --- manipulation -------------------------------------------------------------------------

    @staticmethod
    def concat(arrays: Sequence[RemoteArray], /, *, axis: int | None = 0) -> RemoteArray:
        axis = _opt_int(axis)
        ids = tuple(a.tensor_id for a in arrays)
        return _f.apply(lambda out: Join(out=out, op="concat", xs=ids, axis=axis), *arrays)

    @staticmethod
    def stack(arrays: Sequence[RemoteArray], /, *, axis: int = 0) -> RemoteArray:
        axis = operator.index(axis)
        ids = tuple(a.tensor_id for a in arrays)
        return _f.apply(lambda out: Join(out=out, op="stack", xs=ids, axis=axis), *arrays)

    @staticmethod
    def expand_dims(x: RemoteArray, /, axis: int | Sequence[int] = 0) -> RemoteArray:
        axes = _ints(axis)
        return _f.apply(lambda out: Axes(out=out, op="expand_dims", x=x.tensor_id, axis=axes), x)

    @staticmethod
    def squeeze(x: RemoteArray, /, axis: int | Sequence[int]) -> RemoteArray:
        axes = _ints(axis)
        return _f.apply(lambda out: Axes(out=out, op="squeeze", x=x.tensor_id, axis=axes), x)

    @staticmethod
    def flip(x: RemoteArray, /, *, axis: int | Sequence[int] | None = None) -> RemoteArray:
        axes = _opt_ints(axis)
        return _f.apply(lambda out: Axes(out=out, op="flip", x=x.tensor_id, axis=axes), x)

    @staticmethod
    def roll(x: RemoteArray, /, shift: int | Sequence[int], *,
             axis: int | Sequence[int] | None = None) -> RemoteArray:  # fmt: skip
        shifts, axes = _ints(shift), _opt_ints(axis)
        return _f.apply(lambda out: Roll(out=out, x=x.tensor_id, shift=shifts, axis=axes), x)

    @staticmethod
    def moveaxis(x: RemoteArray, source: int | Sequence[int], destination: int | Sequence[int],
                 /) -> RemoteArray:  # fmt: skip
        src, dst = _ints(source), _ints(destination)
        return _f.apply(
            lambda out: MoveAxis(out=out, x=x.tensor_id, source=src, destination=dst), x
        )

    @staticmethod
    def broadcast_to(x: RemoteArray, /, shape: Sequence[int]) -> RemoteArray:
        dims = _ints(shape)
        return _f.apply(lambda out: BroadcastTo(out=out, x=x.tensor_id, shape=dims), x)

    @staticmethod
    def broadcast_arrays(*arrays: RemoteArray) -> list[RemoteArray]:
        shape = broadcast_shapes(*(a.shape for a in arrays))
        return [StandardFunctions.broadcast_to(a, shape) for a in arrays]

    @staticmethod
    def tile(x: RemoteArray, repetitions: Sequence[int], /) -> RemoteArray:
        reps = _ints(repetitions)
        return _f.apply(lambda out: Tile(out=out, x=x.tensor_id, reps=reps), x)

    @staticmethod
    def repeat(x: RemoteArray, repeats: int | RemoteArray, /, *,
               axis: int | None = None) -> RemoteArray:  # fmt: skip
        axis = _opt_int(axis)
        if isinstance(repeats, RemoteArray):
            r = repeats
            return _f.apply(
                lambda out: Repeat(out=out, x=x.tensor_id, repeats_tensor=r.tensor_id, axis=axis),
                x,
                r,
            )
        n = operator.index(repeats)
        return _f.apply(lambda out: Repeat(out=out, x=x.tensor_id, repeats=n, axis=axis), x)

    @staticmethod
    def unstack(x: RemoteArray, /, *, axis: int = 0) -> tuple[RemoteArray, ...]:
        if x.ndim == 0:
            raise ValueError("unstack needs at least one dimension")
        axis = axis % x.ndim if -x.ndim <= axis < x.ndim else axis
        if not 0 <= axis < x.ndim:
            raise ValueError(f"axis {axis} is out of bounds")
        lead = (slice(None),) * axis
        return tuple(x[(*lead, i, ...)] for i in range(x.shape[axis]))

    # --- indexing -----------------------------------------------------------------------------

    @staticmethod
    def take(x: RemoteArray, indices: RemoteArray, /, *, axis: int | None = None) -> RemoteArray:
        if axis is None:
            if x.ndim != 1:
                raise ValueError("take of a multi-dimensional array needs an axis")
            axis = 0
        a = operator.index(axis)
        return _f.apply(
            lambda out: Take(out=out, op="take", x=x.tensor_id, indices=indices.tensor_id, axis=a),
            x,
            indices,
        )

    @staticmethod
    def take_along_axis(x: RemoteArray, indices: RemoteArray, /, *,
                        axis: int = -1) -> RemoteArray:  # fmt: skip
        axis = operator.index(axis)
        return _f.apply(
            lambda out: Take(
                out=out, op="take_along_axis", x=x.tensor_id, indices=indices.tensor_id, axis=axis
            ),
            x,
            indices,
        )

    # --- searching, sorting, sets -------------------------------------------------------------

    @staticmethod
    def sort(x: RemoteArray, /, *, axis: int = -1, descending: builtins.bool = False,
             stable: builtins.bool = True) -> RemoteArray:  # fmt: skip
        return _sort("sort", x, axis, descending, stable)

    @staticmethod
    def argsort(x: RemoteArray, /, *, axis: int = -1, descending: builtins.bool = False,
                stable: builtins.bool = True) -> RemoteArray:  # fmt: skip
        return _sort("argsort", x, axis, descending, stable)

    @staticmethod
    def searchsorted(x1: RemoteArray, x2: RemoteArray, /, *, side: str = "left",
                     sorter: RemoteArray | None = None) -> RemoteArray:  # fmt: skip
        if side not in ("left", "right"):
            raise ValueError("side must be 'left' or 'right'")
        if sorter is not None:
            x1 = StandardFunctions.take(x1, sorter, axis=0)
        s: Any = side
        a, b = x1, x2
        return _f.apply(
            lambda out: SearchSorted(out=out, x1=a.tensor_id, x2=b.tensor_id, side=s), a, b
        )

    @staticmethod
    def nonzero(x: RemoteArray, /) -> tuple[RemoteArray, ...]:
        """One round trip: the number of non-zero elements is data-dependent."""
        count = max(x.ndim, 1)
        return _f.apply_many(lambda out, more: Nonzero(out=out, more=more, x=x.tensor_id), count, x)

    @staticmethod
    def count_nonzero(x: RemoteArray, /, *, axis: int | Sequence[int] | None = None,
                      keepdims: builtins.bool = False) -> RemoteArray:  # fmt: skip
        nonzero = _f.binary_operator("not_equal", x, 0, reflected=False)
        return _f.reduce("sum", _f.astype(nonzero, "int64"), axis, keepdims)

    @staticmethod
    def _unique(name: Any, x: RemoteArray) -> tuple[RemoteArray, ...]:
        count = len(UNIQUE_OUTPUTS[name])
        return _f.apply_many(
            lambda out, more: Unique(out=out, more=more, op=name, x=x.tensor_id), count, x
        )

    @staticmethod
    def unique_all(x: RemoteArray, /) -> UniqueAll:
        return UniqueAll(*StandardFunctions._unique("unique_all", x))

    @staticmethod
    def unique_counts(x: RemoteArray, /) -> UniqueCounts:
        return UniqueCounts(*StandardFunctions._unique("unique_counts", x))

    @staticmethod
    def unique_inverse(x: RemoteArray, /) -> UniqueInverse:
        return UniqueInverse(*StandardFunctions._unique("unique_inverse", x))

    @staticmethod
    def unique_values(x: RemoteArray, /) -> RemoteArray:
        return StandardFunctions._unique("unique_values", x)[0]

    # --- cumulative and utility ---------------------------------------------------------------

    @staticmethod
    def _cumulative(name: Any, x: RemoteArray, axis: int | None, dtype: Any,
                    include_initial: builtins.bool) -> RemoteArray:  # fmt: skip
        if dtype is not None:
            x = _f.astype(x, dtype)
        axis = _opt_int(axis)
        result = _f.apply(
            lambda out: Cumulative(out=out, op=name, x=x.tensor_id, axis=axis,
                                   include_initial=include_initial),
            x,
        )  # fmt: skip
        if dtype is not None and result.dtype != np.dtype(dtype):
            result = _f.astype(result, dtype)
        return result

    @staticmethod
    def cumulative_sum(x: RemoteArray, /, *, axis: int | None = None, dtype: Any = None,
                       include_initial: builtins.bool = False) -> RemoteArray:  # fmt: skip
        return StandardFunctions._cumulative("cumulative_sum", x, axis, dtype, include_initial)

    @staticmethod
    def cumulative_prod(x: RemoteArray, /, *, axis: int | None = None, dtype: Any = None,
                        include_initial: builtins.bool = False) -> RemoteArray:  # fmt: skip
        return StandardFunctions._cumulative("cumulative_prod", x, axis, dtype, include_initial)

    @staticmethod
    def diff(x: RemoteArray, /, *, axis: int = -1, n: int = 1,
             prepend: RemoteArray | None = None,
             append: RemoteArray | None = None) -> RemoteArray:  # fmt: skip
        if x.ndim == 0:
            raise ValueError("diff needs at least one dimension")
        parts = [p for p in (prepend, x, append) if p is not None]
        if len(parts) > 1:
            x = StandardFunctions.concat(parts, axis=axis)
        lead = (slice(None),) * (axis % x.ndim)
        for _ in range(n):
            later, earlier = x[(*lead, slice(1, None))], x[(*lead, slice(None, -1))]
            x = _f.binary("not_equal" if x.wire_dtype == "bool" else "subtract", later, earlier)
        return x

    @staticmethod
    def clip(x: RemoteArray, /, min: Any = None, max: Any = None) -> RemoteArray:  # noqa: A002
        """Note: the result keeps ``x``'s dtype, as the standard asks (numpy promotes)."""
        if is_complex(x.wire_dtype):
            raise TypeError("clip does not order complex numbers")
        result = x
        names: tuple[BinaryName, BinaryName] = ("maximum", "minimum")
        for bound, name in zip((min, max), names, strict=True):
            if bound is None:
                continue
            if not isinstance(bound, RemoteArray) and is_integer(x.wire_dtype):
                if isinstance(bound, float):
                    raise TypeError("a float bound cannot clip an integer array")
                info = np.iinfo(x.dtype)
                bound = builtins.min(builtins.max(int(bound), int(info.min)), int(info.max))
            other = _f.operand(bound, x)
            if other is None:
                raise TypeError(f"clip does not take {type(bound).__name__}")
            if other.wire_dtype != x.wire_dtype:
                other = _f.astype(other, x.dtype)
            result = _f.binary(name, result, other)  # a NaN bound propagates
        return result if result is not x else _f.astype(x, x.dtype)

    @staticmethod
    def vecdot(x1: RemoteArray, x2: RemoteArray, /, *, axis: int = -1) -> RemoteArray:
        """numpy's ``vecdot`` (conjugates ``x1``); a non-negative ``axis`` counts in the
        broadcast shape."""
        ndim = max(x1.ndim, x2.ndim)
        axis = operator.index(axis)
        a = axis - ndim if axis >= 0 else axis
        return _f.apply(
            lambda out: Linalg(out=out, op="vecdot", xs=(x1.tensor_id, x2.tensor_id), axis=(a,)),
            x1,
            x2,
        )

    @staticmethod
    def tensordot(x1: RemoteArray, x2: RemoteArray, /, *,
                  axes: int | tuple[Sequence[int], Sequence[int]] = 2) -> RemoteArray:  # fmt: skip
        if isinstance(axes, int | np.integer):
            n = operator.index(axes)
            if n < 0:
                raise ValueError("tensordot axes must be non-negative")
            a1 = tuple(range(x1.ndim - n, x1.ndim))
            a2 = tuple(range(n))
        else:
            a1, a2 = _ints(axes[0]), _ints(axes[1])
        return _f.apply(
            lambda out: Linalg(out=out, op="tensordot", xs=(x1.tensor_id, x2.tensor_id),
                               axes1=a1, axes2=a2),
            x1,
            x2,
        )  # fmt: skip


def _sort(
    op: Literal["sort", "argsort"], x: RemoteArray, axis: int, descending: bool, stable: bool
) -> RemoteArray:
    axis = operator.index(axis)
    return _f.apply(
        lambda out: Sort(out=out, op=op, x=x.tensor_id, axis=axis, descending=descending,
                         stable=stable),
        x,
    )  # fmt: skip
