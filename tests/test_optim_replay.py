"""The learning rate on the device (client.optim): schedules under ``client.capture.jit``, on
a real server. A jitted step is recorded once and replayed by id; its update ops read the
group's learning-rate arrays, which a schedule writes in place between steps, so the replayed
run must equal the direct one bit for bit while the rate changes every step."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

import client
from client import nn, optim
from client.autodiff import Autodiff, Tensor
from client.capture import jit

from .classifying import classifier_step

STEPS = 12


class Run:
    """A small classifier, its data on the device, an optimizer and a way to change the
    rate between steps; the same seeds in every instance."""

    def __init__(self, ad: Autodiff, kind: str) -> None:
        rng = np.random.default_rng(11)
        self.ad = ad
        self.x = ad.asarray(rng.standard_normal((48, 10)).astype(np.float32))
        self.y = ad.asarray(rng.integers(0, 4, 48))
        init = np.random.default_rng(2)
        self.net = nn.Sequential(
            nn.Linear(10, 20, ad=ad, rng=init), nn.Tanh(), nn.Linear(20, 4, ad=ad, rng=init)
        )
        params = list(self.net.parameters())
        self.opt: optim.Optimizer
        self.change: Callable[[int], None]
        if kind == "adamw-cosine":
            self.opt = optim.AdamW(params, lr=2e-2, weight_decay=0.1)
            self.change = _stepper(optim.CosineAnnealingLR(self.opt, T_max=8, eta_min=1e-3))
        elif kind == "sgd-momentum-steplr":
            self.opt = optim.SGD(params, lr=0.2, momentum=0.9)
            self.change = _stepper(optim.StepLR(self.opt, step_size=3, gamma=0.5))
        else:  # two groups, each rate set by hand (0.0 among them)
            self.opt = optim.Adam(
                [{"params": params[:2]}, {"params": params[2:], "lr": 5e-3}], lr=1e-2
            )
            self.change = self._by_hand
        self.order = np.random.default_rng(6)

    def _by_hand(self, step: int) -> None:
        self.opt.set_lr(0.0 if step % 4 == 3 else 1e-2 / (step + 1), group_index=0)
        self.opt.set_lr(5e-3 * (step % 3), group_index=1)

    def step(self, index: Tensor) -> Tensor:
        return classifier_step(self.ad, self.net, self.opt, self.x, self.y, index)

    def train(self, step: Callable[[Tensor], Tensor]) -> tuple[list[float], list[list[float]]]:
        """``STEPS`` steps, the rate changed after each, outside ``step``; the losses and
        the rates each step ran with."""
        losses, rates = [], []
        for n in range(STEPS):
            rates.append([float(g["lr"]) for g in self.opt.param_groups])
            losses.append(float(step(self.ad.asarray(self.order.integers(0, 48, 16)))))
            self.change(n)
        return losses, rates

    def weights(self) -> list[np.ndarray]:
        return [np.asarray(p.array) for p in self.net.parameters()]


def _stepper(schedule: optim.LRScheduler) -> Callable[[int], None]:
    return lambda _: schedule.step()


@pytest.mark.parametrize("kind", ["adamw-cosine", "sgd-momentum-steplr", "adam-set-lr"])
def test_a_jitted_step_follows_the_schedule_exactly_as_the_direct_one(url: str, kind: str) -> None:
    with client.RemoteDevice(url) as d1, client.RemoteDevice(url) as d2:
        direct = Run(Autodiff(client.namespace(d1)), kind)
        replayed = Run(Autodiff(client.namespace(d2)), kind)
        step = jit(replayed.step)
        direct_losses, rates = direct.train(direct.step)
        replayed_losses, replayed_rates = replayed.train(step)
        assert replayed_rates == rates
        assert len({tuple(r) for r in rates}) >= STEPS // 3  # the rate did change, often
        assert replayed_losses == direct_losses
        for a, b in zip(direct.weights(), replayed.weights(), strict=True):
            np.testing.assert_array_equal(a, b)
        assert step.recorded == 1 and step.calls == STEPS  # one graph for every rate


@pytest.fixture
def counted(dev: client.RemoteDevice, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Any]]:
    """The kinds of the ops the device is sent (an upload as "upload")."""
    kinds: list[Any] = []
    submit, submit_upload = dev.submit, dev.submit_upload

    def counting(op: Any) -> None:
        kinds.append(op.kind)
        submit(op)

    def counting_upload(make_op: Callable[[int], Any], data: memoryview) -> None:
        kinds.append("upload")
        submit_upload(make_op, data)

    monkeypatch.setattr(dev, "submit", counting)
    monkeypatch.setattr(dev, "submit_upload", counting_upload)
    yield kinds


def _float32_params(ad: Autodiff, n: int) -> list[Tensor]:
    rng = np.random.default_rng(1)
    return [
        ad.asarray(rng.standard_normal((3, 4)).astype(np.float32), requires_grad=True)
        for _ in range(n)
    ]


def test_the_rate_arrays_are_made_at_the_first_step_and_written_in_place(
    xp: client.Namespace, counted: list[Any]
) -> None:
    ad = Autodiff(xp)
    params = _float32_params(ad, 3)
    grads = [ad.asarray(np.full((3, 4), 0.5, np.float32)) for _ in params]
    counted.clear()
    opt = optim.SGD(params, lr=0.1)
    schedule = optim.StepLR(opt, step_size=2, gamma=0.3)
    assert counted == []  # nothing is made before a step needs it
    for p, g in zip(params, grads, strict=True):
        p.grad = g
    opt.step()
    assert counted.count("full") == 1  # one rate array: one device, one dtype
    lr = opt.lr_array(opt.param_groups[0], xp, params[0].array)
    assert lr.dtype == xp.float32 and lr.shape == ()
    counted.clear()
    schedule.step()  # epoch 1: the same rate
    assert counted == []
    schedule.step()  # epoch 2: 0.1 * 0.3
    assert len(counted) == 2  # a full and a setitem: written in place
    assert opt.lr_array(opt.param_groups[0], xp, params[0].array) is lr
    assert lr.numpy() == np.float32(0.1 * 0.3)  # what numpy casts the float to
    counted.clear()
    opt.step()
    assert len(counted) == 3 * 2  # the step's ops: none for the rate


def test_a_rate_assigned_or_set_is_used_exactly_zero_included(xp: client.Namespace) -> None:
    """The arrays hold the float as numpy casts it beside the parameter: the update equals
    the float's, bit for bit, for a rate float32 cannot hold and for 0.0 (no move at all)."""
    ad = Autodiff(xp)
    (p,) = _float32_params(ad, 1)
    g = np.random.default_rng(2).standard_normal((3, 4)).astype(np.float32)
    opt = optim.SGD([p], lr=0.1)
    expected = np.asarray(p.array)
    for assign in (0.1, 1 / 3, 0.0, 0.7):
        if assign == 0.0:
            opt.set_lr(assign)
        else:
            opt.param_groups[0]["lr"] = assign  # written by the next step()
        p.grad = ad.asarray(g)
        opt.step()
        expected = expected - assign * g
        np.testing.assert_array_equal(np.asarray(p.array), expected)
    assert opt.lr_array(opt.param_groups[0], xp, p.array).numpy() == np.float32(0.7)


def test_bad_rates_and_groups_are_refused_and_nothing_is_written(
    xp: client.Namespace, counted: list[Any]
) -> None:
    ad = Autodiff(xp)
    p, q = _float32_params(ad, 2)
    opt = optim.Adam([{"params": [p]}, {"params": [q]}], lr=0.1)
    p.grad, q.grad = ad.asarray(np.ones((3, 4), np.float32)), None
    opt.step()
    counted.clear()
    for bad, error in (
        (-1.0, ValueError),
        (float("nan"), ValueError),
        ("0.1", TypeError),
        (True, TypeError),
    ):
        with pytest.raises(error, match="learning rate|lr"):
            opt.set_lr(bad)  # type: ignore[arg-type]
    with pytest.raises(IndexError, match="2 parameter groups"):
        opt.set_lr(0.5, group_index=2)
    assert counted == [] and [g["lr"] for g in opt.param_groups] == [0.1, 0.1]
    opt.param_groups[0]["lr"], opt.param_groups[1]["lr"] = 0.5, -0.5
    with pytest.raises(ValueError, match="invalid lr"):
        opt.step()
    assert counted == []  # every group's rate checked before any op
    opt.param_groups[1]["lr"] = 0.5
    before = p.array.numpy()
    opt.step()  # and the optimizer goes on
    assert not np.array_equal(p.array.numpy(), before)


def test_a_model_moved_off_a_server_leaves_its_rate_arrays_behind(url: str) -> None:
    """After ``Module.to``, a new rate is written where the parameters are, not into arrays
    on the device they left (closed here): it would fail there."""
    model = nn.Linear(3, 2, rng=np.random.default_rng(0))
    twin = nn.Linear(3, 2, rng=np.random.default_rng(0))
    opt, twin_opt = optim.SGD(model.parameters(), 0.1), optim.SGD(twin.parameters(), 0.1)
    schedules = [optim.CosineAnnealingLR(o, T_max=4) for o in (opt, twin_opt)]
    x, y = np.ones((4, 3), np.float32), np.zeros((4, 2), np.float32)

    def train(model: nn.Module, opt: optim.Optimizer, schedule: optim.LRScheduler) -> None:
        for _ in range(2):
            opt.zero_grad()
            nn.mse_loss(model(x), y).backward()
            opt.step()
            schedule.step()

    with client.RemoteDevice(url) as dev:
        model.to(Autodiff(client.namespace(dev)))
        train(model, opt, schedules[0])
        model.to(Autodiff(np))
    train(twin, twin_opt, schedules[1])
    train(model, opt, schedules[0])  # the device is closed: nothing may go to it
    train(twin, twin_opt, schedules[1])
    for name, array in model.state_dict().items():
        np.testing.assert_array_equal(np.asarray(array), twin.state_dict()[name])
