"""The server-wide memory budget that every session's store reserves against, and spare memory.

Bytes are *reserved* here before numpy runs (``server/store.py`` reserves against its session's
quota first), so ``used`` is every session's stored bytes plus what running ops may still
allocate. When the budget is full new work is refused (``server_memory_exhausted``); stored
tensors are never dropped to make room.

Spare memory: the buffers of freed uploads are kept for a while and handed to uploads of the
same size. (Freed op results go back to malloc, whose heaps keep them for the next results:
``server/allocator.py``. Kept here, they would be out of malloc's reach, and every op would
write fresh pages.) Reuse is the point: on a VM, writing a large fresh allocation faults in every
page, which costs more than receiving the bytes (``bench/README.md``). An array is handed out
again only when nothing but the budget refers to it (:func:`protocol.reuse.unused`: a read
reply still being sent holds a view), and never without reference counts (PyPy).

Threads: shared by every session, on the event loop and in worker threads, so it locks.
"""

from __future__ import annotations

import collections
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from protocol import ErrorCode
from protocol.reuse import REFCOUNTED, Pooled, unused

from .errors import StoreError

SPARE_MIN = 1 << 20  # smaller freed arrays are not kept: malloc reuses its own heap for them
SPARE_TTL = 10.0  # seconds a spare array is kept unused

Spare = collections.deque[Pooled[np.ndarray[Any, Any]]]  # stamped when freed, oldest first


class MemoryBudget:
    """Tensor bytes in use across all sessions (stored plus reserved), against ``limit``; and
    the *spare* memory of freed tensors, kept for reuse by uploads of the same size.

    Spare memory (``spare`` bytes at most, each array for ``spare_ttl`` seconds at most, by
    ``clock``) is counted against ``limit`` too: ``used + spare_bytes <= limit`` always holds,
    because a reservation that does not fit drops spare arrays first (oldest first) and is
    refused only if it still does not fit.

    Thread-safe. ``sessions`` counts open sessions (for stats).
    """

    def __init__(
        self,
        limit: int,
        spare: int = 0,
        spare_ttl: float = SPARE_TTL,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limit = limit
        self.used = 0
        self.sessions = 0
        self.spare_limit = min(spare, limit) if REFCOUNTED else 0
        self.spare_ttl = spare_ttl
        self.spare_bytes = 0
        self._spare: Spare = collections.deque()
        # the uploads' buffers by id, the only arrays kept as spare (weakly: a tensor holds one)
        self._uploads: weakref.WeakValueDictionary[int, np.ndarray[Any, Any]] = (
            weakref.WeakValueDictionary()
        )
        self._clock = clock
        self._lock = threading.Lock()
        self.reservations = 0  # bumped without the lock: read only to see whether it moved

    def reserve(self, nbytes: int) -> None:
        """Raises :class:`StoreError` (``server_memory_exhausted``) when ``nbytes`` do not fit."""
        self.reservations += 1  # every op reserves: how the server tells that it is idle
        with self._lock:
            if self.used + nbytes > self.limit:
                raise StoreError(
                    ErrorCode.SERVER_MEMORY_EXHAUSTED,
                    f"the server's memory budget is full ({self.used} of {self.limit} bytes in "
                    f"use, {nbytes} more needed); retry after tensors are freed, or raise "
                    "--memory-budget",
                )
            self.used += nbytes
            self._drop_spare(self.used + self.spare_bytes - self.limit, None)

    def release(self, nbytes: int) -> None:
        with self._lock:
            self.used -= nbytes

    def free_bytes(self) -> int:
        return self.limit - self.used

    def release_root(self, root: np.ndarray[Any, Any]) -> None:
        """Give back the bytes of ``root``, a freed tensor's memory, and keep the array as
        spare if it can be reused: at least :data:`SPARE_MIN` bytes, owned, contiguous and
        writable. Newer arrays push the oldest out when the spare limit is reached."""
        nbytes = root.nbytes
        keep = (
            SPARE_MIN <= nbytes <= self.spare_limit
            and self._uploads.get(id(root)) is root
            and root.base is None
            and bool(root.flags.writeable)
            and bool(root.flags.c_contiguous or root.flags.f_contiguous)
        )
        with self._lock:
            self.used -= nbytes
            if keep:
                self._drop_spare(self.spare_bytes + nbytes - self.spare_limit, None)
                self._spare.append(Pooled(root, self._clock()))
                self.spare_bytes += nbytes

    def allocate(self, nbytes: int) -> np.ndarray[Any, np.dtype[np.uint8]]:
        """``nbytes`` of flat memory for an upload: a spare array of that size, else a fresh
        one (spare arrays are dropped first, as far as needed to fit it under the limit). The
        bytes are not counted here: the upload's op reserves them. The contents are stale: the
        caller must write every byte before anyone reads them (the decoder does)."""
        if nbytes < SPARE_MIN or not self.spare_limit:
            return np.empty(nbytes, dtype=np.uint8)
        with self._lock:
            spare = self._take_spare(nbytes)
            if spare is None:
                self._drop_spare(self.used + self.spare_bytes + nbytes - self.limit, None)
        if spare is None:
            spare = np.empty(nbytes, dtype=np.uint8)
            with self._lock:
                self._uploads[id(spare)] = spare
        return spare

    def _take_spare(self, nbytes: int) -> np.ndarray[Any, np.dtype[np.uint8]] | None:
        """A spare array of exactly ``nbytes`` that nothing else references (no reply still
        sends from it), as flat bytes, or None (the caller holds the lock)."""
        spare = self._spare
        for i in range(len(spare) - 1, -1, -1):  # the newest first
            entry = spare[i]
            if entry.array.nbytes != nbytes or not unused(entry):
                continue  # another size, or a view of it is alive (a reply being sent)
            root = entry.array
            del spare[i]
            self.spare_bytes -= nbytes
            return root.ravel(order="K").view(np.uint8)
        return None

    def trim_spare(self) -> None:
        """Drop spare arrays older than ``spare_ttl``."""
        with self._lock:
            self._drop_spare(0, self._clock() - self.spare_ttl)

    def _drop_spare(self, nbytes: int, older_than: float | None) -> None:
        """Drop the oldest spare arrays until ``nbytes`` are dropped and none is older than
        ``older_than`` (the caller holds the lock)."""
        spare = self._spare
        while spare and (nbytes > 0 or (older_than is not None and spare[0].stamp < older_than)):
            dropped = spare.popleft().array.nbytes
            nbytes -= dropped
            self.spare_bytes -= dropped
