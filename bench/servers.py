"""Several servers: a tensor moved between two servers directly, through the client,
and the plain TCP ceiling of moving its bytes between two processes, in one rotation; and
data-parallel training (``client.parallel``) of the digits MLP on one server and on two.

Two fresh servers that list each other as peers (``--peers ws://127.0.0.1:*``) hold the
source and the target. ``direct`` is ``x.to_device(target)`` and a ``sync`` of the target: an
expose round trip to the source, the pull op, and the target's fetch from the source, into fresh
memory. ``through the client`` is ``x.numpy()`` then an upload to the target. The ceiling is
plain TCP from this process to the ceiling peer's process, received into a fresh array
(:class:`bench.ceilings.TcpCeiling`): the same bytes between two processes, with nothing else;
and, explanatory, the same into an array the peer reuses (no first-touch page faults, which
the server's allocator settings also avoid for the pulled tensors it frees and makes again).

Data-parallel: the bench's digits MLP (``bench.training.DIGITS``: batch 64, Adam), one
replica per server, each step sharded, its gradients averaged by the ring all-reduce and every
replica stepped; milliseconds a step, the two setups interleaved. On a machine whose cores the
client and both servers share, the second server adds work rather than hardware: the figure
says what the all-reduce and the second replica's ops cost, not a speed-up.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

import client
from client import nn, optim
from client.autodiff import Autodiff
from client.parallel import DataParallel, Replica

from . import _procs
from ._report import Figure, Goal, Stat
from .ceilings import TcpCeiling
from .training import DIGITS, mlp
from .transfer import Contenders, rates, rotated

Tick = Callable[[], None]
PEERS = ("--peers", "ws://127.0.0.1:*", "--allow-any-peer-port")


def between_servers(tcp_port: int, nbytes: int, reps: int, tick: Tick) -> list[Figure]:
    """A float32 tensor of ``nbytes`` moved from one server to another, ``reps`` times each
    way of moving it, in rotation with the TCP ceiling."""
    data = np.random.default_rng(2).random(nbytes // 4, dtype=np.float32)
    ceiling = TcpCeiling(tcp_port)
    with (
        _procs.server(*PEERS) as (source_url, _),
        _procs.server(*PEERS) as (target_url, _),
        client.RemoteDevice(source_url) as source,
        client.RemoteDevice(target_url) as target,
    ):
        x = client.namespace(source).asarray(data)
        xp = client.namespace(target)
        contenders: Contenders = {
            "direct": lambda: (_timed_move(lambda: x.to_device(target), target),),
            "client": lambda: (_timed_move(lambda: xp.asarray(x.numpy()), target),),
            "tcp": lambda: (ceiling.upload(data),),
            "reused": lambda: (ceiling.upload(data, reused=True),),
        }
        for name in ("direct", "client"):  # the first pull opens the peers' session: untimed
            contenders[name]()
        try:
            times = rotated(contenders, reps, 1, tick)
        finally:
            ceiling.close()
    direct, through, tcp, reused = rates(
        nbytes, *(times[k][0] for k in ("direct", "client", "tcp", "reused"))
    )
    size = f"{nbytes >> 20} MiB float32 from one server to another"
    return [
        Figure(
            size,
            "direct / plain TCP between two processes",
            direct.median / tcp.median,
            Goal(">=", 0.8),
            direct,
            tcp,
            "TCP loopback",
        ),
        Figure(
            size,
            "direct / TCP into a reused array",
            direct.median / reused.median,
            None,
            direct,
            reused,
            "TCP into a reused array",
        ),
        Figure(
            size,
            "direct / through the client",
            direct.median / through.median,
            None,
            direct,
            through,
            "through the client",
        ),
    ]


def _timed_move(move: Callable[[], client.RemoteArray], target: client.RemoteDevice) -> float:
    start = time.perf_counter()
    moved = move()
    target.sync()
    seconds = time.perf_counter() - start
    del moved
    target.sync()  # the free travels: the next repetition starts from the same server
    return seconds


def data_parallel(steps: int, reps: int, tick: Tick) -> list[Figure]:
    """Milliseconds a data-parallel step on two servers against one, ``reps`` interleaved
    rounds of ``steps`` steps each."""
    with (
        _procs.server(*PEERS) as (first_url, _),
        _procs.server(*PEERS) as (second_url, _),
        client.RemoteDevice(first_url) as first,
        client.RemoteDevice(second_url) as second,
    ):
        one, two = _Parallel([first]), _Parallel([first, second])
        one.seconds_per_step(1), two.seconds_per_step(1)  # warm: first ops, the peers' session
        times: dict[str, list[float]] = {"one": [], "two": []}
        for rep in range(reps):
            for name, run in sorted({"one": one, "two": two}.items(), reverse=rep % 2 == 1):
                times[name].append(run.seconds_per_step(steps))
            tick()
    ms_two, ms_one = (Stat.of([t * 1e3 for t in times[k]], "ms") for k in ("two", "one"))
    title = f"data-parallel {DIGITS.title}, one replica per server"
    return [
        Figure(
            title,
            "ms a step: 2 servers / 1 server",
            ms_two.median / ms_one.median,
            None,
            ms_two,
            ms_one,
            "1 server",
        )
    ]


class _Parallel:
    """The digits MLP replicated on ``devices``, with random data on each (uploaded once)."""

    def __init__(self, devices: list[client.RemoteDevice]) -> None:
        rng = np.random.default_rng(1)
        widths, samples = DIGITS.widths, 4 * DIGITS.batch
        x = rng.standard_normal((samples, widths[0]), dtype=np.float32)
        y = rng.integers(0, widths[-1], samples)
        spaces = [Autodiff(client.namespace(dev)) for dev in devices]
        self.data = [(ad.asarray(x), ad.asarray(y)) for ad in spaces]
        model = mlp(spaces[0], widths)
        self.dp = DataParallel(
            model, spaces, lambda ad: mlp(ad, widths), lambda params: optim.Adam(params, lr=1e-3)
        )
        self.order = np.random.default_rng(2)
        self.samples = samples

    def _loss(self, replica: Replica, rows: np.ndarray) -> Any:
        ad = replica.namespace
        x, y = self.data[replica.index]
        index = ad.asarray(rows)
        return nn.cross_entropy(replica.model(ad.take(x, index, axis=0)), ad.take(y, index, axis=0))

    def seconds_per_step(self, steps: int) -> float:
        losses: list[Any] = []
        start = time.perf_counter()
        for _ in range(steps):
            losses = self.dp.step(self._loss, self.order.choice(self.samples, DIGITS.batch))
        [float(loss) for loss in losses]  # every replica's last step has run
        return (time.perf_counter() - start) / steps
