"""Creation functions: arrays from values, ranges, fills and other arrays."""

from __future__ import annotations

import builtins
import operator
from collections.abc import Sequence
from typing import Any

import numpy as np

from protocol import OpArgumentError
from protocol.ops import Arange, Eye, Linspace, Triangle
from protocol.scalars import PyScalar, default_dtype

from .._building import apply, full, upload
from .._handle import checked_device, ints, wire_dtype
from ..array import PY_SCALARS, RemoteArray, astype, reshape
from ..device import Device
from .manipulation import ManipulationFunctions

_FLOAT64 = np.dtype("float64")  # the standard's default real floating dtype


def _number(value: Any) -> Any:
    """A numpy scalar or a 0-d array (local or remote: one read) as the Python number it
    holds, so that a numpy integer counts as an integer (numpy's ``arange`` rule)."""
    if isinstance(value, np.generic | np.ndarray | RemoteArray):
        return np.asarray(value).item()
    return value


def _filled(shape: int | Sequence[int], fill: RemoteArray, dtype: Any) -> RemoteArray:
    """``fill`` broadcast to ``shape`` as a new array of ``dtype`` (``fill``'s by default)."""
    grid = ManipulationFunctions.broadcast_to(fill, ints(shape))
    return astype(grid, fill.dtype if dtype is None else dtype)


class CreationFunctions:
    """Mixed into :class:`~client.namespace.Namespace`; ``self.device`` is the default device."""

    device: Device

    def _dev(self, device: Device | None) -> Device:
        return self.device if device is None else checked_device(device)

    def asarray(
        self,
        obj: Any,
        /,
        *,
        dtype: Any = None,
        device: Device | None = None,
        copy: builtins.bool | None = None,
    ) -> RemoteArray:
        """An array on ``device`` from an array, a nested sequence or a scalar."""
        dev = self._dev(device)
        if isinstance(obj, RemoteArray):
            if obj.device is not dev:
                obj = upload(obj.numpy(), dev)
            if dtype is not None and obj.dtype != np.dtype(dtype):
                return astype(obj, dtype)
            return astype(obj, obj.dtype) if copy else obj
        if copy is False:
            raise ValueError("copy=False: a local object cannot reach the device without a copy")
        values = np.asarray(obj, dtype=None if dtype is None else np.dtype(dtype))
        return upload(values, dev)

    def full(
        self,
        shape: int | Sequence[int],
        fill_value: PyScalar,
        *,
        dtype: Any = None,
        device: Device | None = None,
    ) -> RemoteArray:
        """``shape`` filled with ``fill_value``: a Python scalar (the default dtype of its kind),
        or, as numpy's ``full`` takes them, a numpy scalar, an array or a remote array (its
        dtype, broadcast to ``shape``; a remote one is copied on the device, not read)."""
        dev = self._dev(device)
        if isinstance(fill_value, PY_SCALARS):
            wire = default_dtype(fill_value) if dtype is None else wire_dtype(dtype)
            return full(shape, fill_value, wire, dev)
        if isinstance(fill_value, RemoteArray):
            return _filled(shape, fill_value.to_device(dev), dtype)
        if not isinstance(fill_value, np.ndarray | np.generic):
            kind = type(fill_value).__name__
            raise OpArgumentError(f"full: fill_value must be a scalar or an array, not {kind}")
        values = np.asarray(fill_value)
        if values.ndim:
            return _filled(shape, upload(values, dev), dtype)
        wire = wire_dtype(values.dtype if dtype is None else dtype)
        return full(shape, values.item(), wire, dev)

    def zeros(
        self, shape: int | Sequence[int], *, dtype: Any = None, device: Device | None = None
    ) -> RemoteArray:
        return self.full(shape, 0, dtype=_FLOAT64 if dtype is None else dtype, device=device)

    def ones(
        self, shape: int | Sequence[int], *, dtype: Any = None, device: Device | None = None
    ) -> RemoteArray:
        return self.full(shape, 1, dtype=_FLOAT64 if dtype is None else dtype, device=device)

    def empty(
        self, shape: int | Sequence[int], *, dtype: Any = None, device: Device | None = None
    ) -> RemoteArray:
        return self.zeros(shape, dtype=dtype, device=device)

    def full_like(
        self,
        x: RemoteArray,
        /,
        fill_value: PyScalar,
        *,
        dtype: Any = None,
        device: Device | None = None,
    ) -> RemoteArray:
        return self.full(
            x.shape,
            fill_value,
            dtype=x.dtype if dtype is None else dtype,
            device=x.device if device is None else checked_device(device),
        )

    def zeros_like(
        self, x: RemoteArray, /, *, dtype: Any = None, device: Device | None = None
    ) -> RemoteArray:
        return self.full_like(x, 0, dtype=dtype, device=device)

    def ones_like(
        self, x: RemoteArray, /, *, dtype: Any = None, device: Device | None = None
    ) -> RemoteArray:
        return self.full_like(x, 1, dtype=dtype, device=device)

    def empty_like(
        self, x: RemoteArray, /, *, dtype: Any = None, device: Device | None = None
    ) -> RemoteArray:
        return self.zeros_like(x, dtype=dtype, device=device)

    def arange(
        self,
        start: int | float,
        /,
        stop: int | float | None = None,
        step: int | float = 1,
        *,
        dtype: Any = None,
        device: Device | None = None,
    ) -> RemoteArray:
        if stop is None:
            start, stop = 0, start
        start, stop, step = _number(start), _number(stop), _number(step)
        if dtype is None:
            ints = all(isinstance(v, int) for v in (start, stop, step))
            dtype = "int64" if ints else "float64"
        wire = wire_dtype(dtype)
        return apply(
            lambda out: Arange(out=out, start=start, stop=stop, step=step, dtype=wire),
            device=self._dev(device),
        )

    def eye(
        self,
        n_rows: int,
        n_cols: int | None = None,
        /,
        *,
        k: int = 0,
        dtype: Any = None,
        device: Device | None = None,
    ) -> RemoteArray:
        wire = "float64" if dtype is None else wire_dtype(dtype)
        rows, k = operator.index(n_rows), operator.index(k)
        cols = rows if n_cols is None else operator.index(n_cols)
        k = max(-rows, min(k, cols))  # a diagonal outside the matrix: all zeros, any such k
        return apply(
            lambda out: Eye(out=out, n_rows=rows, n_cols=cols, k=k, dtype=wire),
            device=self._dev(device),
        )

    def linspace(
        self,
        start: int | float | complex,
        stop: int | float | complex,
        /,
        num: int,
        *,
        dtype: Any = None,
        device: Device | None = None,
        endpoint: builtins.bool = True,
    ) -> RemoteArray:
        is_c = isinstance(start, complex) or isinstance(stop, complex)
        wire = wire_dtype(dtype) if dtype is not None else "complex128" if is_c else "float64"
        a, b = complex(start), complex(stop)
        num = operator.index(num)
        return apply(
            lambda out: Linspace(
                out=out,
                start=a.real,
                stop=b.real,
                start_imag=a.imag,
                stop_imag=b.imag,
                num=num,
                endpoint=endpoint,
                dtype=wire,
            ),
            device=self._dev(device),
        )

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
            grid = ManipulationFunctions.broadcast_to(reshape(a, shape), sizes)
            out.append(astype(grid, grid.dtype))  # copies, as numpy's: not views of the inputs
        return out

    @staticmethod
    def tril(x: RemoteArray, /, *, k: int = 0) -> RemoteArray:
        k = operator.index(k)
        return apply(lambda out: Triangle(out=out, op="tril", x=x.tensor_id, k=k), x)

    @staticmethod
    def triu(x: RemoteArray, /, *, k: int = 0) -> RemoteArray:
        k = operator.index(k)
        return apply(lambda out: Triangle(out=out, op="triu", x=x.tensor_id, k=k), x)

    def from_dlpack(
        self, x: Any, /, *, device: Device | None = None, copy: builtins.bool | None = None
    ) -> RemoteArray:
        """Copies a local DLPack-capable array (numpy, torch CPU, ...) to the device."""
        target = self._dev(device)
        if isinstance(x, RemoteArray) and (x.device is target or copy is not False):
            return astype(x, x.dtype) if copy else x.to_device(target)
        if copy is False:
            raise BufferError("a remote device cannot share a local array's memory")
        return upload(np.from_dlpack(x), target)
