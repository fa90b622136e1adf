"""Compute workloads: pipelined elementwise ops, a matmul chain, many clients at once.

References: the same chain in local numpy, and one client alone on the same server.
Extra clients are separate processes (``spawn``), as real clients would be.
"""

from __future__ import annotations

import multiprocessing as mp
import time
from collections.abc import Callable
from multiprocessing.synchronize import Barrier, Event
from typing import Any

import numpy as np

import client

from ._report import Figure, Goal, Stat

Tick = Callable[[], None]
ALONE_ROUNDS = 3  # rounds of one client alone per round of many clients


def _chain_remote(xp: client.Namespace, ops: int, scalar: bool = False) -> float:
    """Seconds for ``ops`` pipelined adds on 16-element tensors (``x + a``, or ``x + 1.0`` if
    ``scalar``), then one read."""
    a = xp.asarray(np.ones(16, dtype=np.float32))
    other: client.RemoteArray | float = 1.0 if scalar else a
    x = a
    start = time.perf_counter()
    for _ in range(ops):
        x = x + other
    x.numpy()
    return time.perf_counter() - start


def _chain_local(ops: int, scalar: bool = False) -> float:
    a = np.ones(16, dtype=np.float32)
    other: np.ndarray[Any, Any] | float = 1.0 if scalar else a
    x = a
    start = time.perf_counter()
    for _ in range(ops):
        x = x + other
    return time.perf_counter() - start


def pipelined(dev: client.RemoteDevice, ops: int, reps: int, tick: Tick) -> list[Figure]:
    """Ops per second of the pipelined chain, with an array operand and with a Python scalar,
    alternated; local numpy's rate for each is the reference."""
    xp = client.namespace(dev)
    figures: list[Figure] = []
    rates: dict[bool, tuple[list[float], list[float]]] = {False: ([], []), True: ([], [])}
    for scalar in (False, True):
        _chain_remote(xp, min(ops, 2000), scalar)  # warm up
    for _ in range(reps):
        for scalar, (ours, local) in rates.items():
            ours.append(ops / _chain_remote(xp, ops, scalar))
            local.append(ops / _chain_local(ops, scalar))
        tick()
    for scalar, (ours, local) in rates.items():
        rate = Stat.of(ours, "ops/s")
        what = "x = x + 1.0" if scalar else "x = x + a"
        figures.append(
            Figure(
                f"{ops} pipelined adds ({what}), 16 elements, then a read",
                "ops per second",
                rate.median,
                Goal(">=", 100_000),
                rate,
                Stat.of(local, "ops/s"),
                "local numpy",
            )
        )
    return figures


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
    return Figure(
        name,
        "remote time / local numpy",
        remote.median / ref.median,
        Goal("<=", 1.1),
        remote,
        ref,
        "local numpy",
    )


def _client_worker(url: str, ops: int, reps: int, go: Barrier, results: mp.Queue) -> None:  # type: ignore[type-arg]
    with client.RemoteDevice(url) as dev:
        xp = client.namespace(dev)
        _chain_remote(xp, min(ops, 500))
        results.put(None)  # warmed up
        for _ in range(reps):
            go.wait()  # with the others of its group and the parent, which starts the round
            start = time.monotonic()
            _chain_remote(xp, ops)
            results.put((start, time.monotonic()))


class _Group:
    """``size`` client processes that run the chain at once, one round at a time."""

    def __init__(self, url: str, size: int, ops: int, reps: int) -> None:
        ctx = mp.get_context("spawn")
        self.size, self.ops = size, ops
        self.go, self.results = ctx.Barrier(size + 1), ctx.Queue()
        self.procs = [
            ctx.Process(target=_client_worker, args=(url, ops, reps, self.go, self.results))
            for _ in range(size)
        ]
        for p in self.procs:
            p.start()

    def ready(self) -> None:
        """Wait until every client has connected and warmed up (no round may overlap another
        group's start-up, which loads the CPUs for seconds)."""
        for _ in range(self.size):
            self.results.get(timeout=600)

    def round(self) -> float:
        """Total ops/s of one round: every client's ops over the span from the first start to
        the last end."""
        self.go.wait(timeout=600)
        spans: list[tuple[float, float]] = [self.results.get(timeout=600) for _ in range(self.size)]
        elapsed = max(end for _, end in spans) - min(start for start, _ in spans)
        return self.size * self.ops / elapsed

    def close(self) -> None:
        for p in self.procs:
            p.join(60)
            if p.is_alive():
                p.kill()


def many_clients(url: str, clients: int, ops: int, reps: int, tick: Tick) -> Figure:
    """Total throughput of ``clients`` pipelining at once over one client's alone. Rounds of
    one client and of all of them alternate, so that a change of load on the machine hits
    both alike; one client's rounds are short (and vary more), so there are
    :data:`ALONE_ROUNDS` of them to each round of all."""
    one = _Group(url, 1, ops, ALONE_ROUNDS * reps)
    many = _Group(url, clients, ops, reps)
    alone: list[float] = []
    together: list[float] = []
    try:
        one.ready()
        many.ready()
        for _ in range(reps):
            alone += [one.round() for _ in range(ALONE_ROUNDS)]
            tick()
            together.append(many.round())
            tick()
    finally:
        one.close()
        many.close()
    rate, ref = Stat.of(together, "ops/s"), Stat.of(alone, "ops/s")
    return Figure(
        f"{clients} clients pipelining at once",
        "total throughput / one client's",
        rate.median / ref.median,
        Goal(">=", 0.8),
        rate,
        ref,
        "one client",
    )


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
    return Figure(
        f"idle client while {heavy} run {n}x{n} matmuls",
        "p99 read round trip (ms)",
        busy.p99,
        Goal("<=", 10.0),
        busy,
        Stat.of(quiet, "ms", p99=True),
        "same, no load",
    )
