"""Iterating a remote array: one read, not one round trip per element.

``for v in x`` over a 1-d array reads ``x`` once and yields :class:`KnownScalar` elements:
0-d remote arrays, as array_api_strict yields (SciPy passes them on to ``xp`` functions, so they
must stay arrays of the device), that also hold the value they were made from. What needs only
that value (``bool``, ``float``, ``int``, ``format``, ``np.asarray``, and a comparison with
another known element of its dtype or a Python scalar, as ``max(x)`` makes) is answered here
without the server; any other op runs on the device as for any 0-d array. An element's tensor
is a ``full`` op with its value (a copy, as numpy's and strict's elements are), queued when an
op first names the element: comparing and converting elements makes nothing on the device.
An n-d array yields its rows ``x[i]``, ops that need no read at all; so does a 1-d array on a
device a capture records (``client.capture``), whose graph must take its elements from ``x``
at every replay, not the values of the recording.
"""

from __future__ import annotations

import operator
import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from protocol import TensorMeta, from_numpy
from protocol.ops import Full
from protocol.scalars import scalar_from_python

from .array import EXACT_SCALARS, RemoteArray, register_iteration
from .device import Device

_MAKING = threading.Lock()

# The comparisons a known element answers itself, by operator name.
_COMPARISONS: dict[str, Callable[[Any, Any], Any]] = {
    "__lt__": operator.lt,
    "__le__": operator.le,
    "__gt__": operator.gt,
    "__ge__": operator.ge,
    "__eq__": operator.eq,
    "__ne__": operator.ne,
}


def iterate(x: RemoteArray) -> Iterator[RemoteArray]:
    """The iterator of ``iter(x)``. Raises at once (not at the first ``next``), so that
    ``np.iterable`` and ``iter()`` see that a 0-d array is not iterable.

    Raises:
        TypeError: ``x`` is 0-d.
    """
    if not x.shape:
        raise TypeError("iteration over a 0-d array")
    if x.ndim > 1 or getattr(x.device, "_capturing", None) is not None:
        # rows, and the elements of an array a capture records: ops on x, not values
        return (x[i] for i in range(x.shape[0]))
    return _elements(x)


def _elements(x: RemoteArray) -> Iterator[RemoteArray]:
    """``x``'s elements, read at the first ``next``: ``iter(x)`` alone reads nothing (numpy's
    ``np.iterable``, which SciPy asks of every argument, calls it)."""
    values = x.numpy()  # the one read
    for value in values:
        yield known_scalar(value, x.device)


def known_scalar(value: np.generic, device: Device) -> KnownScalar:
    """A 0-d array on ``device`` holding ``value``, which it knows locally. Its tensor is made
    on the device (a ``full`` op) when an op first names it (:attr:`KnownScalar.tensor_id`):
    ``max(x)`` compares thousands of elements and makes nothing on the device."""
    return KnownScalar(device, device.new_id(), TensorMeta((), from_numpy(value.dtype)), value)


class KnownScalar(RemoteArray):
    """A 0-d remote array whose value the client holds, until an in-place op writes it or it
    is indexed (a view, which may be written). Note: a view made by a namespace function
    (``xp.reshape(v, (1,))``) and written in place is not seen: an element is a scalar to
    compare and convert, as numpy's are."""

    __slots__ = ("_known", "_made")

    def __init__(self, device: Device, tensor_id: int, meta: TensorMeta, value: np.generic):
        super().__init__(device, tensor_id, meta)
        self._known: np.generic | None = value
        self._made = False  # whether its tensor is on the device (or queued for it)

    def __del__(self) -> None:
        if self._made:  # an element no op named has nothing on the device to free
            super().__del__()

    @property
    def tensor_id(self) -> int:
        """Its id on the device: the first call queues the ``full`` op that makes it there
        (outside a capture's recording, as if it had been made when the element was: an
        element is an array made before the capture)."""
        if not self._made:
            self._make()
        return self._id

    def _make(self) -> None:
        with _MAKING:  # two threads naming it at once make it once
            if not self._made:
                self._make_now()

    def _make_now(self) -> None:
        assert self._known is not None, "written elements are made first"
        device, meta, value = self._device, self._meta, self._known
        op = Full(out=self._id, shape=(), dtype=meta.dtype, value=scalar_from_python(value.item()))
        op.infer_all()
        capture = getattr(device, "_capturing", None)
        if capture is None:
            device.submit(op)
        else:
            capture.submit_unrecorded(op)
        self._made = True
        metas = device.segment_metas  # what client.device.new_handle notes for segment replay
        if metas is not None:
            metas[self._id] = meta
        kept = np.array(value)
        kept.flags.writeable = False
        device.known.learn(self, values=kept)  # so that ops on it derive (client._deriving)

    def numpy(self) -> np.ndarray[Any, Any]:
        if self._known is None:
            return super().numpy()
        return np.array(self._known)

    def _scalar(self) -> Any:
        return super()._scalar() if self._known is None else self._known.item()

    def _local_operand(self, other: Any) -> Any:
        """``other``'s value when a comparison with it can be answered here, else None:
        a known element of this dtype, or a Python scalar (weak, as on the device); complex
        values are left to the device, which refuses to order them."""
        if self._known is None or self._known.dtype.kind == "c" or isinstance(other, complex):
            return None
        if type(other) in EXACT_SCALARS:
            return other
        if isinstance(other, KnownScalar) and other._known is not None:
            return other._known if other._known.dtype == self._known.dtype else None
        return None


# The methods that may write the tensor: the in-place ones, and indexing, whose result may be a
# view that is written later. Each forgets the known value first (it is read again if needed).
_WRITING = (
    "__getitem__",
    "__setitem__",
    "__iadd__",
    "__isub__",
    "__imul__",
    "__itruediv__",
    "__ifloordiv__",
    "__imod__",
    "__ipow__",
    "__imatmul__",
    "__iand__",
    "__ior__",
    "__ixor__",
    "__ilshift__",
    "__irshift__",
)


def _comparison(name: str, compare: Callable[[Any, Any], Any]) -> Callable[..., Any]:
    remote = getattr(RemoteArray, name)

    def comparison(self: KnownScalar, other: Any) -> Any:
        local = self._local_operand(other)
        if local is None:
            return remote(self, other)
        return known_scalar(np.bool_(compare(self._known, local)), self.device)

    comparison.__doc__ = remote.__doc__
    return comparison


def _writing(name: str) -> Callable[..., Any]:
    method = getattr(RemoteArray, name)

    def writing(self: KnownScalar, *args: Any) -> Any:
        if not self._made:  # made on the device with its value before it is written
            self._make()
        self._known = None
        return method(self, *args)

    writing.__doc__ = method.__doc__
    return writing


for _name, _compare in _COMPARISONS.items():
    setattr(KnownScalar, _name, _comparison(_name, _compare))
for _name in _WRITING:
    setattr(KnownScalar, _name, _writing(_name))

register_iteration(iterate)
