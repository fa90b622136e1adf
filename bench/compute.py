"""Compute workloads: pipelined elementwise ops, a matmul chain, many clients at once.

References: the same chain in local numpy, and one client alone on the same server.
Extra clients are separate processes (``spawn``), as real clients would be.
"""

from __future__ import annotations

import multiprocessing as mp
import time
from collections.abc import Callable
from multiprocessing.synchronize import Barrier, Event

import numpy as np

import client

from ._report import Figure, Goal, Stat

Tick = Callable[[], None]


def _chain_remote(xp: client.Namespace, ops: int) -> float:
    """Seconds for ``ops`` pipelined adds on 16-element tensors, then one read."""
    a = xp.asarray(np.ones(16, dtype=np.float32))
    x = a
    start = time.perf_counter()
    for _ in range(ops):
        x = x + a
    x.numpy()
    return time.perf_counter() - start


def _chain_local(ops: int) -> float:
    a = np.ones(16, dtype=np.float32)
    x = a
    start = time.perf_counter()
    for _ in range(ops):
        x = x + a
    return time.perf_counter() - start


def pipelined(dev: client.RemoteDevice, ops: int, reps: int, tick: Tick) -> Figure:
    """Ops per second of the pipelined chain, with local numpy's as the reference."""
    xp = client.namespace(dev)
    _chain_remote(xp, min(ops, 2000))  # warm up
    ours, local = [], []
    for _ in range(reps):
        ours.append(ops / _chain_remote(xp, ops))
        local.append(ops / _chain_local(ops))
        tick()
    rate = Stat.of(ours, "ops/s")
    return Figure(f"{ops} pipelined adds, 16 elements, then a read", "ops per second",
                  rate.median, Goal(">=", 50_000), rate, Stat.of(local, "ops/s"),
                  "local numpy")  # fmt: skip


def matmul_chain(dev: client.RemoteDevice, n: int, chain: int, reps: int, tick: Tick) -> Figure:
    """Remote time of ``chain`` n x n float32 matmuls (then a sync) over local numpy's."""
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((n, n)) / np.sqrt(n)).astype(np.float32)
    x0 = rng.standard_normal((n, n)).astype(np.float32)
    xp = client.namespace(dev)
    rw, rx = xp.asarray(w), xp.asarray(x0)
    dev.sync()
    ours, local = [], []
    for rep in range(reps + 1):  # the first round warms up BLAS on both sides
        start = time.perf_counter()
        x = rx
        for _ in range(chain):
            x = x @ rw
        dev.sync()
        ours.append(time.perf_counter() - start)
        start = time.perf_counter()
        y = x0
        for _ in range(chain):
            y = y @ w
        local.append(time.perf_counter() - start)
        if rep == 0:
            ours.clear()
            local.clear()
        else:
            tick()
    remote, ref = Stat.of(ours, "s"), Stat.of(local, "s")
    name = f"chain of {chain} {n}x{n} float32 matmuls"
    return Figure(name, "remote time / local numpy", remote.median / ref.median, Goal("<=", 1.1),
                  remote, ref, "local numpy")  # fmt: skip


def _client_worker(url: str, ops: int, reps: int, barrier: Barrier, results: mp.Queue) -> None:  # type: ignore[type-arg]
    with client.RemoteDevice(url) as dev:
        xp = client.namespace(dev)
        _chain_remote(xp, min(ops, 500))
        for _ in range(reps):
            barrier.wait()
            start = time.monotonic()
            _chain_remote(xp, ops)
            results.put((start, time.monotonic()))


def _clients_rate(url: str, clients: int, ops: int, reps: int, tick: Tick) -> list[float]:
    """Total ops/s of ``clients`` processes running the chain at once, per repetition."""
    ctx = mp.get_context("spawn")
    barrier, results = ctx.Barrier(clients), ctx.Queue()
    procs = [
        ctx.Process(target=_client_worker, args=(url, ops, reps, barrier, results))
        for _ in range(clients)
    ]
    for p in procs:
        p.start()
    rates = []
    try:
        for _ in range(reps):
            spans = [results.get(timeout=600) for _ in range(clients)]
            elapsed = max(end for _, end in spans) - min(start for start, _ in spans)
            rates.append(clients * ops / elapsed)
            tick()
    finally:
        for p in procs:
            p.join(60)
    return rates


def many_clients(url: str, clients: int, ops: int, reps: int, tick: Tick) -> Figure:
    """Total throughput of ``clients`` pipelining at once over one client's alone."""
    one = Stat.of(_clients_rate(url, 1, ops, reps, tick), "ops/s")
    many = Stat.of(_clients_rate(url, clients, ops, reps, tick), "ops/s")
    return Figure(f"{clients} clients pipelining at once", "total throughput / one client's",
                  many.median / one.median, Goal(">=", 0.8), many, one, "one client")  # fmt: skip


def _heavy_worker(url: str, n: int, started: Barrier, stop: Event) -> None:
    rng = np.random.default_rng(1)
    with client.RemoteDevice(url) as dev:
        xp = client.namespace(dev)
        w = xp.asarray((rng.standard_normal((n, n)) / np.sqrt(n)).astype(np.float32))
        x = w
        dev.sync()
        started.wait()
        while not stop.is_set():
            for _ in range(4):
                x = x @ w
            dev.sync()


def idle_under_load(
    dev: client.RemoteDevice, url: str, heavy: int, n: int, pings: int, tick: Tick
) -> Figure:
    """An idle client's read round trip while ``heavy`` clients run n x n matmul chains."""
    x = client.namespace(dev).asarray(np.ones(1, dtype=np.float32))
    x.numpy()
    quiet: list[float] = []
    for _ in range(pings):
        start = time.perf_counter()
        x.numpy()
        quiet.append((time.perf_counter() - start) * 1e3)
    ctx = mp.get_context("spawn")
    started, stop = ctx.Barrier(heavy + 1), ctx.Event()
    procs = [ctx.Process(target=_heavy_worker, args=(url, n, started, stop)) for _ in range(heavy)]
    for p in procs:
        p.start()
    loaded = []
    try:
        started.wait(timeout=300)
        time.sleep(0.2)  # let the first matmuls reach the workers; not a correctness wait
        for _ in range(pings):
            start = time.perf_counter()
            x.numpy()
            loaded.append((time.perf_counter() - start) * 1e3)
    finally:
        stop.set()
        for p in procs:
            p.join(120)
    tick()
    busy = Stat.of(loaded, "ms", p99=True)
    assert busy.p99 is not None
    return Figure(f"idle client while {heavy} run {n}x{n} matmuls", "p99 read round trip (ms)",
                  busy.p99, Goal("<=", 10.0), busy, Stat.of(quiet, "ms", p99=True),
                  "same, no load")  # fmt: skip
