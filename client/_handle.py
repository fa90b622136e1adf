"""What a remote array knows locally, and how its values come back.

:class:`Handle` is the base of :class:`~client.array.RemoteArray`: its id, shape, dtype and
device, the conversions that read its values, and the free when it is dropped. It builds no op
(``client.array`` adds the ops); it sits between the device API it calls and the array module.
The helpers here turn user arguments into wire values and need no handle class.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import numpy as np

from protocol import DType, TensorMeta, from_numpy, to_numpy
from protocol.ops import ArrayIndex, IndexItem, SliceSpec
from protocol.ops.indexing import key_tensors

from ._known import VALUES_KEPT
from ._origins import values_of
from ._printing import array_repr, array_str, printing_values
from .device import Device
from .errors import ConnectionLost


class Handle:
    """A tensor on a remote device, as far as it is known without the server."""

    __slots__ = ("_device", "_id", "_meta", "_base", "__weakref__")

    def __init__(self, device: Device, tensor_id: int, meta: TensorMeta) -> None:
        self._device = device
        self._id = tensor_id
        self._meta = meta
        self._base = tensor_id  # the memory it may view (client._known); its own, unless told

    def __del__(self) -> None:
        try:  # not contextlib.suppress: this runs once per op, and try costs nothing
            self._device.release(self._id)
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

    def __repr__(self) -> str:
        """The values as numpy's repr writes them (one read, ``client._printing``), with the
        dtype and device; while printing values is off, or once the device is closed or lost,
        the shape, dtype, id and device."""
        name, dtype, dev = type(self).__name__, self._meta.dtype, self._device
        if printing_values():
            try:
                return array_repr(self, name, f"dtype={dtype}, device={dev!r}")
            except ConnectionLost:  # no values to show (a failed op's error still raises)
                pass
        shape = "(" + ", ".join(map(str, self.shape)) + ("," if self.ndim == 1 else "") + ")"
        return f"{name}(shape={shape}, dtype={dtype}, id=#{self._id}, device={dev!r})"

    def __str__(self) -> str:
        """The values as numpy's str writes them (one read); while printing values is off,
        the repr."""
        return array_str(self) if printing_values() else repr(self)

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d array")
        return self.shape[0]

    # --- values: these wait for the server ------------------------------------------------------

    def numpy(self) -> np.ndarray[Any, Any]:
        """The values as a new, writable numpy array, read from the server (one round trip,
        which also tells of a failed op or a lost session). The conversions (``np.asarray``,
        ``bool``, ``float``, ``int``, ...) answer without one when the client knows the values
        already (read or uploaded, and not written since: ``client._known``).

        Raises:
            RemoteError: the op that produced this tensor, or one it depends on, failed.
            ConnectionLost: the connection closed or broke.
        """
        device, known = self._device, self._device.known
        epoch = known.epoch  # the values read hold from before the reads are sent (threads)
        with device.together():  # one message: one round trip
            for along in known.read_along(self):  # no wait of their own
                known.learn(along, pending=device.submit_read(along.tensor_id), epoch=epoch)
            read = device.submit_read(self.tensor_id)
            known.confirm_along()
        values = values_of(device, read)  # a failed op's error says where it was made
        if values.nbytes <= VALUES_KEPT:
            kept = values.copy()
            kept.flags.writeable = False
            known.learn(self, values=kept, epoch=epoch)
        return values

    def _values(self) -> np.ndarray[Any, Any]:
        """The values for a conversion: a copy of those the client knows, else a read."""
        known = self._device.known
        kept = known.values(self) if known else None
        if kept is None:
            return self.numpy()
        known.check_open()
        return kept.copy()

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray[Any, Any]:
        values = self._values()
        return values if dtype is None else values.astype(dtype, copy=False)

    def _scalar(self) -> Any:
        if self.size != 1:
            raise TypeError(f"only arrays with one element can be converted, not {self.shape}")
        return self._values().reshape(()).item()

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

    def __dlpack__(
        self,
        *,
        stream: Any = None,
        max_version: Any = None,
        dl_device: Any = None,
        copy: Any = None,
    ) -> Any:
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
        return self._values().__dlpack__(**kwargs)

    def __dlpack_device__(self) -> tuple[int, int]:
        """``(kDLCPU, 0)``: :meth:`__dlpack__` exports a host copy."""
        return (1, 0)


# --- arguments to wire values ---------------------------------------------------------------


def wire_dtype(dtype: Any) -> DType:
    """A wire dtype name from a numpy dtype, a dtype name or a numpy scalar type."""
    return from_numpy(np.dtype(dtype))


def ints(value: int | Sequence[int]) -> tuple[int, ...]:
    """An int or a sequence of them as a tuple of Python ints (the wire's models are strict:
    numpy integers are converted here)."""
    if isinstance(value, int | np.integer):
        return (operator.index(value),)
    return tuple(operator.index(v) for v in value)


def opt_ints(value: int | Sequence[int] | None) -> tuple[int, ...] | None:
    return None if value is None else ints(value)


def opt_int(value: int | None) -> int | None:
    return None if value is None else operator.index(value)


def checked_device(device: Any) -> Device:
    """``device``, if it is a Tensorwire device.

    Raises:
        ValueError: it is not (``"cpu"``, numpy's device, is the usual one: array-api-compat's
            ``device(x)`` of a numpy array).
    """
    if not isinstance(device, Device):
        raise ValueError(
            f"{device!r} is not a Tensorwire device: pass a RemoteDevice (x.device of a remote "
            "array), or None for the namespace's own"
        )
    return device


def common_device(arrays: Sequence[Handle]) -> Device:
    """The device of ``arrays``.

    Raises:
        TypeError: one is not a remote array (a numpy array: upload it with ``xp.asarray``).
        ValueError: they are on different devices.
    """
    for a in arrays:
        if not isinstance(a, Handle):
            raise TypeError(
                f"expected remote arrays, got {type(a).__module__}.{type(a).__name__}: "
                "move it to the device first with xp.asarray(...)"
            )
    device = arrays[0].device
    for a in arrays[1:]:
        if a.device is not device:
            raise ValueError(
                f"arrays on different devices ({device!r} and {a.device!r}); "
                "move one with to_device first"
            )
    return device


H = TypeVar("H", bound=Handle)


def index_key(key: Any, index_array: Callable[[Any], H]) -> tuple[tuple[IndexItem, ...], list[H]]:
    """``x[key]``'s key on the wire, and the arrays it indexes with (inputs of the op, in
    order). An array item (a remote array, a bool, a list, a numpy array) is turned into a
    remote array by ``index_array``.
    """
    items = key if isinstance(key, tuple) else (key,)
    arrays: list[H] = []
    index = tuple(_index_item(item, index_array, arrays) for item in items)
    assert key_tensors(index) == tuple(a.tensor_id for a in arrays)
    return index, arrays


def _index_item(item: Any, index_array: Callable[[Any], H], arrays: list[H]) -> IndexItem:
    if item is None:
        return None
    if item is Ellipsis:
        return "..."
    if isinstance(item, slice):
        parts = [
            None if v is None else operator.index(v) for v in (item.start, item.stop, item.step)
        ]
        return SliceSpec(start=parts[0], stop=parts[1], step=parts[2])
    if isinstance(item, bool | np.bool_ | list | np.ndarray | Handle):
        array = index_array(item)
        arrays.append(array)
        return ArrayIndex(tensor=array.tensor_id)
    return operator.index(item)
