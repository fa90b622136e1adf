"""glibc's malloc told to keep freed memory for the next op instead of giving it back.

numpy allocates every op's result with malloc. By default glibc serves a block above 128 KiB
(raised as blocks are freed, to 32 MiB at most) with a fresh ``mmap`` and returns freed memory
at the top of a heap to the kernel once 128 KiB or more is free there. Either way the next
result of that size lands in fresh pages, and on a VM writing a fresh page costs a fault to
the host: a training step on the server then faults on page after page, where a local process,
which frees each result before it allocates the next one of the same size, does not. With
blocks up to 32 MiB served from malloc's heaps and 32 MiB kept free at the top of each heap
before it is trimmed, the step faults almost never (bench/REASONS.md, 'malloc keeps freed
memory').

What this keeps is not counted in ``--memory-budget``: up to 32 MiB at the top of each of
malloc's heaps, plus freed blocks below live ones, which no trim at the top reaches. glibc
gives each thread that allocates a heap of its own, up to eight per core, so the server's
worker and pull threads could keep 32 MiB each; it is held to :data:`HEAPS` heaps, which the
threads share. :func:`give_back_freed_memory` (``malloc_trim``) returns all of it;
the server calls it once no op has run for ``spare_ttl``, and while busy whenever the
process's resident memory (:func:`resident_bytes`) passes what the budget counts by half the
budget (``server/app.py``), so that what malloc keeps stays bounded under any load.

Only glibc has these knobs (``mallopt``, ``malloc_trim``); elsewhere nothing changes.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

M_TRIM_THRESHOLD = -1  # glibc's malloc.h: free memory kept at a heap's top before trimming
M_MMAP_THRESHOLD = -3  # ... blocks at least this large get their own mmap
MMAP_THRESHOLD = 32 << 20  # glibc's ceiling for it (HEAP_MAX_SIZE / 2 on 64-bit)
TRIM_THRESHOLD = 32 << 20  # a block's worth; larger keeps no more faults away (see above)
M_ARENA_MAX = -8  # ... heaps ("arenas") at most, which threads share once there are that many
HEAPS = 2  # the main thread's heap and one that the threads share (bench/REASONS.md)
PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _glibc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.gnu_get_libc_version  # noqa: B018 - glibc only: musl's mallopt does nothing
        libc.mallopt.argtypes, libc.mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    except (OSError, AttributeError):
        return None
    return libc


def is_glibc() -> bool:
    """Whether this process runs on glibc, whose malloc ``keep_freed_memory`` tunes."""
    return _glibc() is not None


def keep_freed_memory() -> bool:
    """Serve blocks up to 32 MiB from malloc's heaps, keep 32 MiB free at the top of each, and
    make at most :data:`HEAPS` heaps. True when glibc took every setting; False with another
    C library."""
    libc = _glibc()
    if libc is None:
        return False
    return bool(
        libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)
        and libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)
        and libc.mallopt(M_ARENA_MAX, HEAPS)
    )


def resident_bytes() -> int:
    """The process's resident memory (``/proc/self/statm``), or 0 where there is none."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[1]) * PAGE
    except (OSError, IndexError, ValueError):
        return 0


def give_back_freed_memory() -> bool:
    """Return every free page of malloc's heaps to the kernel (``malloc_trim(0)``). True when
    glibc gave some back."""
    libc = _glibc()
    return libc is not None and bool(libc.malloc_trim(0))
