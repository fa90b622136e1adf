"""The server-wide memory budget that every session's store reserves against, and spare memory.

Bytes are *reserved* here before numpy runs (``server/store.py`` reserves against its session's
quota first), so ``used`` is every session's stored bytes plus what running ops may still
allocate. When the budget is full new work is refused (``server_memory_exhausted``); stored
tensors are never dropped to make room.

Spare memory: the buffers of freed uploads are kept for a while and handed to uploads of the
same size. (Freed op results go back to malloc, whose heaps keep them for the next results:
``server/allocator.py``. Kept here, they would be out of malloc's reach, and every op would
write fresh pages.) Reuse is the point: on a VM, writing a large fresh allocation faults in every
page, which costs more than receiving the bytes (bench/REASONS.md, 'Receive buffer pool').
An array is handed out again only when nothing but the budget refers to it
(:func:`protocol.reuse.unused`: a read reply still being sent holds a view), and never without
reference counts (PyPy).

Overhead: what the process spends to keep each tensor and failure record beyond its array's
bytes (its id, record, array header) is counted too, in ``overhead`` (each session's
:class:`Bookkeeping` charges it, a granule at a time), against the same limit but apart from
``used``, which stays the tensor bytes that clients see (``server_tensor_bytes``), so that
the number of tensors is bounded too: many empty tensors take memory that no tensor byte
counts (bench/REASONS.md, 'Bookkeeping charged per tensor').

Upload holds: the buffer of an upload is counted from the moment the decoder allocates it
(:meth:`MemoryBudget.hold`) until the op that stores it takes its bytes over
(:meth:`MemoryBudget.take`) or the buffer is dropped (a finalizer gives them back), so that
uploads queued behind each other cannot all be allocated against the same free bytes
(bench/REASONS.md, 'Upload holds'). The memory a store moved a root away from, which a read
reply still sends, is held the same way until it dies (:meth:`MemoryBudget.hold_while`).

Threads: shared by every session, on the event loop and in worker threads, so it locks. The
lock is reentrant: a hold's finalizer runs wherever its buffer dies, which may be inside a
locked section of the same thread (a garbage collection there).
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
SMALL_RESERVE_PART = 8  # the budget's last eighth is kept for sessions that hold little ...
SMALL_SESSION_PART = 64  # ... a sixty-fourth of it at most (see MemoryBudget.ceiling)

Spare = collections.deque[Pooled[np.ndarray[Any, Any]]]  # stamped when freed, oldest first
GRANULE = 1 << 15  # bookkeeping bytes a session charges the budget at a time (Bookkeeping)


class Holds:
    """Arrays of one session whose bytes the budget holds while they live (its upload buffers,
    :meth:`MemoryBudget.hold`; the memory of its moved roots, :meth:`MemoryBudget.hold_while`):
    their sum, counted in the session's quota, and each one's size and finalizer, by ``id``
    of the array. Changed only under the budget's lock."""

    __slots__ = ("nbytes", "by_buffer")

    def __init__(self) -> None:
        self.nbytes = 0
        self.by_buffer: dict[int, tuple[int, weakref.finalize[Any, Any]]] = {}


class Bookkeeping:
    """One session's bookkeeping bytes (what its tensors' and failure records' entries cost,
    ``server/store.py``): counted exactly in ``nbytes``, bounded by ``limit``, and charged to
    ``budget`` (:meth:`MemoryBudget.charge`) a granule at a time, so its lock is taken once in
    some 50 entries and not twice per op; up to two granules more than ``nbytes`` are charged.
    Changed by one thread at a time, as its store."""

    __slots__ = ("budget", "limit", "nbytes", "_charged", "_granule")

    def __init__(self, budget: MemoryBudget, limit: int) -> None:
        self.budget, self.limit = budget, limit
        self.nbytes = self._charged = 0
        self._granule = max(1, min(GRANULE, budget.limit >> 8))

    def add(self, nbytes: int, headroom: int | None = None, in_use: int | None = None) -> bool:
        """Count ``nbytes`` more; False, and nothing counted, if the budget refuses them
        (``headroom``, ``in_use``: as :meth:`MemoryBudget.charge` takes them; ``headroom``
        None: always counted)."""
        need = self.nbytes + nbytes - self._charged
        if need > 0:
            more = -(-need // self._granule) * self._granule
            if not self.budget.charge(more, headroom, in_use):
                return False
            self._charged += more
        self.nbytes += nbytes
        return True

    def remove(self, nbytes: int) -> None:
        """Count ``nbytes`` fewer (given back to the budget a granule at a time)."""
        self.nbytes -= nbytes
        granule = self._granule
        if not self.nbytes:  # none left: all of it back
            self.budget.discharge(self._charged)
            self._charged = 0
        elif self._charged - self.nbytes > 2 * granule:  # keep one granule charged
            spare = (self._charged - self.nbytes) // granule * granule - granule
            self.budget.discharge(spare)
            self._charged -= spare

    def close(self) -> None:
        """Give everything back."""
        self.budget.discharge(self._charged)
        self.nbytes = self._charged = 0


class MemoryBudget:
    """Tensor bytes in use across all sessions (stored plus reserved), against ``limit``; and
    the *spare* memory of freed tensors, kept for reuse by uploads of the same size.

    Spare memory (``spare`` bytes at most, each array for ``spare_ttl`` seconds at most, by
    ``clock``) is counted against ``limit`` too: ``used + spare_bytes <= limit`` always holds,
    because a reservation that does not fit drops spare arrays first (oldest first) and is
    refused only if it still does not fit.

    ``overhead`` (bytes of the tensors' and failure records' bookkeeping, :meth:`charge`)
    counts against ``limit`` as well: ``used + overhead + spare_bytes <= limit`` holds, but
    for what :meth:`charge` forces past it.

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
        self.overhead = 0  # bookkeeping bytes of stored entries (charge, discharge)
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
        self._lock = threading.RLock()  # reentrant: see the module docstring
        self.reservations = 0  # bumped without the lock: read only to see whether it moved
        self.small_reserve = limit // SMALL_RESERVE_PART
        self.small_session = limit // SMALL_SESSION_PART

    def ceiling(self, nbytes: int, in_use: int | None) -> int:
        """How full ``nbytes`` more may make the budget, for a session that holds ``in_use``
        bytes (None: a reservation of no session's): all of it while the session would hold at
        most :attr:`small_session`, else all but :attr:`small_reserve`. So sessions that hold
        many bytes, however many of them and each within its quota, cannot take the memory
        that a session holding little needs to go on (bench/REASONS.md, 'Memory kept for small
        sessions')."""
        if in_use is None or in_use + nbytes <= self.small_session:
            return self.limit
        return self.limit - self.small_reserve

    def reserve(self, nbytes: int, in_use: int | None = None) -> None:
        """Raises :class:`StoreError` (``server_memory_exhausted``) when ``nbytes`` do not fit
        (under :meth:`ceiling` for a session holding ``in_use``)."""
        self.reservations += 1  # every op reserves: how the server tells that it is idle
        with self._lock:
            ceiling = self.ceiling(nbytes, in_use)
            if self.used + self.overhead + nbytes > ceiling:
                fits = self.used + nbytes <= ceiling  # but for the records: say so
                records = f" and {self.overhead} by tensors' records" if fits else ""
                kept = (
                    f", {self.small_reserve} of them kept for sessions that hold under "
                    f"{self.small_session}"
                    if ceiling < self.limit
                    else ""
                )
                raise StoreError(
                    ErrorCode.SERVER_MEMORY_EXHAUSTED,
                    f"the server's memory budget is full ({self.used} of {self.limit} bytes in "
                    f"use{records}{kept}, {nbytes} more needed); retry after tensors are "
                    "freed, or raise --memory-budget",
                )
            self.used += nbytes
            self._drop_spare(self.used + self.overhead + self.spare_bytes - self.limit, None)

    def release(self, nbytes: int) -> None:
        with self._lock:
            self.used -= nbytes

    def free_bytes(self, in_use: int | None = None, nbytes: int = 0) -> int:
        """What a session holding ``in_use`` may still reserve, ``nbytes`` of it at once (see
        :meth:`ceiling`)."""
        return self.ceiling(nbytes, in_use) - self.used - self.overhead

    def charge(self, nbytes: int, headroom: int | None = None, in_use: int | None = None) -> bool:
        """Count ``nbytes`` of bookkeeping (``overhead``). With ``headroom``, only if they fit
        under :meth:`ceiling` (for a session holding ``in_use``) plus ``headroom``: False, and
        nothing counted, if not; without, always (a record that must be kept)."""
        with self._lock:
            total = self.used + self.overhead + nbytes
            if headroom is not None and total > self.ceiling(nbytes, in_use) + headroom:
                return False
            self.overhead += nbytes
            self._drop_spare(total + self.spare_bytes - self.limit, None)
            return True

    def discharge(self, nbytes: int) -> None:
        """Give back bookkeeping bytes that :meth:`charge` counted."""
        with self._lock:
            self.overhead -= nbytes

    def hold(
        self, nbytes: int, holds: Holds, in_use: int | None = None
    ) -> np.ndarray[Any, np.dtype[np.uint8]]:
        """Reserve ``nbytes`` and allocate an upload's buffer of that size (:meth:`allocate`),
        held for ``holds`` until :meth:`take` or until the buffer is dropped, which gives them
        back.

        Raises:
            StoreError: ``server_memory_exhausted``, the budget or the process has no room.
        """
        self.reserve(nbytes, in_use)
        try:
            buffer = self.allocate(nbytes, reserved=True)
        except MemoryError:
            self.release(nbytes)
            raise StoreError(
                ErrorCode.SERVER_MEMORY_EXHAUSTED, f"no memory for an upload of {nbytes} bytes"
            ) from None
        self.hold_while(buffer, nbytes, holds)
        return buffer

    def hold_while(self, owner: object, nbytes: int, holds: Holds) -> None:
        """Count ``nbytes``, already reserved, in ``holds`` until ``owner`` dies (then they are
        given back) or :meth:`release_holds`: memory that lives as long as an object (an
        array, a decoded message) does."""
        with self._lock:
            holds.nbytes += nbytes
            key = id(owner)
            finalizer = weakref.finalize(owner, self._unhold, holds, key, nbytes)
            finalizer.atexit = False  # nothing to give back when the process ends
            holds.by_buffer[key] = (nbytes, finalizer)

    def take(self, buffer: object, nbytes: int, holds: Holds) -> bool:
        """Whether the ``nbytes`` held for ``buffer`` (an array :meth:`hold` made) were taken
        off ``holds``: they stay in ``used``, now the caller's reservation. False (nothing
        changes) for another object, another size, or bytes already given back."""
        with self._lock:
            held = holds.by_buffer.get(id(buffer))
            if held is None or held[0] != nbytes or held[1].detach() is None:
                return False  # detach() is None: the finalizer runs (or ran) already
            del holds.by_buffer[id(buffer)]
            holds.nbytes -= nbytes
            return True

    def release_holds(self, holds: Holds) -> None:
        """Give back every byte ``holds`` still holds (its session closed): a buffer's death
        may come much later, when the garbage collector breaks the cycle that a connection's
        objects make, and the budget must not wait for it."""
        with self._lock:
            for nbytes, finalizer in holds.by_buffer.values():
                if finalizer.detach() is not None:
                    holds.nbytes -= nbytes
                    self.used -= nbytes
            holds.by_buffer.clear()

    def _unhold(self, holds: Holds, key: int, nbytes: int) -> None:
        """A held buffer died before an op took its bytes: give them back."""
        with self._lock:
            holds.by_buffer.pop(key, None)
            holds.nbytes -= nbytes
            self.used -= nbytes

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

    def allocate(self, nbytes: int, reserved: bool = False) -> np.ndarray[Any, np.dtype[np.uint8]]:
        """``nbytes`` of flat memory for an upload: a spare array of that size, else a fresh
        one (spare arrays are dropped first, as far as needed to fit it under the limit). The
        bytes are not counted here (``reserved``: the caller reserved them already, as
        :meth:`hold` does). The contents are stale: the caller must write every byte before
        anyone reads them (the decoder does)."""
        if nbytes < SPARE_MIN or not self.spare_limit:
            return np.empty(nbytes, dtype=np.uint8)
        with self._lock:
            spare = self._take_spare(nbytes)
            if spare is None:
                more = 0 if reserved else nbytes
                self._drop_spare(
                    self.used + self.overhead + self.spare_bytes + more - self.limit, None
                )
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
