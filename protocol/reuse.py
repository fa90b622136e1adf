"""Memory a pool may hand out again: an array that nothing but its pool entry refers to.

Both sides keep large arrays for reuse, because writing memory the process has never touched
costs a page fault per page (bench/REASONS.md, 'Receive buffer pool'): the server keeps freed
tensors for uploads (``server/budget.py``), the client keeps receive buffers for downloads
(``client/_buffers.py``).
Either may hand an array out again only once nobody can see it any more: no numpy view, no
``np.frombuffer`` result, no memoryview (a reply still being sent) over it. Each of those keeps
a reference to the array, so the reference count tells: a :class:`Pooled` entry whose array
has no reference but the entry's own is :func:`unused`.

Pure Python and numpy, no I/O: it is here because ``protocol`` is the one package that the
client and the server both import.
"""

from __future__ import annotations

import sys
from typing import Any, Generic, TypeVar

import numpy as np

A = TypeVar("A", bound="np.ndarray[Any, Any]")

# Without reference counts (PyPy) nothing can be proven unused: pools then keep nothing.
REFCOUNTED = hasattr(sys, "getrefcount")


class Pooled(Generic[A]):
    """A pool's own reference to ``array``, with ``stamp``: a ``time.monotonic()`` the pool
    decides the meaning of (when the array was freed, or last seen in use)."""

    __slots__ = ("array", "stamp")

    def __init__(self, array: A, stamp: float) -> None:
        self.array = array
        self.stamp = stamp


def _references(entry: Pooled[Any]) -> int:
    return sys.getrefcount(entry.array)


# What _references counts for an array that only its entry holds, measured the same way (the
# interpreter decides whether the call's own argument counts: CPython 3.14 may not count it),
# so the check below stays right whichever it does.
_ALONE = _references(Pooled(np.empty(1, dtype=np.uint8), 0.0)) if REFCOUNTED else 0


def unused(entry: Pooled[Any]) -> bool:
    """Whether nothing but ``entry`` refers to its array (CPython reference counts); always
    False without reference counts. The answer holds only while the caller's pool lock is held
    and no other thread can take the array from the pool."""
    return REFCOUNTED and _references(entry) <= _ALONE
