"""examples/ against a real server."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

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
