"""Large transfers: downloads received into reused buffers never share memory with an array the
caller still holds, arrive byte-exact across fragment boundaries, and uploads snapshot the
caller's array at the call."""

from __future__ import annotations

import gc
from typing import Any

import numpy as np
import pytest

import client
from client._buffers import BufferPool
from client._pending import COPY_BELOW

MIB = 1 << 20


def _address(array: np.ndarray[Any, Any]) -> int:
    return int(array.__array_interface__["data"][0])


# --- the pool alone -------------------------------------------------------------------------


def test_a_dropped_buffer_is_reused_and_a_held_one_never_is() -> None:
    pool = BufferPool(keep=64 * MIB, smallest=MIB)
    first = pool.take(4 * MIB)
    held = pool.take(4 * MIB)
    assert not np.shares_memory(first, held)
    address = _address(first)
    del first
    again = pool.take(4 * MIB)
    assert _address(again) == address
    assert not np.shares_memory(again, held)


def test_a_view_of_a_dropped_array_keeps_its_buffer_in_use() -> None:
    pool = BufferPool(keep=64 * MIB, smallest=MIB)
    array = pool.take(4 * MIB).view(np.float32).reshape(1024, -1)
    column = array[:, 3]
    memory = memoryview(array[7])
    del array
    other = pool.take(4 * MIB)
    assert not np.shares_memory(other, column)
    assert not np.shares_memory(other, np.asarray(memory))


def test_small_and_far_larger_buffers_are_not_taken_from_the_pool() -> None:
    pool = BufferPool(keep=64 * MIB, smallest=MIB)
    pool.take(MIB - 1)
    assert pool.nbytes == 0
    pool.take(16 * MIB)  # kept, free at once
    assert _address(pool.take(4 * MIB)) != 0
    assert pool.nbytes == 20 * MIB  # 16 MiB is too large for 4 MiB: a new one was made


def test_the_pool_stays_within_its_bound_and_lets_idle_buffers_go() -> None:
    pool = BufferPool(keep=10 * MIB, smallest=MIB)
    held = [pool.take(4 * MIB) for _ in range(3)]  # 12 MiB: the oldest is forgotten
    assert pool.nbytes == 8 * MIB
    held[0][:] = 7  # and stays valid while held
    assert int(held[0].sum()) == 7 * 4 * MIB
    del held[1]  # one free, one in use
    pool.release_idle(idle=0.0)
    assert pool.nbytes == 4 * MIB
    del held[1]
    pool.release_idle(idle=0.0)
    assert pool.nbytes == 0


def test_the_pool_keeps_at_most_its_count_of_buffers() -> None:
    pool = BufferPool(keep=64 * MIB, smallest=MIB, count=2)
    held = [pool.take(MIB) for _ in range(3)]
    assert pool.nbytes == 2 * MIB
    assert len({_address(h) for h in held}) == 3


# --- against a real server ------------------------------------------------------------------


def _random(n: int, seed: int) -> np.ndarray[Any, Any]:
    return np.random.default_rng(seed).integers(0, 2**32, n, dtype=np.uint32).view(np.float32)


def test_downloads_are_byte_exact_across_fragment_boundaries(xp: client.Namespace) -> None:
    for n in (COPY_BELOW // 4 - 1, (1 << 16) + 3, 5 * MIB // 4 + 1):  # odd fragment ends
        values = _random(n, n)
        got = xp.asarray(values).numpy()
        assert got.tobytes() == values.tobytes()  # bit-exact, NaN payloads included


def test_a_held_download_is_never_overwritten_by_a_later_one(xp: client.Namespace) -> None:
    n = 2 * MIB  # 8 MiB float32: received into a pooled buffer
    a, b = _random(n, 1), _random(n, 2)
    ra, rb = xp.asarray(a), xp.asarray(b)
    first = ra.numpy()
    view = first[::3]
    second = rb.numpy()
    assert not np.shares_memory(first, second)
    assert first.tobytes() == a.tobytes() and second.tobytes() == b.tobytes()
    del first
    gc.collect()
    third = ra.numpy()  # the first buffer is still under ``view``: not reused
    assert not np.shares_memory(third, view)
    assert view.tobytes() == a[::3].tobytes()
    assert third.tobytes() == a.tobytes()


def test_a_dropped_download_buffer_is_reused_with_the_new_values(xp: client.Namespace) -> None:
    n = 2 * MIB
    a, b = _random(n, 3), _random(n, 4)
    ra, rb = xp.asarray(a), xp.asarray(b)
    first = ra.numpy()
    address = _address(first)
    del first
    second = rb.numpy()
    assert _address(second) == address
    assert second.tobytes() == b.tobytes()
    second[:] = 0  # the caller's to change
    assert rb.numpy().tobytes() == b.tobytes()


@pytest.mark.parametrize("nbytes", [4096, COPY_BELOW - 4, COPY_BELOW, 3 * COPY_BELOW + 12])
def test_an_upload_changed_right_after_the_call_arrives_as_it_was(
    xp: client.Namespace, nbytes: int
) -> None:
    values = _random(nbytes // 4, nbytes)
    sent = values.copy()
    remote = xp.asarray(values)
    values[:] = -1.0  # before any flush for a small upload; after the send for a large one
    assert remote.numpy().tobytes() == sent.tobytes()
