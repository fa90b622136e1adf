"""The ndarray device in this process (client.local.LocalDevice): the namespace over it gives
numpy's results, failures raise what a real server raises (compared with one, message for
message), its accounting returns to where it was, training on it is bit-identical to training
through a server, and it closes like a remote device."""

from __future__ import annotations

import gc
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

import client
from client import nn, optim
from client._connection import FLUSH_OPS
from client.autodiff import Autodiff
from client.local import LocalConnection, LocalDevice, local_config
from protocol import DTYPES, Sync, TensorMeta, byte_view, to_numpy
from protocol.graphs import GraphConstant, GraphDef, GraphTensor, check_graph
from protocol.ops import Binary, Full, RunGraph

from .servers import ROOT, ServerProcess, run_server

AnyDevice = LocalDevice | client.RemoteDevice


@pytest.fixture
def local() -> Iterator[LocalDevice]:
    with LocalDevice() as device:
        yield device


@pytest.fixture
def lxp(local: LocalDevice) -> client.Namespace:
    return client.namespace(local)


def test_importing_client_loads_no_server_until_a_device_is_made() -> None:
    code = (
        "import sys, client, client.local\n"
        "assert not [m for m in sys.modules if m.split('.')[0] == 'server'], 'imported'\n"
        "dev = client.local.LocalDevice()\n"
        "assert 'server.session' in sys.modules\n"
        "assert 'server.connection' not in sys.modules and 'anyio' not in sys.modules\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr


# --- results: the same as numpy -------------------------------------------------------------

A = np.arange(12, dtype=np.float32).reshape(3, 4) - 5
B = np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3)

# Each computes the same thing in numpy and in the namespace (``xp`` is either one).
CASES: dict[str, Callable[[Any, Any, Any], Any]] = {
    "elementwise": lambda xp, a, b: xp.where(a > 0, xp.exp(a / 10), -xp.abs(a)),
    "float_scalars": lambda xp, a, b: 2.5 - a * 1.5,
    "int_scalars": lambda xp, a, b: xp.astype(a, xp.int32) // 3 + 7,
    "matmul": lambda xp, a, b: a @ b,
    "sum_axis": lambda xp, a, b: xp.sum(a, axis=0),
    "mean_and_max": lambda xp, a, b: xp.stack([xp.mean(a), xp.max(a)]),
    "argmax": lambda xp, a, b: xp.argmax(a, axis=1),
    "cumulative_sum": lambda xp, a, b: xp.cumulative_sum(a, axis=1),
    "sort": lambda xp, a, b: xp.sort(-a, axis=1),
    "slice": lambda xp, a, b: a[1:, ::2],
    "newaxis": lambda xp, a, b: a[None, ..., -1],
    "take": lambda xp, a, b: xp.take(a, xp.asarray(np.array([2, 0])), axis=0),
    "reshape_transpose": lambda xp, a, b: xp.reshape(a, (6, 2)).T + 0,
    "boolean_mask": lambda xp, a, b: a[a > 1],  # data-dependent shapes: one describe
    "nonzero": lambda xp, a, b: xp.nonzero(a > 2)[1],
    "unique_values": lambda xp, a, b: xp.unique_values(xp.round(a / 3)),
    "zero_d": lambda xp, a, b: xp.sum(a) * a[1, 2],
    "empty": lambda xp, a, b: xp.sum(a[:, :0], axis=1),
    "empty_matmul": lambda xp, a, b: a[:0] @ b,
}


@pytest.mark.parametrize("name", list(CASES))
def test_results_match_numpy(lxp: client.Namespace, name: str) -> None:
    expected = np.asarray(CASES[name](np, A.copy(), B.copy()))
    got = CASES[name](lxp, lxp.asarray(A), lxp.asarray(B))
    assert got.shape == expected.shape
    values = got.numpy()
    assert values.dtype == expected.dtype and values.shape == expected.shape
    np.testing.assert_array_equal(values, expected)


def _writes(xp: Any, x: Any) -> list[Any]:
    """In-place writes through views and masks, as numpy orders them."""
    view = x[1:3, ::2]
    view[...] = -1.0
    view += 0.5
    x[0] = 7.0
    x[x > 20] = 0.0
    flat = xp.reshape(x, (24,))  # a view: sees the writes before and after
    x[3, 5] = 99.0
    return [x, view, flat]


def test_setitem_and_views_match_numpy(lxp: client.Namespace) -> None:
    local = np.arange(24.0).reshape(4, 6)
    expected = _writes(np, local)
    got = _writes(lxp, lxp.asarray(local))
    for g, e in zip(got, expected, strict=True):
        np.testing.assert_array_equal(g.numpy(), e)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(3, 4), (), (0,), (2, 0, 3)], ids=str)
def test_uploads_round_trip_every_dtype(lxp: client.Namespace, dtype: str, shape: Any) -> None:
    raw = np.random.default_rng(1).standard_normal(shape) * 100
    values = raw > 0 if dtype == "bool" else raw.astype(to_numpy(dtype))
    back = lxp.asarray(values).numpy()
    assert back.dtype == values.dtype and back.shape == values.shape
    assert back.flags.writeable and back.flags.c_contiguous
    np.testing.assert_array_equal(back, values)


def test_uploads_are_taken_before_the_caller_changes_them(lxp: client.Namespace) -> None:
    small, large = np.ones(10), np.ones(300_000)  # the large one (2.4 MB) is not copied first
    small_array, large_array = lxp.asarray(small), lxp.asarray(large)
    small[:], large[:] = 5, 5
    assert small_array.numpy().tolist() == [1.0] * 10
    assert float(lxp.sum(large_array)) == 300_000.0


def test_ops_run_at_the_op_threshold_without_a_request(local: LocalDevice) -> None:
    xp = client.namespace(local)
    x = xp.zeros(4)
    for _ in range(FLUSH_OPS + 10):
        x = x + 1
    conn: Any = local._conn
    session = conn._session
    assert session.ops_run >= FLUSH_OPS
    assert x.numpy().tolist() == [FLUSH_OPS + 10.0] * 4


def test_threads_share_one_device(lxp: client.Namespace) -> None:
    results: dict[int, list[float]] = {}

    def work(k: int) -> None:
        x = lxp.full(3, float(k))
        for _ in range(200):
            x = x * 1 + 1
        results[k] = x.numpy().tolist()

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == {k: [k + 200.0] * 3 for k in range(4)}


# --- failures: what a real server raises ----------------------------------------------------


def _outcome(thunk: Callable[[], Any]) -> tuple[Any, ...]:
    """What ``thunk()`` gave: values, or the error's type, code and message."""
    try:
        value = thunk()
    except Exception as exc:
        return type(exc).__name__, getattr(exc, "code", None), getattr(exc, "op", None), str(exc)
    return ("ok", np.asarray(value).tolist() if value is not None else None)


def _failures(dev: AnyDevice) -> list[tuple[Any, ...]]:
    """Failing ops of every kind, then the session going on; fresh devices of both kinds
    number tensors alike, so the messages (which name ids) must be equal."""
    xp = client.namespace(dev)
    a, b = xp.ones((2, 3)), xp.ones((4, 5))
    bad = dev.submit_unchecked(  # built against the protocol, past the local checks
        Binary(op="matmul", out=dev.new_id(), x1=a.tensor_id, x2=b.tensor_id),
        TensorMeta((2, 5), "float64"),
    )
    dependant = xp.exp(bad) + 1
    target = xp.asarray(np.arange(3))
    target[xp.asarray(np.array([5]))] = 1  # out of bounds: only the server knows
    huge = xp.zeros((2**16, 2**16))  # 32 GiB: over the per-op cap
    ghost = client.RemoteArray(dev, 10**9, TensorMeta((1,), "float64"))
    reads = (bad.numpy, dependant.numpy, target.numpy, huge.numpy, ghost.numpy)
    outcomes = [_outcome(f) for f in (*reads, lambda: xp.nonzero(bad), lambda: a @ b)]
    dev.submit(Full(out=a.tensor_id, shape=(1,), dtype="float64", value=1.0))  # a live id
    outcomes.append(_outcome(dev.sync))
    outcomes.append(_outcome((a * 2).numpy))
    stats = dev.stats()
    outcomes.append((stats.tensors, stats.tensor_bytes, stats.failed))
    return outcomes


def test_failures_are_the_remote_ones(url: str) -> None:
    with LocalDevice() as local, client.RemoteDevice(url) as remote:
        got, expected = _failures(local), _failures(remote)
    codes = [o[1] for o in expected[:6]] + [expected[7][1]]
    assert codes == [
        "invalid_op",
        "invalid_op",
        "execution_failed",
        "limit_exceeded",
        "unknown_tensor",
        "invalid_op",
        "duplicate_tensor",
    ]
    assert expected[6][0] == "OpShapeError" and expected[8] == ("ok", [[2.0] * 3] * 2)
    assert got == expected


def _limits(dev: AnyDevice) -> list[tuple[Any, ...]]:
    xp = client.namespace(dev)
    outcomes = [
        _outcome(xp.asarray(np.zeros(4000)).numpy),  # 32000 bytes of upload
        _outcome(xp.zeros(4000).numpy),  # 32000 bytes of output
        _outcome(xp.ones(100).numpy),
    ]
    gc.collect()  # a remote reply's error holds its array in a cycle (Reply.result's frame)
    stats = dev.stats()
    outcomes.append((stats.tensors, stats.tensor_bytes, stats.failed))
    return outcomes


@pytest.mark.server
@pytest.mark.parametrize(
    ("flags", "kwargs", "code"),
    [
        (("--session-quota", "4096"), {"session_quota": 4096}, "quota_exceeded"),
        (
            ("--memory-budget", "16384", "--session-quota", "1MiB"),
            {"memory_budget": 16384, "session_quota": 2**20},
            "server_memory_exhausted",
        ),
    ],
    ids=["quota", "budget"],
)
def test_memory_limits_fail_as_on_a_server(flags: Any, kwargs: Any, code: str) -> None:
    with run_server(*flags) as proc, client.RemoteDevice(proc.url) as remote:
        expected = _limits(remote)
    with LocalDevice(**kwargs) as local:
        got = _limits(local)
    assert [o[1] for o in expected[:2]] == [code, code]
    assert expected[2] == ("ok", [1.0] * 100)
    assert got == expected


def test_a_bad_device_index_is_refused_as_by_a_server(server: ServerProcess) -> None:
    with pytest.raises(client.DeviceIndexError) as remote:
        client.RemoteDevice(server.url, index=2)  # the fixture's server hosts ndarray:2
    with pytest.raises(client.DeviceIndexError) as local:
        LocalDevice(index=2, count=2)
    assert str(local.value) == str(remote.value)
    with LocalDevice(index=1, count=2) as dev:
        assert (dev.index, dev.device_count, dev.url) == (1, 2, "ndarray")
        assert repr(dev) == "LocalDevice(index=1, count=2)"
    with pytest.raises(ValueError, match="session_quota"):
        LocalDevice(session_quota=-1)


# --- accounting -----------------------------------------------------------------------------


def _budget(dev: LocalDevice) -> Any:
    """The memory budget of the device's session (its own: each local device is a server)."""
    conn: Any = dev._conn
    return conn._session.store.budget


def test_stats_count_and_return_to_baseline(local: LocalDevice) -> None:
    xp = client.namespace(local)
    assert local.stats() == client.SessionStats(0, 0, 0, 0, 1)
    arrays = [xp.asarray(np.full((100,), i)) for i in range(50)]
    total = xp.zeros(100)
    for a in arrays:
        total = total + a * 2
    bad = local.submit_unchecked(
        Binary(op="add", out=local.new_id(), x1=arrays[0].tensor_id, x2=10**9),
        TensorMeta((100,), "float64"),
    )
    stats = local.stats()  # the 50 arrays, total and bad; every temporary is already freed
    assert (stats.tensors, stats.tensor_bytes, stats.failed) == (52, 51 * 800, 1)
    assert stats.server_tensor_bytes == 51 * 800 and stats.connections == 1
    np.testing.assert_array_equal(total.numpy(), np.full(100, 2 * sum(range(50)), dtype=float))
    view = total[10:20]
    del arrays, a, total, bad
    gc.collect()
    assert local.stats() == client.SessionStats(1, 800, 0, 800, 1)  # the view keeps its root
    del view
    gc.collect()
    assert local.stats() == client.SessionStats(0, 0, 0, 0, 1)


def test_close_is_idempotent_and_later_use_raises(local: LocalDevice) -> None:
    xp = client.namespace(local)
    kept = xp.ones(1000)
    pending = kept + 1  # not run yet: close runs it, then drops everything
    budget = _budget(local)
    local.close()
    local.close()
    assert budget.used == 0 and budget.sessions == 0
    for use in (pending.numpy, lambda: xp.ones(2), local.stats, local.sync):
        with pytest.raises(client.ConnectionLost, match="closed"):
            use()
    local.flush()  # nothing to run: no error
    del kept, pending  # frees after close are dropped


def test_a_collected_device_closes_its_session() -> None:
    dev = LocalDevice()
    budget = _budget(dev)
    x = client.namespace(dev).ones(1000)
    x.numpy()
    assert budget.used == 8000
    del dev, x
    gc.collect()
    assert budget.used == 0 and budget.sessions == 0


def test_a_failing_session_is_lost_with_a_typed_error(local: LocalDevice) -> None:
    """A bug in the session (here, a step that raises) ends it as a server drops a session
    whose worker step failed: ConnectionLost with code internal, now and on every later call."""
    xp = client.namespace(local)
    x = xp.ones(3)
    conn: Any = local._conn

    def broken(job: Any, inline: bool) -> bool:
        raise RuntimeError("a bug")

    conn._session.step = broken
    for use in (x.numpy, lambda: xp.ones(2), local.stats):
        with pytest.raises(client.ConnectionLost, match="RuntimeError: a bug") as info:
            use()
        assert info.value.code == "internal"
    assert _budget(local).used == 0 and _budget(local).sessions == 0
    local.close()


def test_a_close_during_a_batch_waits_for_the_batch(local: LocalDevice) -> None:
    """The device's finalizer may run inside a batch (a garbage collection in its thread): the
    batch finishes and answers, then the session closes."""
    xp = client.namespace(local)
    x = xp.ones(3) * 2
    conn: Any = local._conn
    step = conn._session.step

    def closing(job: Any, inline: bool) -> bool:
        conn.close()  # as the finalizer would: must neither deadlock nor cut the batch short
        return bool(step(job, inline))

    conn._session.step = closing
    assert x.numpy().tolist() == [2.0] * 3
    with pytest.raises(client.ConnectionLost, match="closed"):
        xp.ones(1)
    assert _budget(local).used == 0


def test_a_device_over_a_ready_connection() -> None:
    """Device.from_connection: a device over a connection made elsewhere, closed with it."""
    conn = LocalConnection(0, 1, local_config(max_ndim=2))
    dev = client.Device.from_connection(conn, "ndarray")
    xp = client.namespace(dev)
    assert repr(dev) == "Device('ndarray', index=0)" and dev.device_count == 1
    assert float(xp.sum(xp.ones((2, 3)))) == 6.0
    with pytest.raises(client.RemoteError, match="3 dimensions; the limit is 2") as info:
        xp.ones((1, 1, 1)).numpy()  # the session's limit, unknown to the client's checks
    assert info.value.code == "limit_exceeded"
    del dev, xp, info
    gc.collect()
    with pytest.raises(client.ConnectionLost):
        conn.request(lambda rid: Sync(request_id=rid))


# --- training: bit-identical to a server ----------------------------------------------------

STEPS = 6


def _train(ad: Autodiff) -> list[float]:
    """tests/test_training.py's classifier, for a few steps."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal((96, 16)).astype(np.float32)
    y = (x[:, :4].argmax(axis=1) + 3 * (x[:, 4] > 0)).astype(np.int64)  # 7 classes
    init = np.random.default_rng(0)
    model = nn.Sequential(
        nn.Linear(16, 32, ad=ad, rng=init),
        nn.GELU(),
        nn.LayerNorm(32, ad=ad),
        nn.Linear(32, 7, ad=ad, rng=init),
    )
    opt = optim.AdamW(model.parameters(), lr=1e-2, weight_decay=1e-2)
    data, labels = ad.asarray(x), ad.asarray(y)
    losses = []
    for step in range(STEPS):
        rows = ad.asarray(np.arange(step % 3 * 32, step % 3 * 32 + 32))
        loss = nn.cross_entropy(model(ad.take(data, rows, axis=0)), ad.take(labels, rows))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss))
    return losses


def test_training_is_bit_identical_to_a_server(url: str) -> None:
    with LocalDevice() as local, client.RemoteDevice(url) as remote:
        on_local = _train(Autodiff(client.namespace(local)))
        on_server = _train(Autodiff(client.namespace(remote)))
    assert on_local[-1] < on_local[0]  # it trained
    assert on_local == on_server


# --- graphs (the server's side of registration: server/session.py) ---------------------------


def test_a_registered_graph_runs_and_drops() -> None:
    graph = GraphDef(
        inputs=[GraphTensor(name="x", id=1, shape=(3,), dtype="float64")],
        outputs=[GraphTensor(name="y", id=3, shape=(3,), dtype="float64")],
        constants=[GraphConstant(id=2, shape=(3,), dtype="float64")],
        ops=[Binary(op="add", out=3, x1=1, x2=2)],
    )
    check_graph(graph)
    with LocalDevice() as dev:
        conn: Any = dev._conn
        graph_id = conn.new_graph_id()
        conn.register_graph(graph_id, graph, [byte_view(np.array([10.0, 20.0, 30.0]))])
        x = client.namespace(dev).asarray(np.array([1.0, 2.0, 3.0]))
        op = RunGraph(out=dev.new_id(), graph=graph_id, args=(x.tensor_id,))
        y = dev.submit_unchecked(op, TensorMeta((3,), "float64"))
        assert y.numpy().tolist() == [11.0, 22.0, 33.0]
        conn.drop_graph(graph_id)
        del x, y
        gc.collect()
        assert dev.stats().tensor_bytes == 0
