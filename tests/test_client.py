"""The client against a real server process on loopback."""

from __future__ import annotations

import asyncio
import gc
import threading
import weakref
from typing import Any

import numpy as np
import pytest

import client
from protocol import OpDTypeError, OpShapeError, TensorMeta
from protocol.ops import Binary

from .servers import ServerProcess


def test_readme_example(url: str) -> None:
    dev = client.RemoteDevice(url)
    xp = client.namespace(dev)
    a = xp.asarray(np.arange(6, dtype=np.float32).reshape(2, 3))
    b = xp.sum(xp.exp(a) @ xp.ones((3, 4)), axis=0)
    assert b.shape == (4,)
    assert b.dtype == np.float64  # float32 @ float64 promotes, as in numpy
    local = np.sum(np.exp(np.arange(6, dtype=np.float32).reshape(2, 3)) @ np.ones((3, 4)), axis=0)
    np.testing.assert_array_equal(b.numpy(), local)
    dev.sync()
    dev.close()
    dev.close()  # idempotent


def test_op_chain_matches_numpy(xp: client.Namespace) -> None:
    rng = np.random.default_rng(0)
    w_np = rng.standard_normal((8, 4)).astype(np.float32)
    x_np = rng.standard_normal((16, 8)).astype(np.float32)
    w, x = xp.asarray(w_np), xp.asarray(x_np)

    def chain(m: Any, w: Any, x: Any) -> Any:
        h = m.tanh(x @ w) * 2.0 - 1
        h = m.where(h > 0, h, m.abs(h) / 3)
        h = m.maximum(m.sqrt(m.abs(h)), m.exp(-h))
        s = m.mean(h, axis=1, keepdims=True) + m.max(h, axis=0)
        return m.astype(s.T, m.float64)[1:3, ::2] ** 2

    remote = chain(xp, w, x)
    local = chain(np, w_np, x_np)
    assert isinstance(remote, client.RemoteArray) and isinstance(local, np.ndarray)
    assert remote.shape == local.shape and remote.dtype == local.dtype
    np.testing.assert_array_equal(remote.numpy(), local)


def test_creation_and_reductions(xp: client.Namespace) -> None:
    np.testing.assert_array_equal(xp.arange(2, 11, 3).numpy(), np.arange(2, 11, 3))
    np.testing.assert_array_equal(xp.arange(0.0, 1.0, 0.1).numpy(), np.arange(0.0, 1.0, 0.1))
    np.testing.assert_array_equal(xp.eye(3, 4, k=1).numpy(), np.eye(3, 4, k=1))
    np.testing.assert_array_equal(
        xp.full((2, 2), 7, dtype=xp.int8).numpy(), np.full((2, 2), 7, np.int8)
    )
    a_np = np.arange(24, dtype=np.int32).reshape(2, 3, 4)
    a = xp.asarray(a_np)
    assert a.dtype == np.int32 and a.shape == (2, 3, 4)
    np.testing.assert_array_equal(xp.argmax(a, axis=1).numpy(), np.argmax(a_np, axis=1))
    np.testing.assert_array_equal(xp.sum(a, axis=(0, 2)).numpy(), np.sum(a_np, axis=(0, 2)))
    np.testing.assert_array_equal(xp.min(a, keepdims=True).numpy(), np.min(a_np, keepdims=True))
    np.testing.assert_array_equal(
        xp.permute_dims(a, (2, 0, 1)).numpy(), np.transpose(a_np, (2, 0, 1))
    )
    np.testing.assert_array_equal(xp.reshape(a, (4, -1)).numpy(), a_np.reshape(4, -1))
    np.testing.assert_array_equal(a[..., None, 1].numpy(), a_np[..., None, 1])
    assert int(xp.sum(a)) == int(a_np.sum())
    assert bool(xp.any(a > 22)) and not bool(xp.all(a > 0))


def test_scalars_follow_numpy_2_promotion(xp: client.Namespace) -> None:
    a_np = np.arange(4, dtype=np.float32)
    i_np = np.arange(4, dtype=np.int8)
    a, i = xp.asarray(a_np), xp.asarray(i_np)
    with np.errstate(all="ignore"):
        inf_np = a_np / 0
    cases = [
        (a + 1, a_np + 1),
        (2.5 * a, 2.5 * a_np),
        (i + 3, i_np + 3),
        (i * 1.5, i_np * 1.5),
        (1 - i, 1 - i_np),
        (a + 1j, a_np + 1j),
        (i > 1, i_np > 1),
        (a / 0, inf_np),
    ]
    for remote, local in cases:
        assert remote.dtype == local.dtype, (remote, local.dtype)
        np.testing.assert_array_equal(remote.numpy(), local)


def test_local_errors_are_raised_before_sending(xp: client.Namespace) -> None:
    a, b = xp.ones((2, 3)), xp.ones((4, 5))
    with pytest.raises(OpShapeError, match="do not align"):
        _ = a @ b
    with pytest.raises(ValueError, match="broadcast"):
        _ = a + b
    with pytest.raises(OpDTypeError):
        _ = a & a
    with pytest.raises(OverflowError):
        _ = xp.ones(3, dtype=xp.int8) + 300
    assert (a + 1).numpy().sum() == 12  # nothing above reached the server


def test_numpy_returns_writable_arrays(xp: client.Namespace) -> None:
    a = xp.ones((3,))
    values = a.numpy()
    values[0] = 5  # would raise on a read-only array
    assert np.asarray(a).flags.writeable
    big = xp.zeros((600, 1000))  # 4.8 MB: arrives in fragments
    assert big.numpy().flags.writeable


def test_failed_op_is_reported_and_session_carries_on(dev: client.RemoteDevice) -> None:
    xp = client.namespace(dev)
    a, b = xp.ones((2, 3)), xp.ones((4, 5))
    # Built by hand against the protocol, bypassing the local checks.
    out = dev._conn.new_id()
    bad = dev.submit_unchecked(
        Binary(op="matmul", out=out, x1=a.tensor_id, x2=b.tensor_id), TensorMeta((2, 5), "float64")
    )
    dependant = xp.exp(bad) + 1
    with pytest.raises(client.RemoteError) as info:
        bad.numpy()
    assert info.value.code == "invalid_op"
    assert info.value.op == f"matmul(#{a.tensor_id}, #{b.tensor_id}) -> #{out}"
    assert "do not align" in str(info.value)
    with pytest.raises(client.RemoteError) as dep_info:
        dependant.numpy()
    assert dep_info.value.op == info.value.op  # the op that really failed is named
    np.testing.assert_array_equal((a * 2).numpy(), np.full((2, 3), 2.0))
    assert dev.stats().failed == 2  # bad and dependant; the temporary exp(bad) was freed
    dev.sync()


def test_namespace_is_one_object_and_does_not_keep_its_device_alive(url: str) -> None:
    dev = client.RemoteDevice(url)
    xp = client.namespace(dev)
    assert client.namespace(dev) is xp and xp.ones(1).__array_namespace__() is xp
    session = dev._close  # the finalizer that closes the session
    device = weakref.ref(dev)
    del dev, xp  # no cycle: the session closes at once, without a garbage collection
    assert device() is None and not session.alive


def test_reading_unknown_tensor_fails_cleanly(dev: client.RemoteDevice) -> None:
    ghost = client.RemoteArray(dev, 10**9, TensorMeta((1,), "float64"))
    with pytest.raises(client.RemoteError, match="unknown_tensor"):
        ghost.numpy()
    assert client.namespace(dev).ones(2).numpy().tolist() == [1.0, 1.0]


def test_freeing_returns_server_count_to_zero(dev: client.RemoteDevice) -> None:
    xp = client.namespace(dev)
    assert dev.stats().tensors == 0
    arrays = [xp.asarray(np.full((100,), i)) for i in range(50)]
    total = xp.zeros(100)
    for a in arrays:
        total = total + a * 2
    stats = dev.stats()  # the 50 arrays and total; every temporary is already freed
    assert (stats.tensors, stats.tensor_bytes) == (51, 51 * 800)
    del arrays, a
    gc.collect()
    np.testing.assert_array_equal(total.numpy(), np.full(100, 2 * sum(range(50)), dtype=float))
    del total
    gc.collect()
    stats = dev.stats()
    assert (stats.tensors, stats.tensor_bytes, stats.failed) == (0, 0, 0)


def test_eight_concurrent_clients_stay_isolated(url: str) -> None:
    errors: list[BaseException] = []
    barrier = threading.Barrier(8)

    def work(k: int) -> None:
        try:
            with client.RemoteDevice(url) as dev:
                xp = client.namespace(dev)
                x = xp.full((64,), float(k))
                barrier.wait(timeout=30)
                for step in range(200):
                    x = x + 1
                    if step % 50 == 0:
                        dev.flush()
                np.testing.assert_array_equal(x.numpy(), np.full(64, k + 200.0))
                del x
                gc.collect()
                assert dev.stats().tensors == 0
        except BaseException as exc:  # reported below, with the thread's own traceback
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors


def test_threads_share_one_device(dev: client.RemoteDevice) -> None:
    xp = client.namespace(dev)
    results: dict[int, float] = {}

    def work(k: int) -> None:
        y = xp.zeros(()) + k
        for _ in range(100):
            y = y + 1
        results[k] = float(y)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert results == {k: k + 100.0 for k in range(4)}


def test_one_process_several_devices(url: str) -> None:
    with client.RemoteDevice(url, index=0) as d0, client.RemoteDevice(url, index=1) as d1:
        assert d0.device_count == 2 and d0.server_id == d1.server_id
        x0 = client.namespace(d0).ones(3)
        x1 = client.namespace(d1).ones(3)
        with pytest.raises(ValueError, match="different devices"):
            _ = x0 + x1
        moved = client.namespace(d1).asarray(x0)  # through the client for now
        assert moved.device is d1
        np.testing.assert_array_equal((moved + x1).numpy(), np.full(3, 2.0))


def test_large_tensor_round_trip(xp: client.Namespace) -> None:
    values = np.random.default_rng(1).standard_normal((2048, 2048)).astype(np.float32)  # 16 MiB
    a = xp.asarray(values)
    values_copy = values.copy()
    values[:] = 0  # the upload was already sent; changing the source must not matter
    np.testing.assert_array_equal(a.numpy(), values_copy)
    np.testing.assert_array_equal((a * 2).numpy(), values_copy * 2)


@pytest.mark.asyncio
async def test_async_api(url: str) -> None:
    async with await client.AsyncRemoteDevice.connect(url) as dev:
        xp = client.namespace(dev)
        a = xp.arange(6, dtype=xp.float32)
        b, c = xp.exp(a), xp.sum(a)
        got_b, got_c = await asyncio.gather(dev.read(b), dev.read(c))
        np.testing.assert_array_equal(got_b, np.exp(np.arange(6, dtype=np.float32)))
        assert got_c == 15.0
        await dev.sync()
        assert (await dev.stats()).tensors == 3


def test_bad_device_index_is_a_typed_error(url: str) -> None:
    with pytest.raises(client.DeviceIndexError, match="indices 0..1"):
        client.RemoteDevice(url, index=2)


@pytest.mark.inprocess
def test_nothing_listening_is_a_connection_error() -> None:
    with pytest.raises(ConnectionError, match="cannot connect"):
        client.RemoteDevice("ws://127.0.0.1:1", open_timeout=2)


def test_server_killed_mid_session(server: ServerProcess) -> None:
    from .servers import run_server

    with run_server() as proc:
        dev = client.RemoteDevice(proc.url)
        xp = client.namespace(dev)
        a = xp.ones((256, 256))
        a.numpy()
        first_id = dev.server_id
        big = a @ a
        for _ in range(20):
            big = big @ a  # keep the server busy while it dies
        proc.kill()
        with pytest.raises(ConnectionError):
            big.numpy()
        with pytest.raises(client.ConnectionLost):
            xp.ones(3)  # every later call fails at once, too
        with pytest.raises(ConnectionError):
            dev.sync()
        dev.close()
    with run_server() as proc:
        with client.RemoteDevice(proc.url) as again:
            assert again.server_id != first_id


def test_device_specs_name_remote_devices(server: ServerProcess) -> None:
    with client.RemoteDevice(f"remote:{server.url}") as dev:
        assert dev.url == server.url
        assert client.namespace(dev).ones(1).numpy().tolist() == [1.0]
    for spec in ["ndarray", "capture:ndarray", "bogus"]:
        with pytest.raises(ValueError):
            client.RemoteDevice(spec)


def test_threads_reading_at_once_each_get_their_own_reply(dev: client.RemoteDevice) -> None:
    """Leader/follower: eight threads read at the same time, small tensors and 4 MiB ones (sent
    in fragments), so that one thread's reply is often read by another."""
    xp = client.namespace(dev)
    sizes = [1, 7, 1 << 19, 3, 1 << 19, 64, 5, 1 << 19]
    arrays = [xp.full((n,), float(k)) for k, n in enumerate(sizes)]
    barrier = threading.Barrier(len(arrays))
    failures: list[str] = []

    def work(k: int) -> None:
        barrier.wait(30)
        for _ in range(20):
            got = arrays[k].numpy()
            if got.shape != (sizes[k],) or not (got == float(k)).all():
                failures.append(f"thread {k} read {got[:3]} of shape {got.shape}")

    threads = [threading.Thread(target=work, args=(k,)) for k in range(len(arrays))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)
    assert not failures, failures[:3]
