"""Work through a proxy that cuts the connection (issue 33): ordinary client code, with no
retry of its own, ends with exactly the numbers of an uncut run. The proxy
(``bench/cutting_proxy.py``) resets each connection after a seeded number of bytes, both
directions counted, so cuts land mid-frame, mid-upload and mid-reply; or on a timer. Each test
also checks that the proxy really cut.

The uncut run is the same code from the same seeds on a direct connection to the same server,
or numpy where the server's result is numpy's bit for bit."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest

import client
from bench.cutting_proxy import CuttingProxy, address
from client import nn, optim
from client.autodiff import Autodiff, Tensor
from client.capture import Capture, jit

from .classifying import classifier_step
from .servers import ServerProcess, run_server

pytestmark = pytest.mark.wire  # the client's websocket, resumed, on both ends of the range

MIB = 1 << 20
STEPS = 30
LOOPBACK_PEERS = ("--peers", "ws://127.0.0.1:*", "--allow-any-peer-port")


@contextmanager
def _through(
    server: ServerProcess, liveness: dict[str, float] | None = None, **policy: Any
) -> Iterator[tuple[client.RemoteDevice, CuttingProxy]]:
    """A device of ``server`` (with the ``liveness`` bounds given) through a cutting proxy with
    ``policy``, and the proxy."""
    with CuttingProxy(address(server.url), **policy) as proxy:
        with client.RemoteDevice(proxy.url(), **(liveness or {})) as dev:  # type: ignore[arg-type]
            yield dev, proxy


class Classifier:
    """A small MLP classifier trained with Adam, its data resident on the device."""

    def __init__(self, dev: client.RemoteDevice) -> None:
        ad = self.ad = Autodiff(client.namespace(dev))
        rng = np.random.default_rng(5)
        self.x = ad.asarray(rng.standard_normal((256, 16)).astype(np.float32))
        self.y = ad.asarray(rng.integers(0, 4, 256))
        init = np.random.default_rng(0)
        self.net = nn.Sequential(
            nn.Linear(16, 32, ad=ad, rng=init), nn.ReLU(), nn.Linear(32, 4, ad=ad, rng=init)
        )
        self.opt = optim.Adam(self.net.parameters(), lr=1e-2)
        self.order = np.random.default_rng(3)

    def step(self, index: Tensor) -> Tensor:
        return classifier_step(self.ad, self.net, self.opt, self.x, self.y, index)

    def train(self, step: Callable[[Tensor], Tensor]) -> tuple[list[float], list[np.ndarray]]:
        """``STEPS`` steps: each step's loss, then the parameters."""
        losses = [
            float(step(self.ad.asarray(self.order.integers(0, 256, 32)))) for _ in range(STEPS)
        ]
        return losses, [np.asarray(p.array) for p in self.net.parameters()]


def _same(a: tuple[list[float], list[np.ndarray]], b: tuple[list[float], list[np.ndarray]]) -> bool:
    return a[0] == b[0] and all(np.array_equal(x, y) for x, y in zip(a[1], b[1], strict=True))


POLICIES: dict[str, dict[str, Any]] = {
    "bytes": {"after_bytes": (20_000, 100_000), "max_cuts": 40},
    "timer": {"every": (0.03, 0.1), "max_cuts": 20},
}


@pytest.mark.parametrize("policy", list(POLICIES))
def test_a_training_run_survives_cuts(server: ServerProcess, policy: str) -> None:
    with client.RemoteDevice(server.url) as direct:
        model = Classifier(direct)
        uncut = model.train(model.step)
    with _through(server, seed=1, **POLICIES[policy]) as (dev, proxy):
        model = Classifier(dev)
        cut = model.train(model.step)
    assert proxy.cuts > 0
    assert _same(cut, uncut)


def test_a_training_run_survives_a_path_gone_silent(server: ServerProcess) -> None:
    """A blackhole: the proxy stops forwarding and keeps both sockets open. The client's
    liveness bounds find the silence, and the session resumes on a new connection."""
    with client.RemoteDevice(server.url) as direct:
        model = Classifier(direct)
        uncut = model.train(model.step)
    liveness = {"ping_interval": 0.1, "ping_timeout": 0.5}
    # budgets within what a run sends once its steps are replayed segments (a few KB a step)
    policy: dict[str, Any] = {"after_bytes": (2_000, 10_000), "max_cuts": 3, "mode": "blackhole"}
    with _through(server, liveness, seed=9, **policy) as (dev, proxy):
        model = Classifier(dev)
        cut = model.train(model.step)
    assert proxy.cuts == 3
    assert _same(cut, uncut)


def test_a_jitted_run_survives_cuts(server: ServerProcess) -> None:
    with client.RemoteDevice(server.url) as direct:
        model = Classifier(direct)
        uncut = model.train(jit(model.step))
    with _through(server, seed=2, after_bytes=(5_000, 40_000), max_cuts=40) as (dev, proxy):
        model = Classifier(dev)
        cut = model.train(jit(model.step))
    assert proxy.cuts > 0
    assert _same(cut, uncut)


def test_a_64_mib_upload_and_its_read_survive_cuts(server: ServerProcess) -> None:
    """Budgets from 1 to 100 MiB: most connections are cut inside the upload or the read."""
    values = np.random.default_rng(6).standard_normal(8 * MIB)  # 64 MiB of float64
    with _through(server, seed=3, after_bytes=(MIB, 100 * MIB), max_cuts=12) as (dev, proxy):
        xp = client.namespace(dev)
        x = xp.asarray(values)
        back = x.numpy()
        cuts_by_then = proxy.cuts
        total = float(xp.sum(x))
    assert cuts_by_then > 0
    assert np.array_equal(back, values)
    assert total == float(np.sum(values))


def test_pipelined_in_place_adds_are_applied_exactly_once(server: ServerProcess) -> None:
    """Thousands of ``x += 1.0`` with no read between: a resent op applied twice, or one lost,
    would show in the sum."""
    with _through(server, seed=4, after_bytes=(2_000, 30_000), max_cuts=40) as (dev, proxy):
        xp = client.namespace(dev)
        x = xp.zeros(1000)
        for _ in range(5000):
            x += 1.0
        got = x.numpy()
    assert proxy.cuts > 0
    assert np.array_equal(got, np.full(1000, 5000.0))


def test_a_graph_registration_and_its_runs_survive_cuts(server: ServerProcess) -> None:
    """The graph carries a 256 KiB constant, so its registration is cut too."""
    rng = np.random.default_rng(8)
    w = rng.standard_normal((512, 64))
    inputs = [rng.standard_normal((8, 512)) for _ in range(20)]
    policy: dict[str, Any] = {"after_bytes": (16_000, 400_000), "max_cuts": 30}
    with _through(server, seed=5, **policy) as (dev, proxy):
        xp = client.namespace(dev)
        example = xp.asarray(inputs[0])
        with Capture(dev) as cap:  # w, made inside, is the graph's constant
            cap.output("y", xp.tanh(cap.input("x", example) @ xp.asarray(w)))
        registered = cap.graph.register(dev)
        got = [registered.run({"x": x})["y"].numpy() for x in inputs]
    assert proxy.cuts > 0
    assert all(np.array_equal(y, np.tanh(x @ w)) for x, y in zip(inputs, got, strict=True))


@pytest.fixture(scope="module")
def source() -> Iterator[ServerProcess]:
    with run_server(*LOOPBACK_PEERS) as proc:
        yield proc


@pytest.fixture(scope="module")
def target() -> Iterator[ServerProcess]:
    with run_server(*LOOPBACK_PEERS) as proc:
        yield proc


def test_server_to_server_transfers_survive_cuts(
    source: ServerProcess, target: ServerProcess
) -> None:
    """The target pulls from the source through the source's proxy (the URL the client knows
    the source by), so the pulls are cut as well as both client sessions."""
    n = MIB // 2  # 4 MiB of float64 per transfer
    policy: dict[str, Any] = {"after_bytes": (64_000, 12 * MIB), "max_cuts": 10}
    with (
        _through(source, seed=6, **policy) as (a, to_source),
        _through(target, seed=7, **policy) as (b, to_target),
    ):
        xp = client.namespace(a)
        got = [(xp.arange(n, dtype=xp.float64) * k + 1.0).to_device(b).numpy() for k in range(6)]
    assert to_source.cuts > 0 and to_target.cuts > 0
    base = np.arange(n, dtype=np.float64)
    assert all(np.array_equal(y, base * k + 1.0) for k, y in enumerate(got))


@pytest.mark.asyncio
async def test_an_async_device_survives_cuts(server: ServerProcess) -> None:
    """Reads awaited from asyncio, the ops between them pipelined, through cuts."""
    policy: dict[str, Any] = {"after_bytes": (4_000, 40_000), "max_cuts": 30}
    with CuttingProxy(address(server.url), seed=8, **policy) as proxy:
        async with await client.AsyncRemoteDevice.connect(proxy.url()) as dev:
            xp = client.namespace(dev)
            x = xp.zeros(64)
            got = []
            for _ in range(200):
                for _ in range(10):
                    x += 1.0
                got.append(float((await dev.read(x))[0]))
    assert proxy.cuts > 0
    assert got == [10.0 * (i + 1) for i in range(200)]
