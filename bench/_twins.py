"""A training client of the fault soak (``bench/faults.py``) and its uncut twin, in one process.

The client trains through its own :class:`~bench.cutting_proxy.CuttingProxy`, which resets its
connection every few seconds; the twin trains on a direct connection to the same server at the
same time, under the same load. Both run the same rounds: round ``r`` trains a fresh small MLP
with Adam for :data:`STEPS` steps from seeds that depend only on the client and ``r``, and
ends with each step's loss and the parameters. The two must agree bit for bit, round by round.
Each step's read (``float(loss)``) is timed: the read latency with cuts and without.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import client
from client import nn, optim
from client.autodiff import Autodiff

from .cutting_proxy import CuttingProxy, address

STEPS = 25  # steps per round
CUT_EVERY = (2.0, 5.0)  # seconds between the proxy's cuts of every connection


@dataclass
class Run:
    """What one side (the cut client or its twin) did: its rounds, its reads' seconds and
    the calls that raised (none is expected: the session resumes by itself)."""

    rounds: list[tuple[list[float], list[np.ndarray]]] = field(default_factory=list)
    reads: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)


def train_round(dev: client.RemoteDevice, seed: int, reads: list[float]) -> Any:
    """Round ``seed``: a fresh MLP trained for :data:`STEPS` steps; its losses and parameters."""
    ad = Autodiff(client.namespace(dev))
    rng = np.random.default_rng(seed)
    x = ad.asarray(rng.standard_normal((256, 16)).astype(np.float32))
    y = ad.asarray(rng.integers(0, 4, 256))
    net = nn.Sequential(
        nn.Linear(16, 32, ad=ad, rng=rng), nn.ReLU(), nn.Linear(32, 4, ad=ad, rng=rng)
    )
    opt = optim.Adam(net.parameters(), lr=1e-2)
    losses = []
    for _ in range(STEPS):
        index = ad.asarray(rng.integers(0, 256, 32))
        loss = nn.cross_entropy(net(ad.take(x, index, axis=0)), ad.take(y, index))
        opt.zero_grad()
        loss.backward()
        opt.step()
        start = time.perf_counter()
        losses.append(float(loss))
        reads.append(time.perf_counter() - start)
    return losses, [np.asarray(p.array) for p in net.parameters()]


def _train(url: str, first_seed: int, deadline: float, run: Run) -> None:
    """Rounds on ``url`` until ``deadline``; a session that fails is recorded and opened
    again, so that the soak goes on."""
    while time.time() < deadline:
        try:
            with client.RemoteDevice(url) as dev:
                while time.time() < deadline:
                    seed = first_seed + len(run.rounds)
                    run.rounds.append(train_round(dev, seed, run.reads))
        except (client.TensorwireError, ConnectionError) as exc:
            run.failures.append(f"round {len(run.rounds)}: {type(exc).__name__}: {exc}")
            time.sleep(0.5)


def _same(a: Any, b: Any) -> bool:
    return bool(a[0] == b[0] and all(np.array_equal(p, q) for p, q in zip(a[1], b[1], strict=True)))


def client_process(index: int, url: str, deadline: float, queue: Any) -> None:
    """Client ``index`` and its twin until ``deadline`` (then the proxy stops cutting, so the
    last round ends); puts its figures on ``queue``."""
    cut, twin = Run(), Run()
    with CuttingProxy(address(url), every=CUT_EVERY, seed=index) as proxy:
        stop = threading.Timer(max(0.0, deadline - time.time()), setattr, (proxy, "cutting", False))
        stop.start()
        seed = 1_000_003 * (index + 1)
        threads = [
            threading.Thread(target=_train, args=(proxy.url(), seed, deadline, cut)),
            threading.Thread(target=_train, args=(url, seed, deadline, twin)),
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        stop.cancel()
    compared = min(len(cut.rounds), len(twin.rounds))
    differ = [r for r in range(compared) if not _same(cut.rounds[r], twin.rounds[r])]
    queue.put(
        {
            "index": index,
            "rounds_compared": compared,
            "rounds_differing": differ,
            "cuts": proxy.cuts,
            "connections": proxy.connections,
            "failures": cut.failures[:5],
            "failed_calls": len(cut.failures),
            "twin_failures": twin.failures[:5],
            "twin_failed_calls": len(twin.failures),
            "reads_cut": cut.reads,
            "reads_uncut": twin.reads,
        }
    )
