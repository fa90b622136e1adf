"""glibc's malloc told to keep freed memory for the next op instead of giving it back.

numpy allocates every op's result with malloc. By default glibc serves a block above 128 KiB
(raised as blocks are freed, to 32 MiB at most) with a fresh ``mmap`` and returns freed memory
at the top of a heap to the kernel once 128 KiB or more is free there. Either way the next
result of that size lands in fresh pages, and on the measured VMs writing a fresh page costs
a fault of several microseconds: a training step of a 512-1024-1024-10 MLP took 6300 minor
faults and twice local numpy's time on the server, against none in a local process, which
frees each result before it allocates the next one of the same size (``bench/README.md``,
"Training"). Fixing both thresholds keeps freed result memory in malloc's heaps, up to the
server's ``--spare-memory``, the same bound the budget gives freed upload buffers.

Only glibc has these knobs (``mallopt``); elsewhere nothing changes.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

M_TRIM_THRESHOLD = -1  # glibc's malloc.h: free memory kept at a heap's top before trimming
M_MMAP_THRESHOLD = -3  # ... blocks at least this large get their own mmap
MMAP_THRESHOLD = 32 << 20  # glibc's ceiling for it (HEAP_MAX_SIZE / 2 on 64-bit)


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


def keep_freed_memory(keep: int) -> bool:
    """Keep up to ``keep`` bytes of freed memory in malloc's heaps, and serve blocks up to
    32 MiB from them. True when glibc took both settings; False with another C library, or
    when ``keep`` is 0 (nothing kept: the defaults stay)."""
    libc = _glibc() if keep > 0 else None
    if libc is None:
        return False
    trim = min(keep, 2**31 - 1)  # an int in C
    return bool(libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)
                and libc.mallopt(M_TRIM_THRESHOLD, trim))  # fmt: skip
