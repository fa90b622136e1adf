"""Step replay for training code (issue 16): ``client.capture.jit`` records a step once and
runs it by id; a training step captured on a server replays on a local device and remotely.

Every comparison is with the same step run directly, from the same seeds: the losses and the
parameters must be identical, bit for bit, since the server runs the same numpy calls.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import client
from client import nn, optim
from client.autodiff import Autodiff, Tensor
from client.capture import Capture, Graph, jit
from client.errors import CaptureError

from .classifying import classifier_step

STEPS = 8


class Classifier:
    """A small MLP classifier, its data resident on the device, batches taken by index."""

    def __init__(self, ad: Autodiff, opt: str = "adam") -> None:
        rng = np.random.default_rng(5)
        self.ad = ad
        self.x = ad.asarray(rng.standard_normal((64, 12)).astype(np.float32))
        self.y = ad.asarray(rng.integers(0, 5, 64))
        init = np.random.default_rng(0)
        self.net = nn.Sequential(
            nn.Linear(12, 24, ad=ad, rng=init), nn.ReLU(), nn.Linear(24, 5, ad=ad, rng=init)
        )
        if opt == "adam":
            self.opt: optim.Optimizer = optim.Adam(self.net.parameters(), lr=1e-2)
        else:
            self.opt = optim.SGD(self.net.parameters(), lr=0.1, momentum=0.9, nesterov=True)
        self.order = np.random.default_rng(3)

    def step(self, index: Tensor) -> Tensor:
        return classifier_step(self.ad, self.net, self.opt, self.x, self.y, index)

    def batches(self, n: int, size: int = 16) -> list[Tensor]:
        return [self.ad.asarray(self.order.integers(0, 64, size)) for _ in range(n)]

    def weights(self) -> list[np.ndarray]:
        return [np.asarray(p.array) for p in self.net.parameters()]


def _train(model: Classifier, step: Callable[[Tensor], Tensor], n: int) -> list[float]:
    return [float(step(index)) for index in model.batches(n)]


@pytest.mark.parametrize("opt", ["adam", "sgd"])
def test_a_jitted_step_trains_exactly_as_the_direct_one(url: str, opt: str) -> None:
    with client.RemoteDevice(url) as d1, client.RemoteDevice(url) as d2:
        direct = Classifier(Autodiff(client.namespace(d1)), opt)
        replayed = Classifier(Autodiff(client.namespace(d2)), opt)
        step = jit(replayed.step)
        assert _train(direct, direct.step, STEPS) == _train(replayed, step, STEPS)
        for a, b in zip(direct.weights(), replayed.weights(), strict=True):
            np.testing.assert_array_equal(a, b)
        assert step.recorded == 1 and step.calls == STEPS


def test_a_replayed_step_is_one_op_on_the_wire(dev: client.RemoteDevice) -> None:
    model = Classifier(Autodiff(client.namespace(dev)))
    step = jit(model.step)
    batches = model.batches(4)
    for index in batches[:2]:
        step(index)  # warm-up, record
    sent: list[Any] = []
    submit = dev.submit
    dev.submit = lambda op: (sent.append(op), submit(op))[1]  # type: ignore[method-assign]
    try:
        loss = step(batches[2])
    finally:
        dev.submit = submit  # type: ignore[method-assign]
    assert [op.kind for op in sent] == ["run_graph"]
    assert isinstance(loss, Tensor) and loss.shape == ()
    assert np.isfinite(float(loss))


def test_a_new_signature_records_again_and_key_records_on_change(dev) -> None:
    model = Classifier(Autodiff(client.namespace(dev)))
    lr = {"value": 1e-2}
    step = jit(model.step, key=lambda: lr["value"])
    ad = model.ad
    for size in (16, 16, 16, 8, 8, 16):
        step(ad.asarray(np.arange(size)))
    assert step.recorded == 2  # batch 16 at call 2, batch 8 at call 4; call 6 replays
    lr["value"] = 1e-3
    step(ad.asarray(np.arange(16)))
    assert step.recorded == 3


def test_jit_refuses_what_it_cannot_replay(dev) -> None:
    xp = client.namespace(dev)
    w = xp.asarray(np.ones(3))

    @jit
    def no_arrays(scale: float) -> Any:
        return w * scale

    no_arrays(1.0)
    with pytest.raises(CaptureError, match="at least one array"):
        no_arrays(2.0)

    @jit
    def returns_a_parameter(x: client.RemoteArray) -> Any:
        return w

    returns_a_parameter(xp.ones(3))
    with pytest.raises(CaptureError, match="not produced"):
        returns_a_parameter(xp.ones(3))


def _arrays_in(value: Any, found: dict[int, client.RemoteArray], depth: int = 0) -> None:
    """Every remote array reachable from ``value`` (the model, its optimizer and state)."""
    if isinstance(value, client.RemoteArray):
        found[value.tensor_id] = value
    elif isinstance(value, Tensor):
        _arrays_in(value.array, found, depth)
    elif depth < 6 and isinstance(value, dict):
        for item in value.values():
            _arrays_in(item, found, depth + 1)
    elif depth < 6 and isinstance(value, list | tuple):
        for item in value:
            _arrays_in(item, found, depth + 1)
    elif depth < 6 and hasattr(value, "__dict__"):
        _arrays_in(vars(value), found, depth + 1)
    elif depth < 6 and hasattr(type(value), "__slots__"):  # the optimizer's bias powers
        _arrays_in([getattr(value, n, None) for n in type(value).__slots__], found, depth + 1)


def test_a_captured_training_step_replays_locally_and_remotely(url: str) -> None:
    """Capture step 2 of a training run on a server; replay it with the values its inputs had
    on a local ndarray device and on another server session: the same loss, the same updates."""
    with client.RemoteDevice(url) as dev:
        model = Classifier(Autodiff(client.namespace(dev)))
        first, second = model.batches(2)
        model.step(first)  # the warm-up: the optimizer's state exists from here on
        reachable: dict[int, client.RemoteArray] = {}
        _arrays_in({"model": model, "opt": model.opt.__dict__}, reachable)
        before = {i: a.numpy() for i, a in reachable.items()}
        with Capture(dev, implicit=True) as cap:
            loss = model.step(cap.input("index", second.array))
            cap.output("loss", loss.array)
        graph = cap.graph
        direct_loss = loss.array.numpy()
        bound = cap.input_ids[1:]
        assert set(bound) <= set(before), "the step read an array the test cannot see"
        after = {i: reachable[i].numpy() for i in bound}
        for target in ("ndarray", url):
            with client.open_device(target) as other:
                xp = client.namespace(other)
                inputs = [xp.asarray(second.array.numpy())]
                inputs += [xp.asarray(before[i]) for i in bound]
                outputs = graph.replay(other, inputs)
                np.testing.assert_array_equal(outputs["loss"].numpy(), direct_loss)
                for i, array in zip(bound, inputs[1:], strict=True):
                    np.testing.assert_array_equal(array.numpy(), after[i])  # updated in place


def test_jit_keys_values_by_type_and_arrays_by_aliasing(dev) -> None:
    xp = client.namespace(dev)
    x = xp.asarray(np.array([1, 2, 3]))

    @jit
    def scale(a: Any, factor: Any) -> Any:
        return a * factor

    for factor in (2, 2, 2.0, True):
        result = scale(x, factor)
        expected = np.array([1, 2, 3]) * factor
        assert result.dtype == expected.dtype
        np.testing.assert_array_equal(result.numpy(), expected)
    assert scale.recorded == 3  # 2 (call 2), 2.0, True: equal values, three signatures

    @jit
    def combine(a: Any, b: Any) -> Any:
        return a + 2 * b

    y = xp.asarray(np.array([10, 20, 30]))
    for first, second in ((x, y), (x, y), (x, x), (y, y), (x, y)):
        expected = first.numpy() + 2 * second.numpy()
        np.testing.assert_array_equal(combine(first, second).numpy(), expected)
    assert combine.recorded == 2  # (x, y) and the same array twice

    with pytest.raises(CaptureError, match="ndarray"):
        combine(x, np.ones(3))


def test_off_a_device_the_same_jitted_code_just_runs() -> None:
    """Training code written with jit runs on numpy too, with nothing to record, and trains
    exactly as without jit."""
    direct, jitted = Classifier(Autodiff(np)), Classifier(Autodiff(np))
    step = jit(jitted.step)
    assert _train(direct, direct.step, 4) == _train(jitted, step, 4)
    assert step.recorded == 0


def test_a_jitted_step_must_return_an_array(dev) -> None:
    xp = client.namespace(dev)
    w = xp.asarray(np.ones(3))

    @jit
    def update(g: Any) -> None:
        w[...] = w - g  # in place: nothing to return

    g = xp.asarray(np.full(3, 0.5))
    update(g)
    with pytest.raises(CaptureError, match="at least one output"):
        update(g)
    with Capture(dev) as cap:
        cap.output("y", xp.exp(cap.input("g", g)))
    with pytest.raises(ValueError, match="at least one output"):
        Graph(cap.graph.definition.model_copy(update={"outputs": []}), []).register(dev)
