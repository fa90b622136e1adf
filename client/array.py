"""``RemoteArray``: a handle on a tensor that lives on a server.

A handle knows its id, shape, dtype and device locally. Operators build ops and return new
handles at once; only :meth:`RemoteArray.numpy` (and what needs a value: ``bool(x)``,
``float(x)``, ``np.asarray(x)``) waits for the server. Dropping the last reference frees the
tensor on the server (batched with the next flush).
"""

from __future__ import annotations

import operator
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from protocol import DType, TensorMeta, to_numpy

if TYPE_CHECKING:
    from .device import Device
    from .namespace import Namespace


class RemoteArray:
    """A tensor on a remote device. Create them with a namespace: ``client.namespace(dev)``."""

    __slots__ = ("_device", "_id", "_meta", "__weakref__")
    __array_ufunc__ = None  # numpy defers to our reflected operators instead of downloading
    __hash__ = None  # type: ignore[assignment]  # __eq__ is element-wise, as in numpy

    def __init__(self, device: Device, tensor_id: int, meta: TensorMeta) -> None:
        self._device = device
        self._id = tensor_id
        self._meta = meta

    def __del__(self) -> None:
        try:  # not contextlib.suppress: this runs once per op, and try costs nothing
            self._device._conn.release(self._id)
        except Exception:  # noqa: S110 - at interpreter exit the session ends anyway
            pass

    # --- what is known locally ----------------------------------------------------------------

    @property
    def tensor_id(self) -> int:
        return self._id

    @property
    def meta(self) -> TensorMeta:
        return self._meta

    @property
    def shape(self) -> tuple[int, ...]:
        return self._meta.shape

    @property
    def dtype(self) -> np.dtype[Any]:
        return to_numpy(self._meta.dtype)

    @property
    def wire_dtype(self) -> DType:
        return self._meta.dtype

    @property
    def device(self) -> Device:
        return self._device

    @property
    def ndim(self) -> int:
        return len(self._meta.shape)

    @property
    def size(self) -> int:
        n = 1
        for d in self._meta.shape:
            n *= d
        return n

    @property
    def T(self) -> RemoteArray:  # noqa: N802 - the standard's name
        return _f.permute_dims(self, tuple(reversed(range(self.ndim))))

    @property
    def mT(self) -> RemoteArray:  # noqa: N802 - the standard's name
        return _f.matrix_transpose(self)

    def __repr__(self) -> str:
        shape = "(" + ", ".join(map(str, self.shape)) + ("," if self.ndim == 1 else "") + ")"
        dtype, dev = self._meta.dtype, self._device
        return f"RemoteArray(shape={shape}, dtype={dtype}, id=#{self._id}, device={dev!r})"

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d array")
        return self.shape[0]

    def __iter__(self) -> Iterator[RemoteArray]:
        if not self.shape:
            raise TypeError("iteration over a 0-d array")
        for i in range(self.shape[0]):
            yield self[i]

    # --- values: these wait for the server ------------------------------------------------------

    def numpy(self) -> np.ndarray[Any, Any]:
        """The values as a new, writable numpy array (one round trip).

        Raises:
            RemoteError: the op that produced this tensor, or one it depends on, failed.
            ConnectionLost: the connection closed or broke.
        """
        return self._device._read_blocking(self)

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray[Any, Any]:
        values = self.numpy()
        return values if dtype is None else values.astype(dtype, copy=False)

    def _scalar(self) -> Any:
        if self.size != 1:
            raise TypeError(f"only arrays with one element can be converted, not {self.shape}")
        return self.numpy().reshape(()).item()

    def __bool__(self) -> bool:
        return bool(self._scalar())

    def __int__(self) -> int:
        return int(self._scalar())

    def __float__(self) -> float:
        return float(self._scalar())

    def __complex__(self) -> complex:
        return complex(self._scalar())

    def __index__(self) -> int:
        if self._meta.dtype == "bool" or not self._meta.dtype.startswith(("int", "uint")):
            raise TypeError(f"only integer arrays can be used as an index, not {self.dtype}")
        return operator.index(self._scalar())

    # --- ops ----------------------------------------------------------------------------------

    def __array_namespace__(self, *, api_version: str | None = None) -> Namespace:
        from .namespace import namespace

        if api_version not in (None, "2021.12", "2022.12", "2023.12", "2024.12"):
            raise ValueError(f"unsupported array API version {api_version!r}")
        return namespace(self._device)

    def astype(self, dtype: Any) -> RemoteArray:
        return _f.astype(self, dtype)

    def reshape(self, *shape: Any) -> RemoteArray:
        if len(shape) == 1 and isinstance(shape[0], tuple | list):
            shape = tuple(shape[0])
        return _f.reshape(self, shape)

    def __getitem__(self, key: Any) -> RemoteArray:
        return _f.getitem(self, key)

    def __setitem__(self, key: Any, value: Any) -> None:
        _f.setitem(self, key, value)

    def to_device(self, device: Any, /, *, stream: Any = None) -> RemoteArray:
        """This array on ``device``: itself when already there, else a copy (between two
        servers the bytes go through the client for now)."""
        if stream is not None:
            raise ValueError("remote devices have no streams")
        if device is self._device:
            return self
        return _f.upload(self.numpy(), device)

    def __dlpack__(self, *, stream: Any = None, max_version: Any = None,
                   dl_device: Any = None, copy: Any = None) -> Any:  # fmt: skip
        """A DLPack capsule of a *host copy* (one read): a remote array's memory is on a
        server, so it cannot be shared. The capsule describes CPU memory.

        Raises:
            BufferError: ``copy=False`` (sharing is impossible) or a non-CPU ``dl_device``.
        """
        if copy is False:
            raise BufferError("a remote array's memory is on a server: it can only be copied")
        if dl_device is not None and tuple(dl_device) != (1, 0):
            raise BufferError("a remote array can only be exported to the host CPU")
        kwargs = {} if max_version is None else {"max_version": max_version}
        return self.numpy().__dlpack__(**kwargs)

    def __dlpack_device__(self) -> tuple[int, int]:
        """``(kDLCPU, 0)``: :meth:`__dlpack__` exports a host copy."""
        return (1, 0)

    def __neg__(self) -> RemoteArray:
        return _f.negative(self)

    def __pos__(self) -> RemoteArray:
        return _f.positive(self)

    def __abs__(self) -> RemoteArray:
        return _f.abs(self)

    def __invert__(self) -> RemoteArray:
        return _f.bitwise_invert(self)

    def __add__(self, other: Any) -> RemoteArray:
        return _f.binary_operator("add", self, other, reflected=False)

    def __radd__(self, other: Any) -> RemoteArray:
        return _f.binary_operator("add", self, other, reflected=True)

    def __sub__(self, other: Any) -> RemoteArray:
        return _f.binary_operator("subtract", self, other, reflected=False)

    def __rsub__(self, other: Any) -> RemoteArray:
        return _f.binary_operator("subtract", self, other, reflected=True)

    def __mul__(self, other: Any) -> RemoteArray:
        return _f.binary_operator("multiply", self, other, reflected=False)

    def __rmul__(self, other: Any) -> RemoteArray:
        return _f.binary_operator("multiply", self, other, reflected=True)

    def __truediv__(self, other: Any) -> RemoteArray:
        return _f.binary_operator("divide", self, other, reflected=False)

    def __rtruediv__(self, other: Any) -> RemoteArray:
        return _f.binary_operator("divide", self, other, reflected=True)

    def __floordiv__(self, other: Any) -> RemoteArray:
        return _f.binary_operator("floor_divide", self, other, reflected=False)

    def __rfloordiv__(self, other: Any) -> RemoteArray:
        return _f.binary_operator("floor_divide", self, other, reflected=True)

    def __mod__(self, other: Any) -> RemoteArray:
        return _f.binary_operator("remainder", self, other, reflected=False)

    def __rmod__(self, other: Any) -> RemoteArray:
        return _f.binary_operator("remainder", self, other, reflected=True)

    def __pow__(self, other: Any) -> RemoteArray:
        return _f.binary_operator("pow", self, other, reflected=False)

    def __rpow__(self, other: Any) -> RemoteArray:
        return _f.binary_operator("pow", self, other, reflected=True)

    def __matmul__(self, other: Any) -> RemoteArray:
        return _f.binary_operator("matmul", self, other, reflected=False)

    def __rmatmul__(self, other: Any) -> RemoteArray:
        return _f.binary_operator("matmul", self, other, reflected=True)

    def __and__(self, other: Any) -> RemoteArray:
        return _f.binary_operator("bitwise_and", self, other, reflected=False)

    def __rand__(self, other: Any) -> RemoteArray:
        return _f.binary_operator("bitwise_and", self, other, reflected=True)

    def __or__(self, other: Any) -> RemoteArray:
        return _f.binary_operator("bitwise_or", self, other, reflected=False)

    def __ror__(self, other: Any) -> RemoteArray:
        return _f.binary_operator("bitwise_or", self, other, reflected=True)

    def __xor__(self, other: Any) -> RemoteArray:
        return _f.binary_operator("bitwise_xor", self, other, reflected=False)

    def __rxor__(self, other: Any) -> RemoteArray:
        return _f.binary_operator("bitwise_xor", self, other, reflected=True)

    def __lshift__(self, other: Any) -> RemoteArray:
        return _f.binary_operator("bitwise_left_shift", self, other, reflected=False)

    def __rlshift__(self, other: Any) -> RemoteArray:
        return _f.binary_operator("bitwise_left_shift", self, other, reflected=True)

    def __rshift__(self, other: Any) -> RemoteArray:
        return _f.binary_operator("bitwise_right_shift", self, other, reflected=False)

    def __rrshift__(self, other: Any) -> RemoteArray:
        return _f.binary_operator("bitwise_right_shift", self, other, reflected=True)

    def __iadd__(self, other: Any) -> RemoteArray:
        return _f.inplace_operator("add", self, other)

    def __isub__(self, other: Any) -> RemoteArray:
        return _f.inplace_operator("subtract", self, other)

    def __imul__(self, other: Any) -> RemoteArray:
        return _f.inplace_operator("multiply", self, other)

    def __itruediv__(self, other: Any) -> RemoteArray:
        return _f.inplace_operator("divide", self, other)

    def __ifloordiv__(self, other: Any) -> RemoteArray:
        return _f.inplace_operator("floor_divide", self, other)

    def __imod__(self, other: Any) -> RemoteArray:
        return _f.inplace_operator("remainder", self, other)

    def __ipow__(self, other: Any) -> RemoteArray:
        return _f.inplace_operator("pow", self, other)

    def __imatmul__(self, other: Any) -> RemoteArray:
        return _f.inplace_operator("matmul", self, other)

    def __iand__(self, other: Any) -> RemoteArray:
        return _f.inplace_operator("bitwise_and", self, other)

    def __ior__(self, other: Any) -> RemoteArray:
        return _f.inplace_operator("bitwise_or", self, other)

    def __ixor__(self, other: Any) -> RemoteArray:
        return _f.inplace_operator("bitwise_xor", self, other)

    def __ilshift__(self, other: Any) -> RemoteArray:
        return _f.inplace_operator("bitwise_left_shift", self, other)

    def __irshift__(self, other: Any) -> RemoteArray:
        return _f.inplace_operator("bitwise_right_shift", self, other)

    def __lt__(self, other: Any) -> RemoteArray:
        return _f.binary_operator("less", self, other, reflected=False)

    def __le__(self, other: Any) -> RemoteArray:
        return _f.binary_operator("less_equal", self, other, reflected=False)

    def __gt__(self, other: Any) -> RemoteArray:
        return _f.binary_operator("greater", self, other, reflected=False)

    def __ge__(self, other: Any) -> RemoteArray:
        return _f.binary_operator("greater_equal", self, other, reflected=False)

    def __eq__(self, other: Any) -> RemoteArray:  # type: ignore[override]
        return _f.binary_operator("equal", self, other, reflected=False)

    def __ne__(self, other: Any) -> RemoteArray:  # type: ignore[override]
        return _f.binary_operator("not_equal", self, other, reflected=False)


from . import _functions as _f  # noqa: E402  (functions build RemoteArrays: a cycle by nature)
