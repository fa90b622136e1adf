"""Training through a real server: the same model and seed give the same losses remotely and on
numpy, and examples/train_mlp.py trains the digits classifier end to end."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

import client
from client import nn, optim
from client.autodiff import Autodiff

from .example_runs import imported, run_main
from .servers import ROOT, ServerProcess, run_server

TRAIN_MLP = ROOT / "examples" / "train_mlp.py"
STEPS = 50


def _fifty_steps(ad: Autodiff) -> list[float]:
    """A small classifier with every layer kind training uses, AdamW and a cosine schedule."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal((96, 16)).astype(np.float32)
    y = (x[:, :4].argmax(axis=1) + 3 * (x[:, 4] > 0)).astype(np.int64)  # 7 classes
    init = np.random.default_rng(0)
    model = nn.Sequential(
        nn.Linear(16, 32, ad=ad, rng=init),
        nn.GELU(),
        nn.LayerNorm(32, ad=ad),
        nn.Linear(32, 32, ad=ad, rng=init),
        nn.Tanh(),
        nn.Linear(32, 7, ad=ad, rng=init),
    )
    opt = optim.AdamW(model.parameters(), lr=1e-2, weight_decay=1e-2)
    schedule = optim.CosineAnnealingLR(opt, T_max=STEPS)
    data, labels = ad.asarray(x), ad.asarray(y)
    losses = []
    for step in range(STEPS):
        rows = ad.asarray(np.arange(step % 3 * 32, step % 3 * 32 + 32))
        loss = nn.cross_entropy(model(ad.take(data, rows, axis=0)), ad.take(labels, rows))
        opt.zero_grad()
        loss.backward()
        opt.step()
        schedule.step()
        losses.append(float(loss))
    return losses


def test_fifty_steps_remote_and_on_numpy_give_the_same_losses(xp: client.Namespace) -> None:
    remote = _fifty_steps(Autodiff(xp))
    local = _fifty_steps(Autodiff(np))
    assert local[-1] < 0.5 * local[0]  # it trained
    # The server runs the same numpy calls in the same order on the same float32 data: the
    # issue allows 1e-6 relative; the losses are in fact identical, bit for bit.
    np.testing.assert_allclose(remote, local, rtol=1e-6)
    assert remote == local


def _train_mlp(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(TRAIN_MLP), *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
    )


@pytest.fixture(scope="module")
def mlp_server() -> Iterator[ServerProcess]:
    with run_server("--token", "mlp-token") as proc:
        yield proc


@pytest.fixture(scope="module")
def train_mlp() -> Iterator[ModuleType]:
    with imported("train_mlp") as module:
        yield module


def _epochs(lines: list[str]) -> list[str]:
    return [line for line in lines if line.startswith("epoch")]


@pytest.mark.e2e
def test_train_mlp_reaches_95_percent_remotely_exactly_as_on_numpy(
    mlp_server: ServerProcess,
    train_mlp: ModuleType,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The example as a user runs it, through a server with a token: 20 epochs, the curves
    as a PNG, the weights as a safetensors file that a local model loads. Then its main in
    this process with --jit and with --local, which print the same epochs, number for number."""
    token = tmp_path / "token"
    token.write_text("mlp-token\n")
    plot, weights = tmp_path / "curves.png", tmp_path / "mlp.safetensors"
    url = mlp_server.url
    remote = _train_mlp(
        "--url",
        url,
        "--token-file",
        str(token),
        "--plot",
        str(plot),
        "--save",
        str(weights),
        cwd=tmp_path,
    )
    assert remote.returncode == 0, remote.stdout + remote.stderr
    lines = remote.stdout.splitlines()
    assert lines[0].startswith(f"training on {url} (server ")
    (held_out,) = [line for line in lines if line.startswith("held-out accuracy")]
    assert float(held_out.split()[-1]) >= 0.95
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    local_model = nn.Sequential(
        nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 10)
    )
    local_model.load(weights)  # the remote model's weights, in a local one
    epochs = _epochs(lines)
    assert len(epochs) == 20
    # the step recorded once and run by id: the same training, epoch for epoch
    jitted, jitted_lines, err = run_main(
        train_mlp, capsys, "--url", url, "--token-file", str(token), "--jit", "--plot", str(plot)
    )
    assert jitted == 0, err
    assert _epochs(jitted_lines) == epochs
    local, local_lines, err = run_main(train_mlp, capsys, "--local", "--plot", str(plot))
    assert local == 0, err
    assert _epochs(local_lines) == epochs


@pytest.mark.e2e
def test_train_mlp_without_the_token_fails_cleanly(mlp_server: ServerProcess) -> None:
    result = subprocess.run(
        [sys.executable, str(TRAIN_MLP), "--url", mlp_server.url, "--quick"],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin"},  # no TENSOR_SERVER_TOKEN(_FILE) from this process
    )
    assert result.returncode == 2
    assert result.stderr.startswith(f"train_mlp.py: {mlp_server.url}: AuthenticationError")
    assert result.stderr.count("\n") == 1


@pytest.mark.e2e
def test_train_mlp_refuses_a_bad_url_or_output_path_in_one_line(tmp_path: Path) -> None:
    """Exit 2 and one line, before any training: not a traceback, not 1 (accuracy missed)."""
    missing = tmp_path / "missing"
    for args in (
        ["--url", "http://127.0.0.1:1", "--quick"],
        ["--local", "--quick", "--save", str(missing / "w.safetensors")],
        ["--local", "--quick", "--plot", str(missing / "c.png")],
    ):
        result = _train_mlp(*args, cwd=tmp_path)
        assert result.returncode == 2, result.stdout + result.stderr
        assert result.stderr.startswith("train_mlp.py: ") and result.stderr.count("\n") == 1
