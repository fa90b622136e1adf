"""client.nn's random numbers on the device: one generator per namespace, its state a uint64
[seed, offset] array there, seeded by nn.manual_seed; dropout's masks drawn from it. Every
draw is checked against numpy's Philox keyed by [seed, offset], computed here."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import array_api_strict
import numpy as np
import pytest

import client
from client import nn, optim
from client.autodiff import Autodiff, Tensor
from client.capture import jit
from client.nn import functional as F
from client.nn.random import device_generator

from .nn_reference import values


def philox(seed: int, offset: int) -> np.random.Generator:
    """The generator a draw at ``[seed, offset]`` uses (protocol/ops/nn.py)."""
    return np.random.Generator(np.random.Philox(key=np.array([seed, offset], dtype=np.uint64)))


def dropped(x: np.ndarray, p: float, seed: int, offset: int) -> np.ndarray:
    """``x`` through dropout with the mask drawn at ``[seed, offset]``, in x's dtype."""
    uniform = philox(seed, offset).random(x.shape, dtype=x.dtype)
    kept = (uniform >= p).astype(x.dtype) * x.dtype.type(1.0 / (1.0 - p))
    result: np.ndarray = x * kept
    return result


@contextmanager
def three_targets(xp: client.Namespace) -> Iterator[dict[str, Autodiff]]:
    """Autodiff over the server, over an ndarray device in this process, and over numpy."""
    with client.open_device("ndarray") as local_device:
        yield {
            "server": Autodiff(xp),
            "ndarray": Autodiff(client.namespace(local_device)),
            "numpy": nn.local_autodiff(),
        }


def test_rand_and_randn_draw_philox_at_the_seed_and_advance_the_offset(
    xp: client.Namespace,
) -> None:
    with three_targets(xp) as targets:
        nn.manual_seed(11)
        for name, ad in targets.items():
            a, b = nn.rand(3, 4, ad=ad), nn.rand((3, 4), ad=ad)
            c = nn.randn(5, ad=ad, dtype="float64")
            assert a.dtype == ad.float32 and c.dtype == ad.float64 and not a.requires_grad, name
            np.testing.assert_array_equal(values(a), philox(11, 0).random((3, 4), np.float32))
            np.testing.assert_array_equal(values(b), philox(11, 1).random((3, 4), np.float32))
            np.testing.assert_array_equal(values(c), philox(11, 2).standard_normal(5))
            assert list(device_generator(ad).get_state()) == [11, 3], name


def test_manual_seed_reseeds_existing_generators_in_place_and_later_ones(
    xp: client.Namespace,
) -> None:
    ad = Autodiff(xp)
    nn.manual_seed(1)
    generator = device_generator(ad)
    state = generator.state
    nn.rand(2, ad=ad)
    assert list(generator.get_state()) == [1, 1]
    init = nn.manual_seed(2**64 - 1)
    assert generator.state is state  # the same array: a recorded step keeps reading it
    assert list(generator.get_state()) == [2**64 - 1, 0]
    assert nn.initial_seed() == 2**64 - 1
    assert init is nn.default_generator()  # the parameters' numpy generator, seeded too
    with client.open_device("ndarray") as later:
        assert list(device_generator(Autodiff(client.namespace(later))).get_state()) == [
            2**64 - 1,
            0,
        ]


@pytest.mark.parametrize("seed", [-(2**63) - 1, 2**64, 1.5, True, "3"])
def test_manual_seed_refuses_what_pytorchs_range_lacks(seed: Any) -> None:
    with pytest.raises((TypeError, ValueError), match="seed"):
        nn.manual_seed(seed)


@pytest.mark.parametrize("seed", [-1, -(2**63)])
def test_a_negative_seed_is_its_uint64_as_pytorchs(seed: int) -> None:
    """torch.manual_seed takes seeds from -2**63 and keeps a negative one as its two's
    complement: torch.manual_seed(-1).initial_seed() == 2**64 - 1."""
    ad = nn.local_autodiff()
    nn.manual_seed(seed)
    assert nn.initial_seed() == seed + 2**64
    drawn = values(nn.rand(4, ad=ad))
    parameters = nn.Linear(3, 2).weight
    nn.manual_seed(seed + 2**64)
    np.testing.assert_array_equal(values(nn.rand(4, ad=ad)), drawn)
    np.testing.assert_array_equal(values(nn.Linear(3, 2).weight), values(parameters))


def test_random_numbers_are_tensorwires_extension_not_the_standards() -> None:
    with pytest.raises(TypeError, match="extension"):
        nn.rand(2, ad=Autodiff(array_api_strict))
    with pytest.raises(TypeError, match="float32 or float64"):
        nn.rand(2, dtype="int32")


def test_one_seed_gives_one_dropout_mask_on_a_server_on_ndarray_and_on_numpy(
    xp: client.Namespace,
) -> None:
    x = np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)
    with three_targets(xp) as targets:
        nn.manual_seed(3)
        results = {name: values(F.dropout(ad.asarray(x), 0.25)) for name, ad in targets.items()}
        second = {name: values(F.dropout(ad.asarray(x), 0.25)) for name, ad in targets.items()}
    for name in targets:
        np.testing.assert_array_equal(results[name], dropped(x, 0.25, 3, 0), err_msg=name)
        np.testing.assert_array_equal(second[name], dropped(x, 0.25, 3, 1), err_msg=name)
    assert not np.array_equal(results["server"], second["server"])


def test_dropout_scales_what_it_keeps_and_is_the_identity_when_evaluating() -> None:
    p = 0.3
    x = np.random.default_rng(1).uniform(1.0, 2.0, (100, 200)).astype(np.float32)
    layer = nn.Dropout(p)
    out = values(layer(x))
    kept = out != 0
    assert abs(kept.mean() - (1 - p)) < 0.01  # 20,000 draws: sd 0.0032
    np.testing.assert_array_equal(out[kept], x[kept] * np.float32(1 / (1 - p)))
    layer.eval()
    np.testing.assert_array_equal(values(layer(x)), x)
    np.testing.assert_array_equal(values(F.dropout(x, p, training=False)), x)
    np.testing.assert_array_equal(values(F.dropout(x, 0.0)), x)
    np.testing.assert_array_equal(values(F.dropout(x, 1.0)), np.zeros_like(x))
    assert repr(layer) == "Dropout(p=0.3, inplace=False)"


def test_dropouts_gradient_is_its_mask_scaled() -> None:
    ad = nn.local_autodiff()
    x = ad.asarray(np.ones((5, 7)), requires_grad=True)
    nn.manual_seed(9)
    ad.sum(F.dropout(x, 0.4)).backward()
    assert x.grad is not None
    np.testing.assert_array_equal(values(x.grad), dropped(np.ones((5, 7)), 0.4, 9, 0))


@pytest.mark.parametrize("p", [-0.1, 1.5, True])
def test_dropout_refuses_a_probability_outside_0_1(p: Any) -> None:
    with pytest.raises(ValueError, match="between 0 and 1"):
        nn.Dropout(p)
    with pytest.raises(ValueError, match="between 0 and 1"):
        F.dropout(np.ones(3), p)


def test_a_jitted_step_draws_fresh_masks_each_run_the_same_as_op_by_op(url: str) -> None:
    with client.RemoteDevice(url) as d1, client.RemoteDevice(url) as d2:
        x = np.ones((8, 32), np.float32)
        replayed_ad, direct_ad = Autodiff(client.namespace(d1)), Autodiff(client.namespace(d2))
        nn.manual_seed(21)
        step = jit(lambda t: F.dropout(t, 0.5))
        on_device = replayed_ad.asarray(x)
        replayed = [values(step(on_device)) for _ in range(5)]
        assert step.recorded == 1 and step.calls == 5
        nn.manual_seed(21)
        direct = [values(F.dropout(direct_ad.asarray(x), 0.5)) for _ in range(5)]
    for offset, (a, b) in enumerate(zip(replayed, direct, strict=True)):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(a, dropped(x, 0.5, 21, offset))
    assert len({a.tobytes() for a in replayed}) == 5


class DroppingClassifier:
    """An MLP with dropout trained by SGD, its data on the device, batches taken by index."""

    def __init__(self, ad: Autodiff) -> None:
        data = np.random.default_rng(5)
        self.ad = ad
        self.x = ad.asarray(data.standard_normal((64, 12)).astype(np.float32))
        self.y = ad.asarray(data.integers(0, 5, 64))
        init = np.random.default_rng(0)
        self.net = nn.Sequential(
            nn.Linear(12, 24, ad=ad, rng=init),
            nn.ReLU(),
            nn.Dropout(0.5),
            nn.Linear(24, 5, ad=ad, rng=init),
        )
        self.opt = optim.SGD(self.net.parameters(), lr=0.1)

    def step(self, index: Tensor) -> Tensor:
        logits = self.net(self.ad.take(self.x, index, axis=0))
        loss = nn.cross_entropy(logits, self.ad.take(self.y, index))
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        return loss


def test_a_jitted_training_step_with_dropout_trains_as_the_direct_one(url: str) -> None:
    batches = [np.random.default_rng(i).integers(0, 64, 16) for i in range(6)]
    runs = []
    with client.RemoteDevice(url) as d1, client.RemoteDevice(url) as d2:
        for device, jitted in ((d1, False), (d2, True)):
            model = DroppingClassifier(Autodiff(client.namespace(device)))
            step = jit(model.step) if jitted else model.step
            nn.manual_seed(4)
            losses = [float(step(model.ad.asarray(index))) for index in batches]
            runs.append((losses, [values(p) for p in model.net.parameters()]))
    (direct_losses, direct_weights), (replayed_losses, replayed_weights) = runs
    assert replayed_losses == direct_losses
    for a, b in zip(direct_weights, replayed_weights, strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("target", ["ndarray", "server"])
def test_a_generator_does_not_keep_its_namespace_or_device_alive(
    target: str, request: pytest.FixtureRequest
) -> None:
    spec = "ndarray" if target == "ndarray" else request.getfixturevalue("url")
    with client.open_device(spec) as device:
        xp = client.namespace(device)
        nn.rand(3, ad=Autodiff(xp))
    namespace, device_ref = weakref.ref(xp), weakref.ref(device)
    del xp, device
    gc.collect()
    assert namespace() is None and device_ref() is None  # its session closed, its state freed
