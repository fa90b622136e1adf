"""client.optim: each optimizer against a plain numpy re-implementation of PyTorch's update
rules written here, on a real server; the schedules against their closed forms."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import pytest

import client
from client import nn, optim
from client.autodiff import Autodiff, Tensor
from protocol.graphs import renumber

STEPS = 4


@pytest.fixture
def ad(xp: client.Namespace) -> Autodiff:
    return Autodiff(xp)


def values(t: Any) -> np.ndarray:
    return np.asarray(t.array if isinstance(t, Tensor) else t)


def gradients(shape: tuple[int, ...], seed: int = 0) -> list[np.ndarray]:
    """One gradient per step, fixed, so the optimizer is tested apart from backward()."""
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape) for _ in range(STEPS)]


def run(
    ad: Autodiff,
    make: Callable[[list[Tensor]], optim.Optimizer],
    p0: np.ndarray,
) -> tuple[np.ndarray, optim.Optimizer, Tensor]:
    """``STEPS`` steps of the optimizer from ``p0`` (float64, for an exact comparison) with
    the gradients of :func:`gradients` set by hand; the final values, the optimizer and p."""
    p = ad.asarray(p0, requires_grad=True)
    opt = make([p])
    array = p.array
    for g in gradients(p0.shape):
        p.grad = ad.asarray(g)
        opt.step()
    assert p.array is array  # updated in place: never re-allocated
    return values(p), opt, p


# --- PyTorch's rules, re-implemented for the comparison ----------------------------------------


def reference_sgd(
    p: np.ndarray,
    lr: float,
    momentum: float = 0.0,
    dampening: float = 0.0,
    weight_decay: float = 0.0,
    nesterov: bool = False,
) -> np.ndarray:
    p, buf = p.copy(), np.zeros_like(p)
    for t, g in enumerate(gradients(p.shape)):
        if weight_decay:
            g = g + weight_decay * p
        if momentum:
            buf = g.copy() if t == 0 else momentum * buf + (1 - dampening) * g
            g = g + momentum * buf if nesterov else buf
        p = p - lr * g
    return p


def reference_adam(
    p: np.ndarray,
    lr: float,
    betas: tuple[float, float],
    eps: float,
    weight_decay: float,
    decoupled: bool,
    grads: Sequence[np.ndarray | None] | None = None,
) -> np.ndarray:
    """``grads`` (default :func:`gradients`) one per step; at a None the parameter has no
    gradient, so PyTorch skips it: its ``t`` does not advance."""
    p, m, v = p.copy(), np.zeros_like(p), np.zeros_like(p)
    b1, b2 = betas
    taken = [g for g in (gradients(p.shape) if grads is None else grads) if g is not None]
    for t, g in enumerate(taken, start=1):
        if decoupled:
            p = p * (1 - lr * weight_decay)
        elif weight_decay:
            g = g + weight_decay * p
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g**2
        m_hat, v_hat = m / (1 - b1**t), v / (1 - b2**t)
        p = p - lr * m_hat / (np.sqrt(v_hat) + eps)
    return p


P0 = np.random.default_rng(9).standard_normal((3, 4))


@pytest.mark.parametrize(
    "hyper",
    [
        {"lr": 0.1},
        {"lr": 0.1, "momentum": 0.9},
        {"lr": 0.05, "momentum": 0.9, "nesterov": True},
        {"lr": 0.1, "weight_decay": 0.01},
        {"lr": 0.1, "momentum": 0.8, "dampening": 0.3},
        {"lr": 0.02, "momentum": 0.5, "dampening": 0.0, "weight_decay": 0.1, "nesterov": True},
    ],
)
def test_sgd_matches_pytorchs_rules(ad: Autodiff, hyper: dict[str, Any]) -> None:
    got, opt, p = run(ad, lambda ps: optim.SGD(ps, **hyper), P0)
    np.testing.assert_allclose(got, reference_sgd(P0, **hyper), rtol=1e-12, atol=1e-14)
    if hyper.get("momentum"):
        assert isinstance(opt.state[p]["momentum_buffer"], client.RemoteArray)  # on the server


@pytest.mark.parametrize(
    ("cls", "hyper"),
    [
        (optim.Adam, {}),
        (optim.Adam, {"lr": 0.01, "betas": (0.8, 0.99), "eps": 1e-6, "weight_decay": 0.1}),
        (optim.AdamW, {}),
        (optim.AdamW, {"lr": 0.05, "weight_decay": 0.3}),
    ],
)
def test_adam_and_adamw_match_pytorchs_rules(
    ad: Autodiff, cls: type[optim.Adam], hyper: dict[str, Any]
) -> None:
    got, opt, p = run(ad, lambda ps: cls(ps, **hyper), P0)
    full = {
        "lr": 1e-3,
        "betas": (0.9, 0.999),
        "eps": 1e-8,
        "weight_decay": 1e-2 if cls is optim.AdamW else 0.0,
        **hyper,
    }
    expected = reference_adam(P0, decoupled=cls is optim.AdamW, **full)
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-14)
    state = opt.state[p]
    assert state["step"] == STEPS
    assert isinstance(state["exp_avg"], client.RemoteArray)
    assert isinstance(state["exp_avg_sq"], client.RemoteArray)


def test_a_parameter_without_gradient_is_skipped(ad: Autodiff) -> None:
    used, unused = ad.asarray(P0, requires_grad=True), ad.asarray(P0, requires_grad=True)
    opt = optim.Adam([used, unused], lr=0.1)
    used.grad = ad.asarray(np.ones_like(P0))
    opt.step()
    np.testing.assert_array_equal(values(unused), P0)
    assert unused not in opt.state and opt.state[used]["step"] == 1
    assert not np.array_equal(values(used), P0)
    opt.zero_grad()
    assert used.grad is None and unused.grad is None
    opt.step()  # nothing has a gradient: nothing moves
    assert opt.state[used]["step"] == 1


@pytest.fixture
def counted(dev: client.RemoteDevice, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Any]]:
    """Every op the device is sent, in a list; an upload as ``("upload", its bytes)``."""
    ops: list[Any] = []
    submit, submit_upload = dev.submit, dev.submit_upload

    def counting(op: Any) -> None:
        ops.append(op)
        submit(op)

    def counting_upload(make_op: Callable[[int], Any], data: memoryview) -> None:
        ops.append(("upload", bytes(data)))
        submit_upload(make_op, data)

    monkeypatch.setattr(dev, "submit", counting)
    monkeypatch.setattr(dev, "submit_upload", counting_upload)
    yield ops


@pytest.mark.parametrize(
    ("make", "dtype", "per_parameter", "per_group"),
    [
        (lambda ps: optim.SGD(ps, lr=0.1), np.float64, 2, 0),
        (lambda ps: optim.SGD(ps, lr=0.1, momentum=0.9), np.float64, 4, 0),
        (
            lambda ps: optim.SGD(ps, lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.1),
            np.float64,
            8,
            0,
        ),
        (lambda ps: optim.Adam(ps), np.float64, 4, 8),  # moment_update x2, adam_direction, -=
        (lambda ps: optim.Adam(ps), np.float32, 4, 10),  # +2: the terms cast to float32
        (lambda ps: optim.Adam(ps, weight_decay=0.1), np.float64, 6, 8),
        (lambda ps: optim.AdamW(ps), np.float64, 5, 10),  # +2: 1 - lr * weight_decay
        (lambda ps: optim.AdamW(ps), np.float32, 5, 13),  # +3: and the casts to float32
    ],
)
def test_ops_per_parameter_and_per_group_per_step_are_as_documented(
    ad: Autodiff, counted: list[Any], make: Any, dtype: Any, per_parameter: int, per_group: int
) -> None:
    for n in (1, 3):
        ps = [ad.asarray(P0.astype(dtype), requires_grad=True) for _ in range(n)]
        for p in ps:
            p.grad = ad.asarray(np.ones_like(P0, dtype=dtype))
        opt = make(ps)
        opt.step()  # the first step also makes the state
        counted.clear()
        opt.step()
        assert len(counted) == per_group + n * per_parameter


def normalised(ops: list[Any]) -> list[Any]:
    """``ops`` as a captured graph would hold them: every id made within them renumbered in
    the order they were made, the ids of arrays from before (parameters, the optimizer's
    state, the data) kept, every other field (op kinds, shapes, scalars) as sent."""
    made = _Made()
    result = []
    for op in ops:
        if isinstance(op, tuple):  # an upload: its bytes are part of what replays
            result.append(op)
            continue
        for tensor_id in () if op.inplace else op.outputs():
            made[tensor_id] = 2**62 + len(made)  # apart from any id the client gives
        result.append(renumber(op, made))
    return result


class _Made(dict[int, int]):
    """Ids made within the ops, renumbered; any other value kept as it is (renumber also
    looks up ``Full``'s fill value, which shares the name ``value`` with setitem's tensor)."""

    def __missing__(self, key: Any) -> Any:
        return key


def _adam_groups(ps: list[Tensor]) -> optim.Optimizer:
    return optim.Adam(
        [
            {"params": ps[:2], "weight_decay": 0.1},
            {"params": ps[2:], "lr": 3e-3, "betas": (0.8, 0.99)},
        ]
    )


@pytest.mark.parametrize(
    "make",
    [
        lambda ps: optim.AdamW(ps, lr=0.05),
        _adam_groups,
        lambda ps: optim.SGD(ps, lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.1),
    ],
)
def test_a_training_step_sends_the_same_ops_every_step_after_the_first(
    ad: Autodiff, counted: list[Any], make: Callable[[list[Tensor]], optim.Optimizer]
) -> None:
    """What makes a step replayable: step 3 sends exactly step 2's ops, scalars included, so
    a graph captured at step 2 replays step 3 (and the rest) as direct execution would, the
    rate changed between steps by a schedule (its writes are ops of their own, not the
    step's). A step-dependent Python scalar (Adam's bias corrections, the rate) fails this."""
    rng = np.random.default_rng(3)
    model = nn.Sequential(
        nn.Linear(8, 16, ad=ad, rng=rng), nn.ReLU(), nn.Linear(16, 4, ad=ad, rng=rng)
    )
    opt = make(list(model.parameters()))
    schedule = optim.CosineAnnealingLR(opt, T_max=5)
    x = ad.asarray(rng.standard_normal((32, 8)).astype(np.float32))
    y = ad.asarray(rng.integers(0, 4, 32))
    steps = []
    for _ in range(4):
        counted.clear()
        loss = nn.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        steps.append(normalised(counted))
        schedule.step()  # a new rate for every step
    assert steps[0] != steps[1]  # the first step makes the state
    assert steps[1] == steps[2] == steps[3]
    assert float(loss) < 2.0  # and it is a real step: the server ran every op


def test_a_parameter_that_skips_steps_keeps_its_own_step_count(
    ad: Autodiff, counted: list[Any]
) -> None:
    """PyTorch's per-parameter ``t``: the group's parameters share their bias powers while
    they step together; one that skips a step (no gradient) parts with its own, so each
    matches the reference with its own count, and the steps settle to the same ops again."""
    has = {"a": "111111", "b": "101111", "c": "001111"}  # c's first step is the group's third
    rng = np.random.default_rng(5)
    g = {name: [rng.standard_normal(P0.shape) for _ in range(5)] for name in has}
    grads = {
        name: [g[name][min(i, 4)] if took == "1" else None for i, took in enumerate(row)]
        for name, row in has.items()
    }
    params = {name: ad.asarray(P0, requires_grad=True) for name in has}
    uploaded = {name: [ad.asarray(x) for x in g[name]] for name in has}
    opt = optim.Adam(list(params.values()), lr=0.1, betas=(0.8, 0.9))
    steps = []
    for step in range(6):
        for name, p in params.items():  # steps 5 and 6 use the same gradient arrays
            p.grad = uploaded[name][min(step, 4)] if has[name][step] == "1" else None
        counted.clear()
        opt.step()
        steps.append(normalised(counted))
    for name, p in params.items():
        expected = reference_adam(
            P0,
            lr=0.1,
            betas=(0.8, 0.9),
            eps=1e-8,
            weight_decay=0.0,
            decoupled=False,
            grads=grads[name],
        )
        np.testing.assert_allclose(values(p), expected, rtol=1e-12, atol=1e-14)
        assert opt.state[p]["step"] == has[name].count("1")
    assert steps[4] == steps[5]
    assert len(steps[5]) == 3 * 8 + 3 * 4  # three step counts now: a group's 8 ops each


def test_optimizer_state_follows_a_model_moved_to_a_device(ad: Autodiff) -> None:
    def train(model: nn.Module, opt: optim.Optimizer, steps: int) -> None:
        x, y = np.ones((4, 3), np.float32), np.zeros((4, 2), np.float32)
        for _ in range(steps):
            opt.zero_grad()
            nn.mse_loss(model(x), y).backward()
            opt.step()

    model = nn.Linear(3, 2, rng=np.random.default_rng(0))
    twin = nn.Linear(3, 2, rng=np.random.default_rng(0))
    opt, twin_opt = optim.Adam(model.parameters(), 0.1), optim.Adam(twin.parameters(), 0.1)
    train(model, opt, 2)
    train(twin, twin_opt, 2)
    model.to(ad)
    train(model, opt, 2)  # the moments moved to the server with the parameters
    train(twin, twin_opt, 2)
    assert isinstance(opt.state[model.weight]["exp_avg"], client.RemoteArray)
    for name, array in model.state_dict().items():
        np.testing.assert_allclose(np.asarray(array), twin.state_dict()[name], rtol=1e-5)


def test_bad_hyper_parameters_and_params_are_refused(ad: Autodiff) -> None:
    p = ad.asarray(P0, requires_grad=True)
    with pytest.raises(ValueError, match="lr"):
        optim.SGD([p], lr=-1.0)
    with pytest.raises(ValueError, match="Nesterov"):
        optim.SGD([p], lr=0.1, nesterov=True)
    with pytest.raises(ValueError, match="Nesterov"):
        optim.SGD([p], lr=0.1, momentum=0.9, dampening=0.1, nesterov=True)
    with pytest.raises(ValueError, match="betas"):
        optim.Adam([p], betas=(0.9, 1.0))
    with pytest.raises(ValueError, match="empty"):
        optim.Adam([])
    with pytest.raises(TypeError, match="single tensor"):
        optim.Adam(p)
    with pytest.raises(ValueError, match="not a leaf"):
        optim.Adam([p * 2])
    with pytest.raises(ValueError, match="one group"):
        optim.Adam([p, p])


# --- schedules ---------------------------------------------------------------------------------


def test_step_lr_follows_its_closed_form(ad: Autodiff) -> None:
    p, q = ad.asarray(P0, requires_grad=True), ad.asarray(P0, requires_grad=True)
    groups: list[dict[str, Any]] = [{"params": [p]}, {"params": [q], "lr": 1.0}]
    opt = optim.SGD(groups, lr=0.5)
    schedule = optim.StepLR(opt, step_size=3, gamma=0.5)
    seen = []
    for _ in range(10):
        seen.append(schedule.get_last_lr())
        schedule.step()
    expected = [[0.5 * 0.5 ** (e // 3), 1.0 * 0.5 ** (e // 3)] for e in range(10)]
    np.testing.assert_allclose(seen, expected, rtol=1e-15)
    assert [g["lr"] for g in opt.param_groups] == schedule.get_last_lr()


def test_cosine_annealing_follows_its_closed_form_and_steers_the_optimizer(ad: Autodiff) -> None:
    p = ad.asarray(P0, requires_grad=True)
    opt = optim.SGD([p], lr=0.2)
    schedule = optim.CosineAnnealingLR(opt, T_max=8, eta_min=0.01)
    rates = []
    expected = P0.copy()
    for _ in range(12):
        rates.append(schedule.get_last_lr()[0])
        p.grad = ad.asarray(np.ones_like(P0))
        opt.step()
        expected -= rates[-1]
        schedule.step()
    closed = [0.01 + (0.2 - 0.01) * (1 + math.cos(math.pi * e / 8)) / 2 for e in range(12)]
    np.testing.assert_allclose(rates, closed, rtol=1e-14)
    assert rates[8] == pytest.approx(0.01) and rates[0] == pytest.approx(0.2)
    np.testing.assert_allclose(values(p), expected, rtol=1e-12)  # each step used its rate


# --- end to end --------------------------------------------------------------------------------


def test_a_small_mlp_learns_on_the_server(ad: Autodiff) -> None:
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, (64, 2)).astype(np.float32)
    labels = ((x[:, 0] * x[:, 1]) > 0).astype(np.int64)  # XOR of the signs: not linear
    model = nn.Sequential(
        nn.Linear(2, 16, ad=ad, rng=rng), nn.Tanh(), nn.Linear(16, 2, ad=ad, rng=rng)
    )
    opt = optim.AdamW(model.parameters(), lr=0.05)
    schedule = optim.StepLR(opt, step_size=25, gamma=0.5)
    inputs, targets = ad.asarray(x), ad.asarray(labels)
    losses = []
    for _ in range(50):
        loss = nn.cross_entropy(model(inputs), targets)
        opt.zero_grad()
        loss.backward()
        opt.step()
        schedule.step()
        losses.append(float(loss))
    assert all(isinstance(p.array, client.RemoteArray) for p in model.parameters())
    assert losses[-1] < 0.5 * losses[0], losses


def test_a_frozen_parameter_is_accepted_and_skipped_until_unfrozen() -> None:
    ad = Autodiff(np)
    model = nn.Sequential(nn.Linear(3, 2, ad=ad, rng=np.random.default_rng(0)))
    weight = model[0].weight
    weight.requires_grad_(False)
    opt = optim.SGD(model.parameters(), lr=0.1)
    before = np.array(weight.array)
    loss = ad.sum(model(ad.asarray(np.ones((4, 3)))))
    loss.backward()
    opt.step()
    np.testing.assert_array_equal(weight.array, before)  # frozen: untouched
    weight.requires_grad_(True)
    opt.zero_grad()
    ad.sum(model(ad.asarray(np.ones((4, 3))))).backward()
    opt.step()
    assert not np.array_equal(weight.array, before)
