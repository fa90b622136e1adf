"""A session's tensors: id -> numpy array or the failure that produced it.

Rule: imports numpy and ``protocol`` only. Owned by one session, touched by one task at a time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from protocol import ErrorCode, ErrorInfo, TensorMeta


@dataclass(frozen=True, slots=True)
class Failure:
    """What a failed op leaves in place of its output; dependants inherit it unchanged."""

    error: ErrorInfo


@dataclass(frozen=True, slots=True)
class Stored:
    """A tensor's array. ``owned``: no other tensor, view or pending reply shares the array, so
    an in-place op may write into it (copy-on-write: otherwise it copies first)."""

    array: np.ndarray[Any, Any]
    meta: TensorMeta
    owned: bool = False


class StoreError(Exception):
    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code


class TensorStore:
    """Tensors by client-allocated id, with byte accounting."""

    def __init__(self) -> None:
        self._items: dict[int, Stored | Failure] = {}
        self.nbytes = 0
        self.failed = 0

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, tensor_id: int) -> bool:
        return tensor_id in self._items

    def get(self, tensor_id: int) -> Stored | Failure:
        """Raises :class:`StoreError` (``unknown_tensor``) for an id the session lacks."""
        try:
            return self._items[tensor_id]
        except KeyError:
            raise StoreError(
                ErrorCode.UNKNOWN_TENSOR, f"tensor #{tensor_id} does not exist in this session"
            ) from None

    def put(self, tensor_id: int, value: Stored | Failure) -> None:
        """Raises :class:`StoreError` (``duplicate_tensor``) if the id is taken."""
        if tensor_id in self._items:
            raise StoreError(ErrorCode.DUPLICATE_TENSOR, f"tensor id #{tensor_id} is in use")
        self._items[tensor_id] = value
        if isinstance(value, Failure):
            self.failed += 1
        else:
            self.nbytes += value.array.nbytes

    def share(self, tensor_id: int) -> None:
        """Record that the array of ``tensor_id`` is now shared (an op read it, maybe into a
        view, or a reply holds its bytes): the next in-place op must copy it."""
        value = self._items.get(tensor_id)
        if isinstance(value, Stored) and value.owned:
            self._items[tensor_id] = Stored(value.array, value.meta)

    def replace(self, tensor_id: int, value: Stored | Failure) -> None:
        """Store ``value`` under an id that exists (an in-place update keeps the id).

        Raises :class:`StoreError` (``unknown_tensor``) if the id does not exist.
        """
        self.get(tensor_id)
        self.free(tensor_id)
        self.put(tensor_id, value)

    def free(self, tensor_id: int) -> None:
        """Forget an id. Freeing an unknown id does nothing (frees are idempotent)."""
        value = self._items.pop(tensor_id, None)
        if isinstance(value, Failure):
            self.failed -= 1
        elif value is not None:
            self.nbytes -= value.array.nbytes

    def clear(self) -> None:
        self._items.clear()
        self.nbytes = 0
        self.failed = 0
