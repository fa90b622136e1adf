"""The optimizer extension (``protocol/ops/optim.py``): Adam's chains as one op each give the
bits of the chains sent op by op, in the server's executor and through a real server, and a
server that predates them is sent the chains."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

import client
from client import nn, optim
from client.autodiff import Autodiff
from protocol import FEATURE_OPTIM, OpArgumentError, TensorMeta, from_numpy
from protocol.ops import (
    AdamDirection,
    AnyOp,
    Binary,
    BinaryScalar,
    InPlaceBinary,
    InPlaceBinaryScalar,
    MomentUpdate,
    Unary,
)
from server import executor

from .older_servers import without_feature

SPECIAL = [0.0, -0.0, 1e-30, -1e-30, 1e30, -1e30, np.inf, -np.inf, np.nan, 1.0, -1.0, 3.5e-39]


def _values(dtype: str, seed: int, n: int = 512) -> np.ndarray:
    rng = np.random.default_rng(seed)
    with np.errstate(all="ignore"):
        values = rng.standard_normal(n) * 10.0 ** rng.integers(-8, 8, n)
        values[: len(SPECIAL)] = rng.permutation(SPECIAL)
        return values.astype(dtype)


def _run(op: AnyOp, arrays: list[np.ndarray], in_place: bool = False) -> np.ndarray:
    metas = op.infer_all(*(TensorMeta(a.shape, from_numpy(a.dtype)) for a in arrays))
    return executor.run(op, arrays, (), metas, in_place=in_place)[0]


def _chain(steps: list[tuple[AnyOp, list[int]]], arrays: dict[int, np.ndarray]) -> None:
    """Run ``steps`` (an op and the ids of its inputs) one by one on ``arrays``, as a server
    runs them op by op: an in-place op writes its target."""
    for op, ids in steps:
        arrays[op.out] = _run(op, [arrays[i] for i in ids], in_place=op.inplace)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("squared", [False, True])
def test_moment_update_is_the_bits_of_its_chain_op_by_op(dtype: str, squared: bool) -> None:
    decay = 0.999 if squared else 0.9
    scale = 1.0 - decay  # as Adam passes it: the double, not 0.001
    moment, grad = _values(dtype, 1), _values(dtype, 2)
    arrays = {1: moment.copy(), 2: grad}
    steps: list[tuple[AnyOp, list[int]]] = [
        (InPlaceBinaryScalar(op="multiply", out=1, scalar=decay), [1]),
        (BinaryScalar(op="multiply", out=3, x=2, scalar=scale, scalar_first=True), [2]),
    ]
    if squared:
        steps.append((Binary(op="multiply", out=4, x1=3, x2=2), [3, 2]))
    last = 4 if squared else 3
    steps.append((InPlaceBinary(op="add", out=1, x2=last), [1, last]))
    _chain(steps, arrays)
    target = moment.copy()
    fused = MomentUpdate(out=1, grad=2, decay=decay, scale=scale, squared=squared)
    got = _run(fused, [target, grad], in_place=True)
    assert got is target  # written in place
    assert got.tobytes() == arrays[1].tobytes()
    read_only = moment.copy()
    read_only.flags.writeable = False
    copied = _run(fused, [read_only, grad], in_place=True)
    assert copied is not read_only and copied.tobytes() == arrays[1].tobytes()
    assert read_only.tobytes() == moment.tobytes()


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("order", ["C", "F"])  # exp_avg's: the quotient's layout is numpy's
def test_adam_direction_is_the_bits_of_its_chain_op_by_op(dtype: str, order: str) -> None:
    m = np.asarray(_values(dtype, 3).reshape(16, 32), order=order)
    v = np.abs(_values(dtype, 4)).reshape(16, 32)
    step_size, eps_term = np.asarray(3e-3, dtype=dtype), np.asarray(1e-8, dtype=dtype)
    arrays = {1: m, 2: v, 3: step_size, 4: eps_term}
    _chain(
        [
            (Unary(op="sqrt", out=5, x=2), [2]),
            (InPlaceBinary(op="add", out=5, x2=4), [5, 4]),
            (Binary(op="multiply", out=6, x1=3, x2=1), [3, 1]),
            (Binary(op="divide", out=7, x1=6, x2=5), [6, 5]),
        ],
        arrays,
    )
    op = AdamDirection(out=8, exp_avg=1, exp_avg_sq=2, step_size=3, eps_term=4)
    got = _run(op, [m, v, step_size, eps_term])
    assert got.dtype == dtype and got.strides == arrays[7].strides
    assert got.tobytes(order="A") == arrays[7].tobytes(order="A")


def test_a_gradient_that_shares_the_moments_memory_is_read_before_the_write() -> None:
    """Under another id (a view), the gradient is the moment's values before the update."""
    moment = _values("float64", 5)
    target = moment.copy()
    op = MomentUpdate(out=1, grad=2, decay=0.9, scale=0.1)
    got = _run(op, [target, target[...]], in_place=True)
    want = np.add(np.multiply(moment, 0.9), np.multiply(0.1, moment))
    assert got is target and got.tobytes() == want.tobytes()


# --- through a real server ---------------------------------------------------------------------


def _train(
    ad: Autodiff, make: Callable[[list[Any]], optim.Optimizer], dtype: Any, steps: int = 6
) -> tuple[list[np.ndarray], list[float]]:
    """``steps`` steps of a small MLP; its parameters and moments after them, and the losses."""
    rng = np.random.default_rng(4)
    model = nn.Sequential(
        nn.Linear(12, 16, ad=ad, rng=rng), nn.ReLU(), nn.Linear(16, 5, ad=ad, rng=rng)
    )
    if dtype != np.float32:
        for p in model.parameters():
            p.array = ad.xp.astype(p.array, dtype)
    opt = make(list(model.parameters()))
    x = ad.asarray(rng.standard_normal((24, 12)).astype(dtype))
    y = ad.asarray(rng.integers(0, 5, 24))
    losses = []
    for _ in range(steps):
        loss = nn.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss))
    arrays = []
    for p in model.parameters():
        arrays.append(np.asarray(p.array))
        state = opt.state[p]
        arrays += [np.asarray(state["exp_avg"]), np.asarray(state["exp_avg_sq"])]
    return arrays, losses


MAKERS = [
    pytest.param(lambda ps: optim.Adam(ps, lr=1e-2), id="adam"),
    pytest.param(lambda ps: optim.Adam(ps, lr=1e-2, weight_decay=0.1), id="adam-l2"),
    pytest.param(lambda ps: optim.AdamW(ps, lr=1e-2, betas=(0.8, 0.99)), id="adamw"),
]


@pytest.fixture
def sent(dev: client.RemoteDevice, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Any]]:
    """Every op the device is sent, in a list."""
    ops: list[Any] = []
    submit = dev.submit

    def counting(op: Any) -> None:
        ops.append(op)
        submit(op)

    monkeypatch.setattr(dev, "submit", counting)
    yield ops


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("make", MAKERS)
def test_a_remote_adam_step_is_the_bits_of_numpys(
    xp: client.Namespace, sent: list[Any], make: Any, dtype: Any
) -> None:
    """Through the server, one op per chain, its steps replayed as a segment from the fourth
    on; on numpy, the chains op by op: every parameter and moment, bit for bit."""
    remote, remote_losses = _train(Autodiff(xp), make, dtype)
    local, local_losses = _train(Autodiff(np), make, dtype)
    kinds = {type(op) for op in sent}
    assert MomentUpdate in kinds and AdamDirection in kinds
    assert xp.device.segment_stats().hits >= 2
    assert remote_losses == local_losses
    for got, want in zip(remote, local, strict=True):
        assert got.dtype == want.dtype and got.tobytes() == want.tobytes()


def test_a_server_without_the_optimizer_ops_is_sent_the_chains(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server that predates them (no ``optim`` in its welcome): Adam sends its element-wise
    ops, with the same bits."""
    without_feature(monkeypatch, FEATURE_OPTIM)
    make = MAKERS[0].values[0]
    with client.RemoteDevice(url) as dev:
        ops: list[Any] = []
        submit = dev.submit
        monkeypatch.setattr(dev, "submit", lambda op: (ops.append(op), submit(op)))
        remote, _ = _train(Autodiff(client.namespace(dev)), make, np.float32)
    assert not {MomentUpdate, AdamDirection} & {type(op) for op in ops}
    local, _ = _train(Autodiff(np), make, np.float32)
    for got, want in zip(remote, local, strict=True):
        assert got.tobytes() == want.tobytes()


def test_an_older_server_is_never_sent_the_ops(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Called directly on a device whose server did not announce ``optim``, each function
    raises before sending, naming the feature; the session goes on."""
    without_feature(monkeypatch, FEATURE_OPTIM)
    with client.RemoteDevice(url) as dev:
        xp = client.namespace(dev)
        ext = xp.__tensorwire_nn__
        m, g, term = xp.zeros(3), xp.ones(3), xp.asarray(0.5)
        assert not ext.has_optimizer_ops()
        with pytest.raises(client.FeatureNotSupportedError, match="optimizer ops.*'optim'"):
            ext.moment_update(m, g, decay=0.9, scale=0.1, squared=False)
        with pytest.raises(client.FeatureNotSupportedError, match="'optim'.*upgrade"):
            ext.adam_direction(m, m, term, term)
        assert (m + g).numpy().tolist() == [1.0, 1.0, 1.0]


def test_a_moment_update_whose_gradient_is_its_moment_is_refused() -> None:
    op = MomentUpdate(out=1, grad=1, decay=0.9, scale=0.1)
    meta = TensorMeta((3,), "float32")
    with pytest.raises(OpArgumentError, match="both the moment and the gradient"):
        op.infer_all(meta, meta)


def test_a_parameter_whose_gradient_differs_in_dtype_takes_the_chains(
    xp: client.Namespace, sent: list[Any]
) -> None:
    """A float32 parameter given a float64 gradient: the fused ops refuse mixed dtypes, so its
    chains go op by op (numpy's promotions and casts), as on numpy."""
    results = []
    for ad in (Autodiff(xp), Autodiff(np)):
        p = ad.asarray(np.linspace(-1, 1, 6, dtype=np.float32), requires_grad=True)
        opt = optim.Adam([p], lr=0.1)
        for step in range(3):
            p.grad = ad.asarray(np.full(6, 0.5 + step, dtype=np.float64))
            opt.step()
        results.append(np.asarray(p.array))
    assert not {MomentUpdate, AdamDirection} & {type(op) for op in sent}
    assert results[0].dtype == np.float32 and results[0].tobytes() == results[1].tobytes()
