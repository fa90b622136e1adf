"""The training workload: one MLP trained with ``client.nn`` and ``client.optim``
on the remote device and on numpy, in the same run, as steps per second.

Each step is what ``examples/train_mlp.py`` does: gather a batch on the device from uploaded
indices, forward, cross-entropy, backward, Adam, and one read of the loss. Two models:

- the digits MLP of the example (64 -> 128 -> 128 -> 10, batch 64), where one step is well
  under a millisecond of numpy, so the ratio says what a step's messages and op building cost;
  the client's CPU time per step (``time.thread_time`` of the training thread: building,
  encoding and sending the step's ops, reading the loss) is reported next to local numpy's
  whole step, and ``python -m bench.profile`` samples both processes for the rest;
- a wide MLP (512 -> 1024 -> 1024 -> 10, batch 256) whose step costs 15-20 ms of numpy: the
  goal, remote at least 0.9x local, says whether the remote device adds little to real work.

Remote and local rounds are interleaved, so both see the same machine.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

import client
from client import nn, optim
from client.autodiff import Autodiff, Tensor
from client.capture import jit

from ._report import Figure, Goal, Stat

Tick = Callable[[], None]


@dataclass(frozen=True)
class Model:
    name: str
    widths: tuple[int, ...]  # input, hidden..., classes
    batch: int
    goal: Goal | None

    @property
    def title(self) -> str:
        return f"MLP {'-'.join(map(str, self.widths))}, batch {self.batch}, Adam"


DIGITS = Model("digits", (64, 128, 128, 10), 64, None)
WIDE = Model("wide", (512, 1024, 1024, 10), 256, Goal(">=", 0.9))


def mlp(ad: Autodiff, widths: tuple[int, ...]) -> nn.Module:
    rng = np.random.default_rng(0)
    layers: list[nn.Module] = []
    for fan_in, fan_out in zip(widths[:-1], widths[1:], strict=True):
        layers += [nn.Linear(fan_in, fan_out, ad=ad, rng=rng), nn.ReLU()]
    return nn.Sequential(*layers[:-1])


class Trainer:
    """A model, its optimizer and its data on one device; ``run(n)`` trains n steps."""

    def __init__(self, ad: Autodiff, model: Model, samples: int) -> None:
        rng = np.random.default_rng(1)
        self.ad, self.batch = ad, model.batch
        self.x = ad.asarray(rng.standard_normal((samples, model.widths[0]), dtype=np.float32))
        self.y = ad.asarray(rng.integers(0, model.widths[-1], samples))
        self.net = mlp(ad, model.widths)
        self.opt = optim.Adam(self.net.parameters(), lr=1e-3)
        self.order = np.random.default_rng(2)
        self.losses: list[float] = []

    def step(self, index: Tensor) -> Tensor:
        """One training step on the batch ``index`` selects; its loss."""
        ad = self.ad
        loss = nn.cross_entropy(
            self.net(ad.take(self.x, index, axis=0)), ad.take(self.y, index, axis=0)
        )
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        return loss

    def run(self, steps: int) -> None:
        for _ in range(steps):
            index = self.ad.asarray(self.order.integers(0, self.x.shape[0] or 0, self.batch))
            self.losses.append(float(self.step(index)))  # the step's one read


def _timed(trainer: Trainer, steps: int) -> float:
    start = time.perf_counter()
    trainer.run(steps)
    return time.perf_counter() - start


def steps_per_second(
    dev: client.RemoteDevice, model: Model, steps: int, reps: int, tick: Tick
) -> list[Figure]:
    """Remote steps per second over local numpy's, ``reps`` interleaved rounds of ``steps``
    after one warm-up round each; for a model without a goal, also where a remote step's time
    goes."""
    remote = Trainer(Autodiff(client.namespace(dev)), model, 4 * model.batch)
    local = Trainer(Autodiff(np), model, 4 * model.batch)
    remote.run(2)
    local.run(2)
    ours, theirs, client_cpu = [], [], []
    for _ in range(reps):
        thread = time.thread_time()
        ours.append(_timed(remote, steps) / steps)
        client_cpu.append((time.thread_time() - thread) / steps)
        theirs.append(_timed(local, steps) / steps)
        tick()
    np.testing.assert_allclose(remote.losses, local.losses, rtol=1e-5)  # the same training
    step_remote = Stat.of([1 / s for s in ours], "steps/s")
    step_local = Stat.of([1 / s for s in theirs], "steps/s")
    name = f"training: {model.title}"
    figures = [
        Figure(
            name,
            "remote steps/s / local numpy",
            step_remote.median / step_local.median,
            model.goal,
            step_remote,
            step_local,
            "local numpy",
        )
    ]
    if model.goal is None:
        cpu = Stat.of([s * 1e6 for s in client_cpu], "us/step")
        local_step = Stat.of([s * 1e6 for s in theirs], "us/step")
        figures.append(
            Figure(
                name,
                "client CPU, us per step",
                cpu.median,
                None,
                cpu,
                local_step,
                "local numpy's whole step",
            )
        )
    return figures


class ReplayedTrainer(Trainer):
    """The same model and data, its step recorded once (``client.capture.jit``) and run by id
    on the server: one ``run_graph`` op per step beside the batch's indices."""

    def __init__(self, ad: Autodiff, model: Model, samples: int) -> None:
        super().__init__(ad, model, samples)
        self.jitted = jit(super().step)

    def step(self, index: Tensor) -> Tensor:
        result: Tensor = self.jitted(index)
        return result


def _sent(dev: client.RemoteDevice) -> int:
    return int(dev._conn._ws.sent_bytes)  # noqa: SLF001 - the transport's own count


def replayed_steps(url: str, steps: int, reps: int, tick: Tick) -> list[Figure]:
    """The digits MLP's step direct and replayed by id, in interleaved rounds on two sessions
    of one server: steps per second and bytes sent per step, with the losses compared. The
    direct session sends every op (segment replay off): what ``jit`` saves over op by op; the
    training workload measures the default, segments replayed."""
    samples = 1797  # the size of scikit-learn's digits dataset, resident on the server
    with (
        client.RemoteDevice(url, segment_replay=False) as d1,
        client.RemoteDevice(url) as d2,
    ):
        direct = Trainer(Autodiff(client.namespace(d1)), DIGITS, samples)
        replayed = ReplayedTrainer(Autodiff(client.namespace(d2)), DIGITS, samples)
        for trainer in (direct, replayed):
            trainer.run(3)  # warm-up, record, first replay
        times: dict[str, list[float]] = {"direct": [], "replayed": []}
        sent: dict[str, list[float]] = {"direct": [], "replayed": []}
        for _ in range(reps):
            for name, trainer, dev in (("direct", direct, d1), ("replayed", replayed, d2)):
                before = _sent(dev)
                times[name].append(_timed(trainer, steps) / steps)
                sent[name].append((_sent(dev) - before) / steps)
            tick()
        if direct.losses != replayed.losses:
            raise AssertionError("the replayed step trained differently from the direct one")
    name = f"step replay: {DIGITS.title}"
    fast = Stat.of([1 / s for s in times["replayed"]], "steps/s")
    slow = Stat.of([1 / s for s in times["direct"]], "steps/s")
    few = Stat.of(sent["replayed"], "B/step")
    many = Stat.of(sent["direct"], "B/step")
    return [
        Figure(
            name,
            "replayed steps/s / direct",
            fast.median / slow.median,
            Goal(">=", 2.0),
            fast,
            slow,
            "direct",
        ),
        Figure(
            name,
            "direct bytes sent per step / replayed",
            many.median / few.median,
            Goal(">=", 10.0),
            many,
            few,
            "replayed",
        ),
    ]


def replayed_against_local(
    dev: client.RemoteDevice, model: Model, steps: int, reps: int, tick: Tick
) -> Figure:
    """The model's step replayed by id on the server against local numpy's, interleaved
    rounds: what the remote device costs once a step's messages and building are gone."""
    remote = ReplayedTrainer(Autodiff(client.namespace(dev)), model, 4 * model.batch)
    local = Trainer(Autodiff(np), model, 4 * model.batch)
    remote.run(3)  # warm-up, record, first replay
    local.run(3)
    ours, theirs = [], []
    for _ in range(reps):
        ours.append(_timed(remote, steps) / steps)
        theirs.append(_timed(local, steps) / steps)
        tick()
    if remote.losses != local.losses:
        raise AssertionError("the replayed step trained differently from local numpy")
    fast = Stat.of([1 / s for s in ours], "steps/s")
    slow = Stat.of([1 / s for s in theirs], "steps/s")
    return Figure(
        f"step replay: {model.title}",
        "replayed steps/s / local numpy",
        fast.median / slow.median,
        model.goal,
        fast,
        slow,
        "local numpy",
    )
