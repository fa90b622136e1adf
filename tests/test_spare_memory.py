"""Spare memory: the server keeps freed uploads' memory for uploads of the same size, never while
anything still uses it, never past its bound or age, and never at the cost of refusing work;
freed op results go back to malloc, which the server tells to keep them for the next results
(``server/allocator.py``), so a loop of ops stops faulting in fresh pages."""

from __future__ import annotations

import gc
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import client
from protocol import TensorMeta
from server.allocator import HEAPS, TRIM_THRESHOLD, is_glibc
from server.budget import SPARE_MIN, MemoryBudget
from server.errors import StoreError
from server.store import Stored, TensorStore

from .ops_helpers import metrics, value
from .servers import run_server

MIB = 1 << 20


def _address(array: np.ndarray[Any, Any]) -> int:
    return int(array.__array_interface__["data"][0])


def _stored(budget: MemoryBudget, nbytes: int, upload: bool = True) -> tuple[TensorStore, int]:
    """A store holding a float32 tensor of ``nbytes`` as id 1, and its memory's address.
    ``upload``: in a buffer the budget allocated for an upload, as the decoder does; else
    allocated by numpy, as an op's result is."""
    store = TensorStore(budget=budget)
    budget.reserve(nbytes)
    if upload:
        array = budget.allocate(nbytes).view(np.float32)
        array[...] = 1.0
    else:
        array = np.ones(nbytes // 4, dtype=np.float32)
    store.put(1, Stored(array, TensorMeta(shape=array.shape, dtype="float32")), nbytes)
    return store, _address(array)


def _freed(budget: MemoryBudget, nbytes: int, upload: bool = True) -> int:
    """Store a float32 tensor of ``nbytes`` on ``budget`` and free it; its memory's address."""
    store, address = _stored(budget, nbytes, upload)
    store.free(1)
    return address


# --- the budget alone -----------------------------------------------------------------------


def test_a_freed_tensor_is_reused_by_an_upload_of_its_size_only() -> None:
    budget = MemoryBudget(64 * MIB, spare=16 * MIB)
    address = _freed(budget, 4 * MIB)
    assert budget.used == 0 and budget.spare_bytes == 4 * MIB
    other = budget.allocate(2 * MIB)  # another size: fresh memory
    assert _address(other) != address and budget.spare_bytes == 4 * MIB
    same = budget.allocate(4 * MIB)
    assert _address(same) == address
    assert same.dtype == np.uint8 and same.shape == (4 * MIB,) and same.flags.writeable
    assert budget.spare_bytes == 0
    assert _address(budget.allocate(4 * MIB)) != address  # handed out once


def test_an_op_result_goes_back_to_malloc_not_to_spare() -> None:
    budget = MemoryBudget(64 * MIB, spare=16 * MIB)
    _freed(budget, 4 * MIB, upload=False)
    assert budget.used == 0 and budget.spare_bytes == 0


def test_memory_still_referenced_is_never_handed_out() -> None:
    budget = MemoryBudget(64 * MIB, spare=16 * MIB)
    root = budget.allocate(4 * MIB).view(np.float32)
    reply = root[MIB // 2 :].data  # a read reply still being sent holds a view of the bytes
    budget.reserve(root.nbytes)
    budget.release_root(root.base)  # type: ignore[arg-type]  # the buffer the view is of
    del root
    gc.collect()
    assert budget.spare_bytes == 4 * MIB
    fresh = budget.allocate(4 * MIB)
    assert not np.shares_memory(fresh, np.asarray(reply))
    del reply
    gc.collect()
    assert budget.allocate(4 * MIB) is not None and budget.spare_bytes == 0


def test_small_and_unsuitable_arrays_are_not_kept() -> None:
    budget = MemoryBudget(64 * MIB, spare=16 * MIB)
    readonly = budget.allocate(MIB)
    readonly.flags.writeable = False
    for array in (
        budget.allocate(SPARE_MIN - 4),  # under the minimum
        budget.allocate(32 * MIB),  # over the spare limit
        readonly,
    ):
        budget.reserve(array.nbytes)
        budget.release_root(array)
    assert budget.spare_bytes == 0 and budget.used == 0
    off = MemoryBudget(64 * MIB, spare=0)
    _freed(off, 4 * MIB)
    assert off.spare_bytes == 0 and off.used == 0


def test_spare_memory_stays_within_its_bound_newest_kept() -> None:
    budget = MemoryBudget(64 * MIB, spare=10 * MIB)
    held = [_stored(budget, 4 * MIB) for _ in range(3)]  # three uploads alive at once
    for store, _ in held:
        store.free(1)  # the third would make 12 MiB, over 10: the oldest goes
    first, second, third = (address for _, address in held)
    assert budget.spare_bytes == 8 * MIB
    got = {_address(budget.allocate(4 * MIB)) for _ in range(2)}
    assert got == {second, third} and first not in got


def test_spare_memory_never_makes_work_refused() -> None:
    budget = MemoryBudget(16 * MIB, spare=16 * MIB)
    _freed(budget, 12 * MIB)
    assert budget.spare_bytes == 12 * MIB and budget.free_bytes() == 16 * MIB
    budget.reserve(10 * MIB)  # fits only once the spare 12 MiB are dropped
    assert budget.used + budget.spare_bytes <= budget.limit
    assert budget.spare_bytes == 0
    with pytest.raises(StoreError):
        budget.reserve(7 * MIB)  # refused on what is used, as before
    budget.release(10 * MIB)
    _freed(budget, 12 * MIB)
    budget.allocate(8 * MIB)  # a fresh upload buffer makes room as well
    assert budget.spare_bytes == 0


def test_spare_memory_is_let_go_when_unused() -> None:
    now = [1000.0]  # the budget's clock: advanced by hand, so no pause can break the test
    budget = MemoryBudget(64 * MIB, spare=16 * MIB, spare_ttl=10.0, clock=lambda: now[0])
    _freed(budget, 4 * MIB)
    budget.trim_spare()
    assert budget.spare_bytes == 4 * MIB  # not old yet
    now[0] += 9.0
    budget.trim_spare()
    assert budget.spare_bytes == 4 * MIB  # still within its ttl
    _freed(budget, 4 * MIB)  # a second one, freed 9 s after the first
    now[0] += 2.0
    budget.trim_spare()
    assert budget.spare_bytes == 4 * MIB  # the first is 11 s old and goes; the second stays
    now[0] += 10.0
    budget.trim_spare()
    assert budget.spare_bytes == 0


# --- a real server --------------------------------------------------------------------------


def _spare(port: int) -> float:
    return value(metrics(port), "tensorwire_spare_bytes")


@pytest.mark.server
def test_an_upload_into_reused_memory_holds_exactly_its_own_bytes() -> None:
    n = 4 * MIB // 4
    rng = np.random.default_rng(7)
    a, b, c = (rng.random(n, dtype=np.float32) for _ in range(3))
    with run_server() as proc, client.RemoteDevice(proc.url) as dev:
        xp = client.namespace(dev)
        ra, rb = xp.asarray(a), xp.asarray(b)
        dev.sync()
        assert _spare(proc.port) == 0
        del ra
        dev.sync()
        assert _spare(proc.port) == 4 * MIB
        rc = xp.asarray(c)  # lands in a's old memory
        dev.sync()
        assert _spare(proc.port) == 0
        assert rc.numpy().tobytes() == c.tobytes()
        assert rb.numpy().tobytes() == b.tobytes()
        assert (rc + 1).numpy().tobytes() == (c + 1).tobytes()


@pytest.mark.server
def test_a_budget_full_of_spare_memory_still_takes_a_larger_upload() -> None:
    args = ("--memory-budget", "18MiB", "--session-quota", "18MiB")  # 14 MiB under 7/8 of it
    with run_server(*args) as proc, client.RemoteDevice(proc.url) as dev:
        xp = client.namespace(dev)
        first = xp.asarray(np.ones(12 * MIB // 4, dtype=np.float32))
        dev.sync()
        del first
        dev.sync()
        assert _spare(proc.port) == 12 * MIB
        second = xp.asarray(np.full(14 * MIB // 4, 2.0, dtype=np.float32))  # needs the room
        assert float(xp.sum(second[:4])) == 8.0
        assert _spare(proc.port) == 0


@pytest.mark.server
def test_sessions_that_reuse_each_others_memory_never_see_stale_bytes() -> None:
    """Two sessions upload, read back and free same-size tensors at once, each keeping a view
    of the previous upload past its free (a view keeps the memory in use): every read returns
    exactly what its session uploaded."""
    n = 2 * MIB // 4
    errors: list[str] = []

    def work(url: str, seed: int) -> None:
        rng = np.random.default_rng(seed)
        with client.RemoteDevice(url) as dev:
            xp = client.namespace(dev)
            kept, kept_values = None, None
            for i in range(15):
                values = rng.random(n, dtype=np.float32)
                remote = xp.asarray(values)
                if kept is not None and kept.numpy().tobytes() != kept_values:
                    errors.append(f"session {seed}, round {i}: a kept view changed")
                if remote.numpy().tobytes() != values.tobytes():
                    errors.append(f"session {seed}, round {i}: upload read back wrong")
                kept = remote.reshape((2, n // 2))  # zero-copy on the server
                kept_values = values.tobytes()
                del remote  # freed; its memory stays in use under ``kept``
                dev.sync()

    with run_server() as proc:
        threads = [threading.Thread(target=work, args=(proc.url, s)) for s in (1, 2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert _spare(proc.port) > 0  # memory was kept, so it was reused
    assert errors == []


def _minor_faults(pid: int) -> int:
    """The process's minor page faults so far (``/proc/PID/stat``, field 10)."""
    with open(f"/proc/{pid}/stat") as stat:
        return int(stat.read().rsplit(")", 1)[1].split()[7])


@pytest.mark.server
@pytest.mark.skipif(not is_glibc(), reason="glibc's mallopt only")
def test_a_loop_of_ops_reuses_freed_results_instead_of_faulting_in_fresh_pages() -> None:
    """Each step makes and frees 4 MiB results, as a training step does: after a warm-up the
    server writes them into memory it already has. Before server/allocator.py and with freed
    results kept as spare, every result was fresh memory: about 1024 faults per 4 MiB."""
    with run_server() as proc, client.RemoteDevice(proc.url) as dev:
        xp = client.namespace(dev)
        w = xp.asarray(np.ones(MIB, dtype=np.float32))

        def steps(n: int) -> None:
            for _ in range(n):
                g = w * 0.5 + 1.0  # two 4 MiB results, the first freed within the batch
                float(g[0])  # one read per step; the previous step's g is freed with it

        steps(5)
        before = _minor_faults(proc.pid)
        steps(40)
        faults = _minor_faults(proc.pid) - before
    assert faults < 40 * 1024 // 8, faults  # measured: 3 faults in 40 steps (before: 41k)


def _rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


_THREADS_KEEP = """
import sys, threading
import numpy as np
from server.allocator import keep_freed_memory, resident_bytes
assert keep_freed_memory()
before = resident_bytes()
start = threading.Barrier(16)
def results():  # what a worker thread's ops do: allocate results under 32 MiB and free them
    start.wait()
    for _ in range(3):
        result = np.ones(20 << 17)
        del result
threads = [threading.Thread(target=results) for _ in range(16)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
print(resident_bytes() - before)
"""


@pytest.mark.skipif(not is_glibc(), reason="the heaps are glibc's malloc's")
def test_what_malloc_keeps_for_results_is_bounded_by_its_heaps_not_by_threads() -> None:
    """Sixteen threads each allocating and freeing 20 MiB results: with a heap per thread,
    malloc kept 320 MiB of them; held to ``HEAPS`` heaps that the threads share, 40-80 MiB
    (what each heap keeps at its top, ``TRIM_THRESHOLD``, and freed blocks below live
    ones while the threads ran)."""
    grown = subprocess.run(
        [sys.executable, "-c", _THREADS_KEEP],
        cwd=Path(__file__).resolve().parent.parent,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    assert int(grown) < (HEAPS + 1) * TRIM_THRESHOLD, f"{int(grown) / MIB:.0f} MiB kept"


@pytest.mark.server
@pytest.mark.skipif(not is_glibc(), reason="glibc's malloc_trim only")
def test_memory_malloc_kept_for_results_goes_back_once_the_server_is_idle() -> None:
    """Results freed below a live one stay in malloc's heap while the server works (no trim
    at the top reaches them); once no op has run for --spare-ttl (1 s here) the server gives
    them back (malloc_trim)."""
    with run_server("--spare-ttl", "1") as proc, client.RemoteDevice(proc.url) as dev:
        xp = client.namespace(dev)
        w = xp.asarray(np.ones(MIB, dtype=np.float32))
        results = [w * float(i) for i in range(48)]  # 192 MiB of 4 MiB results
        keep = results[-1] + 0.0  # allocated last: above the others in the heap
        dev.sync()
        del results
        dev.sync()
        held = _rss(proc.pid)
        deadline = time.monotonic() + 30
        while _rss(proc.pid) > held - 100 * MIB and time.monotonic() < deadline:
            time.sleep(0.5)
        assert _rss(proc.pid) <= held - 100 * MIB, (held, _rss(proc.pid))
        assert float(keep[0]) == 47.0


@pytest.mark.server
def test_a_temporary_is_freed_after_its_last_use_in_the_batch() -> None:
    """Ten 4 MiB results in one batch, each a temporary of the next (``x = x * 2.0``), under a
    16 MiB quota: freed at their last use, at most three are alive at once. When a batch's
    frees waited for its end, all ten were, and the fifth failed with quota_exceeded."""
    with run_server("--session-quota", "16MiB") as proc, client.RemoteDevice(proc.url) as dev:
        xp = client.namespace(dev)
        x = xp.ones(MIB, dtype=xp.float32)
        for _ in range(10):
            x = x * 2.0  # the previous x's handle dies here: its free joins this batch
        assert float(x[0]) == 1024.0
        assert dev.stats().tensor_bytes == 4 * MIB
