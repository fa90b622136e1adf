"""A server killed mid-run (issue 33): the session cannot come back, so the training loop fails
with one typed error, :class:`client.SessionLost` (a :class:`client.ConnectionLost`), that says
why, within the client's reconnect bounds; every later call fails at once with it too.

Killed and gone, the client finds nothing listening: ``unreachable``. Killed and replaced by a
new server at the same address (the proxy in front turns to it), the client finds a server of
another ``server_id``: ``server_restarted``."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import numpy as np
import pytest

import client
from bench.cutting_proxy import CuttingProxy, address
from client import nn, optim
from client.autodiff import Autodiff

from .servers import ServerProcess, run_server

pytestmark = [pytest.mark.server, pytest.mark.serial]
RECONNECT_S = 3.0  # the clients' reconnect_timeout here
MARGIN_S = 1.5  # for a loaded machine


@pytest.fixture
def doomed() -> Iterator[ServerProcess]:
    with run_server() as proc:
        yield proc


@pytest.fixture
def servers() -> Iterator[tuple[ServerProcess, ServerProcess]]:
    with run_server() as first, run_server() as second:
        yield first, second


def _train_until_lost(
    dev: client.RemoteDevice, kill: Callable[[], None]
) -> tuple[client.SessionLost, float]:
    """Train a small MLP on ``dev``; ``kill`` runs from another thread after a few steps.
    The error that ended training, and the seconds from the kill to it."""
    ad = Autodiff(client.namespace(dev))
    rng = np.random.default_rng(5)
    x, y = ad.asarray(rng.standard_normal((64, 8))), ad.asarray(rng.integers(0, 3, 64))
    net = nn.Sequential(
        nn.Linear(8, 16, ad=ad, rng=rng), nn.ReLU(), nn.Linear(16, 3, ad=ad, rng=rng)
    )
    opt = optim.SGD(net.parameters(), lr=0.1)
    killed_at: list[float] = []
    steps = 0

    def killer() -> None:
        killed_at.append(time.monotonic())
        kill()

    with pytest.raises(client.SessionLost) as lost:
        while True:
            loss = nn.cross_entropy(net(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            float(loss)
            steps += 1
            if steps == 5:
                threading.Thread(target=killer).start()
    assert killed_at, "lost before the server was killed"
    return lost.value, time.monotonic() - killed_at[0]


def _fails_at_once_later(dev: client.RemoteDevice, reason: str) -> None:
    start = time.monotonic()
    with pytest.raises(client.SessionLost) as again:
        client.namespace(dev).ones(3).numpy()
    assert again.value.reason == reason
    assert time.monotonic() - start < 1.0


def test_a_server_killed_for_good_ends_the_session_as_unreachable(doomed: ServerProcess) -> None:
    with client.RemoteDevice(doomed.url, reconnect_timeout=RECONNECT_S) as dev:
        error, took = _train_until_lost(dev, doomed.kill)
        assert isinstance(error, client.ConnectionLost)
        assert error.reason == "unreachable"
        assert RECONNECT_S / 2 < took < RECONNECT_S + MARGIN_S  # it tried, within its bound
        _fails_at_once_later(dev, "unreachable")


def test_a_server_killed_and_replaced_ends_the_session_as_restarted(
    servers: tuple[ServerProcess, ServerProcess],
) -> None:
    first, second = servers
    with (
        CuttingProxy(address(first.url)) as proxy,
        client.RemoteDevice(proxy.url(), reconnect_timeout=RECONNECT_S) as dev,
    ):

        def replace() -> None:
            first.kill()
            proxy.target = address(second.url)  # the same address now reaches another server

        error, took = _train_until_lost(dev, replace)
        assert isinstance(error, client.ConnectionLost)
        assert error.reason == "server_restarted"
        assert took < MARGIN_S  # the first attempt reaches the new server, which says so
        _fails_at_once_later(dev, "server_restarted")
