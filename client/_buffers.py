"""Receive buffers for large replies, kept and reused once nothing refers to them.

Why: a large download is received (``recv_into``) straight into a new array. Memory the
process has never touched, or gave back to the kernel, costs a page fault per page on first
write, which on a virtual machine that hands free guest memory back to its host (free page
reporting, as on this project's CI and bench machines) costs far more than the copy itself
(bench/REASONS.md, 'Receive buffer pool'). numpy frees an array of this size with ``munmap``
as soon as its last reference goes, so without a pool every download would pay that price.

:class:`BufferPool` keeps the arrays that large replies were received into (:data:`POOL_MIN`
bytes and up, at most :data:`POOL_BYTES` in :data:`POOL_COUNT` buffers) and hands one out
again once the caller has dropped every array over it. "Dropped" is read from the reference
count (:func:`protocol.reuse.unused`, the check the server's spare memory makes too): the pool
holds the only reference to a buffer that nothing else uses (every numpy view,
``np.frombuffer`` result or memoryview over it keeps a reference to it). Buffers left
free for :data:`POOL_IDLE` seconds are let go by :meth:`BufferPool.release_idle`, which the
connection's keeper thread calls, so an idle client does not hold on to memory.

A reused buffer holds old bytes until the reply overwrites them: the decoder refuses a reply
that does not fill its buffers, so the caller never sees them.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from pydantic import TypeAdapter

from protocol.codec import M, MessageDecoder
from protocol.reuse import REFCOUNTED, Pooled, unused

POOL_MIN = 1 << 18  # smaller replies arrive in one frame and are views of it
POOL_BYTES = 1 << 30  # at most this many bytes of buffers are kept...
POOL_COUNT = 32  # ... in at most this many buffers
POOL_IDLE = 10.0  # seconds a free buffer is kept without being reused

U8Array = np.ndarray[Any, np.dtype[np.uint8]]
_Entry = Pooled[U8Array]  # stamped when last seen in use


class BufferPool:
    """Large receive buffers, reused once every array over them is gone. Thread-safe."""

    def __init__(
        self, keep: int = POOL_BYTES, smallest: int = POOL_MIN, count: int = POOL_COUNT
    ) -> None:
        self._keep = keep
        self._smallest = smallest
        self._count = count
        self._entries: list[_Entry] = []  # least recently used first
        self._lock = threading.Lock()

    def take(self, nbytes: int) -> U8Array:
        """A writable ``uint8`` array of ``nbytes`` whose contents are undefined: a free
        pooled buffer that fits (at least ``nbytes``, less than twice that), else a new one,
        kept for later if it is large enough."""
        if nbytes < self._smallest or not REFCOUNTED:  # PyPy: nothing is pooled
            return np.empty(nbytes, dtype=np.uint8)
        with self._lock:
            entry = self._fitting(nbytes)
            if entry is None:
                entry = Pooled(np.empty(nbytes, dtype=np.uint8), time.monotonic())
                self._entries.append(entry)
                self._trim()
            else:
                self._entries.remove(entry)
                self._entries.append(entry)
                entry.stamp = time.monotonic()
            return entry.array[:nbytes]

    def _fitting(self, nbytes: int) -> _Entry | None:
        fits = [e for e in self._entries if nbytes <= e.array.nbytes < 2 * nbytes and unused(e)]
        return min(fits, key=lambda e: e.array.nbytes, default=None)

    def _trim(self) -> None:
        """Forget the least recently used buffers until the pool is within its bound (a
        buffer still in use is freed by numpy when its last array goes)."""
        total = sum(e.array.nbytes for e in self._entries)
        while (total > self._keep or len(self._entries) > self._count) and self._entries:
            total -= self._entries.pop(0).array.nbytes

    def release_idle(self, idle: float = POOL_IDLE) -> None:
        """Forget the buffers seen free at every call for the last ``idle`` seconds (call it
        every second or so: a buffer seen in use counts as used then)."""
        now = time.monotonic()
        with self._lock:
            for entry in self._entries:
                if not unused(entry):
                    entry.stamp = now
            self._entries = [e for e in self._entries if e.stamp >= now - idle]

    def clear(self) -> None:
        """Forget every buffer."""
        with self._lock:
            self._entries = []

    @property
    def nbytes(self) -> int:
        """Bytes of the buffers kept now, in use or free."""
        with self._lock:
            return sum(e.array.nbytes for e in self._entries)


class PooledDecoder(MessageDecoder[M]):
    """A :class:`~protocol.codec.MessageDecoder` whose buffers, when they arrive after the
    header (a fragmented message), are taken from ``pool`` instead of allocated; ``check``
    may refuse a message before then (the decoder's)."""

    def __init__(
        self, adapter: TypeAdapter[M], pool: BufferPool, check: Callable[[M], None] | None = None
    ) -> None:
        super().__init__(adapter, check=check)
        self._pool = pool

    def _start(self, view: memoryview) -> memoryview:
        rest = super()._start(view)
        if self._arrays:  # allocated, not touched yet: swapped before any byte is written
            self._arrays = [self._pool.take(n) for n in self._sizes]
            self._buffers = list(self._arrays)
        return rest
