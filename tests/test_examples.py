"""examples/ against a real server: train.py; the CNN and the transformer, whose runs on a
server, replayed (--jit) and on numpy (--local) print the same numbers."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

import client

from .example_runs import imported, run_main
from .servers import ROOT, ServerProcess, run_server

pytestmark = pytest.mark.e2e

TRAIN = ROOT / "examples" / "train.py"


@pytest.fixture(scope="module")
def example_server() -> Iterator[ServerProcess]:
    with run_server("--token", "example-token") as proc:
        yield proc


def test_train_quick_with_token_file_and_plot(
    example_server: ServerProcess, tmp_path: Path
) -> None:
    token = tmp_path / "token"
    token.write_text("example-token\n")
    plot = tmp_path / "loss.png"
    result = subprocess.run(
        [
            sys.executable,
            str(TRAIN),
            "--url",
            example_server.url,
            "--quick",
            "--plot",
            str(plot),
            "--token-file",
            str(token),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith(f"training on {example_server.url} (server ")
    losses = [float(line.split()[-1]) for line in lines if line.startswith("step")]
    assert len(losses) >= 10 and losses[-1] * 100 <= losses[0]
    assert lines[-1] == "converged"
    if importlib.util.find_spec("matplotlib") is not None:  # the optional extra
        assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    else:
        assert not plot.exists() and "matplotlib is not installed" in result.stdout


def test_train_without_the_token_fails_cleanly(example_server: ServerProcess) -> None:
    result = subprocess.run(
        [sys.executable, str(TRAIN), "--url", example_server.url, "--quick"],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin"},  # no TENSOR_SERVER_TOKEN(_FILE) from this process
    )
    assert result.returncode == 2
    assert result.stderr.startswith(f"train.py: {example_server.url}: AuthenticationError")
    assert result.stderr.count("\n") == 1


def _script(name: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``examples/NAME`` run as a user runs it, importing this checkout's packages (where
    another checkout is installed, the script's directory would not find them first)."""
    path = os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH"))))
    return subprocess.run(
        [sys.executable, str(ROOT / "examples" / name), *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": path},
    )


def _results(lines: list[str]) -> list[str]:
    """What a run printed about its training, without where it ran, how long it took and the
    files it wrote: the lines that must be the same on a server, replayed and on numpy."""
    return [line for line in lines if not line.startswith(_ELSEWHERE) and " steps in " not in line]


_ELSEWHERE = ("training ", "curves written to ", "matplotlib is not installed")


def _is_png(path: Path, stdout: str) -> bool:
    if importlib.util.find_spec("matplotlib") is None:  # the optional extra
        return not path.exists() and "matplotlib is not installed" in stdout
    return path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def train_cnn() -> Iterator[ModuleType]:
    with imported("train_cnn") as module:
        yield module


@pytest.fixture(scope="module")
def train_transformer() -> Iterator[ModuleType]:
    with imported("train_transformer") as module:
        yield module


def test_train_cnn_reaches_98_percent_on_a_server_replayed_and_on_numpy_alike(
    example_server: ServerProcess,
    train_cnn: ModuleType,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The CNN example as a user runs it, through a server with a token, its whole default
    training (convolutions, batch norm, pooling and dropout on the device); then its main in
    this process with --jit and with --local, which print the same numbers, epoch for epoch:
    the dropout masks come from the device generator that nn.manual_seed seeds everywhere."""
    token = tmp_path / "token"
    token.write_text("example-token\n")
    plot = tmp_path / "cnn.png"
    url = example_server.url
    remote = _script(
        "train_cnn.py", "--url", url, "--token-file", str(token), "--plot", str(plot), cwd=tmp_path
    )
    assert remote.returncode == 0, remote.stdout + remote.stderr
    lines = remote.stdout.splitlines()
    assert lines[0].startswith(f"training on {url} (server ")
    (held_out,) = [line for line in lines if line.startswith("held-out accuracy")]
    assert float(held_out.split()[-1]) >= 0.98
    assert len([line for line in lines if line.startswith("epoch")]) == 15
    assert _is_png(plot, remote.stdout)
    jitted, jitted_lines, err = run_main(
        train_cnn, capsys, "--url", url, "--token-file", str(token), "--jit", "--plot", str(plot)
    )
    assert jitted == 0, err
    assert _results(jitted_lines) == _results(lines)
    local, local_lines, err = run_main(train_cnn, capsys, "--local", "--plot", str(plot))
    assert local == 0, err
    assert local_lines[0] == "training locally on numpy"
    assert _results(local_lines) == _results(lines)


def test_train_transformer_quick_learns_past_the_unigram_baseline_alike_everywhere(
    example_server: ServerProcess,
    train_transformer: ModuleType,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The transformer example's short version (50 steps) through a server: the validation
    loss per epoch falls and ends below the unigram baseline's; --jit and --local print the
    same numbers and the same sample, character for character."""
    token = tmp_path / "token"
    token.write_text("example-token\n")
    plot = tmp_path / "transformer.png"
    url = example_server.url
    args = ("--quick", "--plot", str(plot))
    remote = _script(
        "train_transformer.py", "--url", url, "--token-file", str(token), *args, cwd=tmp_path
    )
    assert remote.returncode == 0, remote.stdout + remote.stderr
    lines = remote.stdout.splitlines()
    assert f"training on {url} (server " in remote.stdout
    (baseline_line,) = [line for line in lines if line.startswith("unigram baseline")]
    baseline = float(baseline_line.split()[-1])
    epochs = [line for line in lines if line.startswith("epoch")]
    assert len(epochs) == 2
    validation = [float(line.split()[-1]) for line in epochs]
    assert validation[1] < validation[0] < baseline
    final = next(line for line in lines if line.startswith(f"validation loss {validation[1]:.4f}"))
    assert final.endswith("of the unigram baseline's")
    assert "".join(_results(lines[lines.index("sample:") + 1 :])).strip()  # 40 characters
    assert _is_png(plot, remote.stdout)
    jitted, jitted_lines, err = run_main(
        train_transformer, capsys, "--url", url, "--token-file", str(token), "--jit", *args
    )
    assert jitted == 0, err
    assert _results(jitted_lines) == _results(lines)
    local, local_lines, err = run_main(train_transformer, capsys, "--local", *args)
    assert local == 0, err
    assert _results(local_lines) == _results(lines)


SCRIPTS = sorted(  # the examples run as programs; running.py and checkpointing.py serve them
    p.name for p in (ROOT / "examples").glob("*.py") if '__name__ == "__main__"' in p.read_text()
)


@pytest.mark.parametrize("name", SCRIPTS)
def test_every_flag_of_every_example_has_help_and_its_default(name: str, tmp_path: Path) -> None:
    result = _script(name, "--help", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    options = result.stdout.partition("options:\n")[2]
    blocks = [b for b in re.split(r"\n(?=  -)", options) if b.strip()]  # one a flag
    assert len(blocks) > 3
    for block in blocks:  # each says what it is and its default
        words = " ".join(block.split())
        flag = words.split()[0]
        if flag in ("-h,", "--version"):  # no value, no default
            continue
        assert "(default: " in words, f"{name} {flag}: {words}"
        assert len(words.partition("(default: ")[0].split()) > 2, f"{name} {flag}: no help"
    assert "--out DIR" in options and "--version" in options
    version = _script(name, "--version", cwd=tmp_path)
    assert version.stdout.strip() == f"{name} {client.__version__}"


def test_outputs_go_to_the_out_directory_not_the_working_one(tmp_path: Path) -> None:
    out = tmp_path / "results" / "mlp"  # made, with its parents
    result = _script(
        "train_mlp.py",
        "--local",
        "--quick",
        "--out",
        str(out),
        "--save",
        "w.safetensors",
        cwd=tmp_path,
    )
    assert result.returncode in (0, 1), result.stderr  # 1: the quick run misses the goal
    assert sorted(p.name for p in out.iterdir()) == ["train_mlp.png", "w.safetensors"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results"]
    assert f"curves written to {out / 'train_mlp.png'}" in result.stdout
    absolute = tmp_path / "elsewhere.png"  # an absolute path is kept as given
    result = _script("train_mlp.py", "--local", "--quick", "--plot", str(absolute), cwd=tmp_path)
    assert result.returncode in (0, 1) and absolute.read_bytes()[:4] == b"\x89PNG"


def test_the_default_out_directory_is_a_temporary_one() -> None:
    with imported("running") as running:
        assert running.OUT == Path(tempfile.gettempdir()) / "tensorwire-examples"
