"""Capture, replay, ``jit`` and ONNX export of the neural-network extension's ops, through a
real server: a CNN's forward pass and training step (convolutions and their transpose,
pooling, batch norm, softmax, a dropout drawn on the device and their backward ops) give the
same numbers replayed, run by id and jitted as sent op by op, and as numpy gives locally; a
jitted step draws fresh random numbers at every replay, because the generator's state advances
on the device.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import client
from client import nn, optim
from client.autodiff import Autodiff, Tensor
from client.autodiff.extension import extension_of
from client.capture import Capture, Graph, jit
from client.capture.onnx import OnnxExportError
from client.errors import CaptureError

from .onnx_graphs import run_onnx

STEP = np.array([0, 1], dtype=np.uint64)  # the generator's offset moves by one per draw


def _forward(xp: Any, x: Any, p: dict[str, Any], state: Any, step: Any) -> tuple[Any, Any]:
    """A CNN on raw arrays of ``xp`` (a device's namespace or numpy), every extension op in
    it: its log-probabilities and its probabilities. ``state`` advances in place."""
    ext = extension_of(xp)
    same = {"stride": (1, 1), "padding": ((1, 1), (1, 1)), "dilation": (1, 1), "groups": 1}
    h = ext.conv(x, p["w1"], **same) + xp.reshape(p["b1"], (4, 1, 1))
    h = ext.pool("max", xp.maximum(h, 0.0), kernel=(2, 2), stride=(2, 2), padding=(0, 0))
    transposed = {"stride": (2, 2), "padding": ((0, 0), (1, 1)), "dilation": (1, 1)}
    h = ext.conv_transpose(h, p["wt"], **transposed, groups=2, output_padding=(0, 1))
    h = ext.batch_norm(h, p["mean"], p["var"], p["gamma"], p["beta"], eps=1e-3)
    h = ext.batch_norm(h, p["mean"], p["var"], None, None, eps=1e-5)
    h = ext.pool("avg", h, kernel=(3, 3), stride=(3, 3), padding=(1, 1), count_include_pad=False)
    keep = ext.random(state, op="uniform", shape=h.shape, dtype="float32") >= 0.25
    state += step
    h = xp.where(keep, h / 0.75, 0.0)
    logits = xp.reshape(h, (h.shape[0], -1)) @ p["w2"]
    return ext.softmax("log_softmax", logits, axis=-1), ext.softmax("softmax", logits, axis=1)


def _parameters() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(28)
    normal = lambda *shape: (rng.standard_normal(shape) * 0.5).astype(np.float32)  # noqa: E731
    return {
        "w1": normal(4, 1, 3, 3),
        "b1": normal(4),
        "wt": normal(4, 2, 3, 2),
        "mean": normal(4),
        "var": np.abs(normal(4)) + 0.5,
        "gamma": normal(4),
        "beta": normal(4),
        "w2": normal(36, 3),
    }


def _images(n: int) -> np.ndarray:
    return np.random.default_rng(n).standard_normal((n, 1, 8, 8)).astype(np.float32)


def _local(x: np.ndarray, draws: int = 1) -> list[tuple[np.ndarray, np.ndarray]]:
    """The forward pass on numpy in this process, ``draws`` times from one generator."""
    state = np.array([28, 0], dtype=np.uint64)
    return [_forward(np, x, _parameters(), state, STEP) for _ in range(draws)]


def test_a_captured_cnn_replays_runs_by_id_and_matches_numpy(dev, xp, tmp_path: Path) -> None:
    params = {k: xp.asarray(v) for k, v in _parameters().items()}
    state, step = xp.asarray(np.array([28, 0], dtype=np.uint64)), xp.asarray(STEP)
    x = _images(5)
    images = xp.asarray(x)
    with Capture(dev) as cap:
        x_in, state_in = cap.input("x", images), cap.input("state", state)
        declared = {k: cap.input(k, v) for k, v in params.items()}
        log_probs, probs = _forward(xp, x_in, declared, state_in, cap.input("step", step))
        cap.output("log_probs", log_probs)
        cap.output("probs", probs)
    (want_log, want), (second_log, _) = _local(x, draws=2)
    np.testing.assert_array_equal(log_probs.numpy(), want_log)  # the capture ran it too
    np.testing.assert_array_equal(probs.numpy(), want)
    assert state.numpy().tolist() == [28, 1]

    cap.graph.save(tmp_path / "cnn.twgraph")
    graph = Graph.load(tmp_path / "cnn.twgraph")
    feeds = {"x": x, "state": state, "step": STEP, **params}
    replayed = graph.replay(dev, feeds)  # draws from [28, 1]: the second local draw
    np.testing.assert_array_equal(replayed["log_probs"].numpy(), second_log)
    state[...] = xp.asarray(np.array([28, 0], dtype=np.uint64))
    by_id = graph.register(dev).run(feeds)
    np.testing.assert_array_equal(by_id["log_probs"].numpy(), want_log)
    assert state.numpy().tolist() == [28, 1]


def test_the_summary_names_each_nn_op(dev, xp, tmp_path: Path) -> None:
    params = {k: xp.asarray(v) for k, v in _parameters().items()}
    state, step = xp.asarray(np.array([1, 0], dtype=np.uint64)), xp.asarray(STEP)
    images = xp.asarray(_images(2))
    with Capture(dev, implicit=True) as cap:
        log_probs, _ = _forward(xp, cap.input("x", images), params, state, step)
        cap.output("top", xp.max(log_probs, axis=1))
    cap.graph.save(tmp_path / "cnn.twgraph")
    done = subprocess.run(
        [sys.executable, "-m", "client.capture", "summary", str(tmp_path / "cnn.twgraph")],
        capture_output=True,
        text=True,
        check=True,
    )
    counts = dict(line.split() for line in done.stdout.splitlines() if line.startswith("  "))
    nn_ops = ("conv", "conv_transpose", "max_pool", "avg_pool", "random_uniform", "softmax")
    assert {k: counts[k] for k in (*nn_ops, "log_softmax", "batch_norm")} == {
        **dict.fromkeys(nn_ops, "1"),
        "log_softmax": "1",
        "batch_norm": "2",
    }
    assert counts["max"] == "1"  # the reduction, told from the pooling


class Cnn:
    """A small CNN classifier trained with autodiff: every extension op forward, their
    gradients (the transpose and weight gradient of a convolution, pooling's backward)
    backward, batch norm with the batch's statistics, and a dropout drawn on the device."""

    def __init__(self, ad: Autodiff) -> None:
        self.ad = ad
        values = _parameters()
        self.params = {k: ad.asarray(values[k], requires_grad=True) for k in ("w1", "b1", "wt")}
        self.params["w2"] = ad.asarray(values["w2"], requires_grad=True)
        self.state = ad.xp.asarray(np.array([5, 0], dtype=np.uint64))
        self.step_by = ad.xp.asarray(STEP)
        self.opt = optim.SGD(list(self.params.values()), lr=0.05, momentum=0.9)

    def step(self, x: Tensor, y: Tensor) -> Tensor:
        ad, p = self.ad, self.params
        h = ad.conv(x, p["w1"], p["b1"], stride=(1, 1), padding=((1, 1), (1, 1)))
        h = ad.max_pool(nn.functional.relu(h), kernel=(2, 2), stride=(2, 2), padding=(0, 0))
        transposed = {"stride": (2, 2), "padding": ((0, 0), (1, 1)), "output_padding": (0, 1)}
        h = ad.conv_transpose(h, p["wt"], **transposed, groups=2)
        mean, var = ad.mean(h, axis=(0, 2, 3)), ad.var(h, axis=(0, 2, 3))
        h = ad.batch_norm(h, mean, var, eps=1e-5)
        h = ad.avg_pool(h, kernel=(3, 3), stride=(3, 3), padding=(1, 1))
        keep = ad.random_uniform(self.state, tuple(h.shape), "float32") >= 0.25
        self.state += self.step_by
        h = ad.where(keep, h / 0.75, 0.0)
        logits = ad.log_softmax(ad.reshape(h, (h.shape[0], -1)) @ p["w2"], axis=-1)
        loss = -ad.mean(ad.take_along_axis(logits, ad.reshape(y, (-1, 1)), axis=1))
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        return loss


def test_a_jitted_cnn_step_trains_exactly_as_the_direct_one(url: str) -> None:
    """Replays run the backward ops too, and draw each step's own dropout mask."""
    x = _images(6)
    y = np.arange(6) % 3
    with client.RemoteDevice(url) as d1, client.RemoteDevice(url) as d2:
        direct, replayed = Cnn(Autodiff(client.namespace(d1))), Cnn(Autodiff(client.namespace(d2)))
        step = jit(replayed.step)
        losses = []
        for model, run in ((direct, direct.step), (replayed, step)):
            xs, ys = model.ad.asarray(x), model.ad.asarray(y)
            losses.append([float(run(xs, ys)) for _ in range(5)])
        assert losses[0] == losses[1] and len(set(losses[0])) == 5
        assert step.recorded == 1 and replayed.state.numpy().tolist() == [5, 5]
        for name, p in direct.params.items():
            np.testing.assert_array_equal(
                np.asarray(p.array), np.asarray(replayed.params[name].array)
            )


class Generator:
    """A generator's state held the way a layer holds it: an attribute, advanced in place."""

    def __init__(self, state: client.RemoteArray) -> None:
        self.state = state


@pytest.mark.parametrize("step_inside", [False, True])
def test_a_jitted_draw_is_fresh_at_every_replay(dev, xp, step_inside: bool) -> None:
    """``random`` reads the state, ``state += step`` advances it in place: each replay draws
    the next numbers, those that the draws sent op by op from the same state give, and numpy's
    locally. The step is a constant recorded into the graph, or an array bound by identity."""
    ext = extension_of(xp)
    gen = Generator(xp.asarray(np.array([2028, 7], dtype=np.uint64)))
    state, outside = gen.state, xp.asarray(STEP)

    @jit
    def noisy(x: client.RemoteArray) -> client.RemoteArray:
        u = ext.random(gen.state, op="normal", shape=x.shape, dtype="float64")
        gen.state += xp.asarray(STEP) if step_inside else outside
        return x + u

    x = xp.zeros((3, 4), dtype=xp.float64)
    drawn = [noisy(x).numpy() for _ in range(5)]
    assert noisy.recorded == 1 and noisy.calls == 5
    assert gen.state is state and state.numpy().tolist() == [2028, 12]

    local_state = np.array([2028, 7], dtype=np.uint64)
    local = extension_of(np)
    for got in drawn:
        np.testing.assert_array_equal(
            got, local.random(local_state, op="normal", shape=(3, 4), dtype="float64")
        )
        local_state += STEP
    state[...] = xp.asarray(np.array([2028, 7], dtype=np.uint64))
    op_by_op = []
    for _ in range(5):
        op_by_op.append(ext.random(state, op="normal", shape=(3, 4), dtype="float64").numpy())
        state += outside
    np.testing.assert_array_equal(np.stack(drawn), np.stack(op_by_op))
    assert len({a.tobytes() for a in drawn}) == 5


def test_a_captured_cnn_exports_with_a_dynamic_batch(dev, xp) -> None:
    """The forward pass in eval mode (no dropout), captured on the server with its weights as
    constants, exported once and run by onnxruntime at two batch sizes: each equals what the
    server computes for that batch."""

    def forward(x: Any, p: dict[str, Any]) -> Any:
        ext = extension_of(xp)
        h = ext.conv(x, p["w1"], stride=(1, 1), padding=((1, 1), (1, 1)), dilation=(1, 1), groups=1)
        h = ext.pool("max", xp.maximum(h, 0.0), kernel=(2, 2), stride=(2, 2), padding=(0, 0))
        h = ext.batch_norm(h, p["mean"], p["var"], p["gamma"], p["beta"], eps=1e-5)
        return ext.softmax("log_softmax", xp.reshape(h, (h.shape[0], -1)) @ p["w"], axis=-1)

    values = _parameters()
    values["w"] = np.random.default_rng(1).standard_normal((64, 3)).astype(np.float32)
    images = xp.asarray(_images(4))
    with Capture(dev) as cap:
        params = {k: xp.asarray(v) for k, v in values.items()}  # uploaded inside: constants
        cap.output("log_probs", forward(cap.input("images", images), params))
    model = cap.graph.to_onnx(dynamic_batch=True)
    params = {k: xp.asarray(v) for k, v in values.items()}
    for n in (4, 9):
        got = run_onnx(model, {"images": _images(n)})["log_probs"]
        want = forward(xp.asarray(_images(n)), params).numpy()
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def test_a_model_in_training_mode_is_refused_for_export_with_the_reason(dev, xp) -> None:
    """Its dropout draws on the device, from a state it advances: no ONNX op draws Philox's
    numbers. In eval mode the same model exports (its parameters the graph's inputs, here)."""
    ad = Autodiff(xp)
    model = nn.Sequential(nn.Linear(6, 4, ad=ad), nn.Dropout(0.5), nn.Linear(4, 2, ad=ad))
    x = ad.asarray(np.ones((3, 6), dtype=np.float32))
    model(x)  # the first draw makes the device's generator, outside the capture
    captures = []
    for mode in ("train", "eval"):
        getattr(model, mode)()
        with Capture(dev, implicit=True) as cap:
            cap.output("y", model(ad.tensor(cap.input("x", x.array))).array)
        captures.append(cap)
    with pytest.raises(OnnxExportError, match=r"cannot export op \d+ \(random_uniform.*eval mode"):
        captures[0].graph.to_onnx(dynamic_batch=True)
    graph, bound = captures[1].graph, captures[1].input_ids
    values = {p.array.tensor_id: p.array.numpy() for p in model.parameters()}
    feeds = {"x": np.ones((5, 6), dtype=np.float32)}
    feeds |= {t.name: values[i] for t, i in zip(graph.inputs[1:], bound[1:], strict=True)}
    got = run_onnx(graph.to_onnx(dynamic_batch=True), feeds)["y"]
    want = model(ad.asarray(feeds["x"])).array.numpy()
    np.testing.assert_allclose(got, want, rtol=1e-6)


def _classifier(ad: Autodiff) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 3, 3, padding=1, ad=ad),
        nn.BatchNorm2d(3, ad=ad),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Dropout(0.25),
        nn.Linear(3 * 4 * 4, 4, ad=ad),
    )


def test_a_trained_model_exports_with_its_weights_as_constants(dev, xp) -> None:
    """``implicit="constants"``: the parameters and running statistics a forward pass reads
    become the graph's constants (ONNX initializers), read from the server when the scope
    closes; the model's only input is the batch. A training-mode forward, which updates the
    running statistics in place, cannot freeze them."""
    ad = Autodiff(xp)
    nn.manual_seed(0)
    model = _classifier(ad)
    model(ad.asarray(_images(8)))  # training mode: the running statistics move from 0 and 1
    images = xp.asarray(_images(4))
    with pytest.raises(CaptureError, match="writes into constant"):
        with Capture(dev, implicit="constants") as cap:
            model(ad.tensor(cap.input("x", images)))
    model.eval()
    with Capture(dev, implicit="constants") as cap:
        cap.output("logits", model(ad.tensor(cap.input("x", images))).array)
    assert [t.name for t in cap.graph.inputs] == ["x"]
    exported = cap.graph.to_onnx(dynamic_batch=True)
    for n in (4, 7):
        want = model(ad.asarray(_images(n))).array.numpy()
        got = run_onnx(exported, {"x": _images(n)})["logits"]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    with pytest.raises(CaptureError, match="record-only capture device"):
        Capture(client.open_device("capture:"), implicit="constants")
