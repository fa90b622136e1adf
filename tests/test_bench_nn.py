"""The neural-network extension's benches run: ``python -m bench.conv_formulations`` checks every
candidate formulation's result against the server's before timing it (so a candidate or a server
runner that drifts fails here), and ``python -m bench.nn_costs`` prints a count and a time for
every op. Never that anything is fast."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def run_bench(*argv: str) -> str:
    """The output of ``python -m ARGV...`` run from the checkout, which must exit 0."""
    done = subprocess.run(
        [sys.executable, "-m", *argv], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.e2e
def test_conv_formulations_agree_and_print_every_ops_ratios() -> None:
    out = run_bench("bench.conv_formulations", "--seconds", "0.01")
    for op in ("conv", "weight grad", "transpose", "max pool", "avg pool", "max backward"):
        assert any(line.startswith(f"{op} ") for line in out.splitlines()), (op, out)


@pytest.mark.e2e
def test_nn_costs_prints_a_ratio_for_every_op() -> None:
    out = run_bench("bench.nn_costs", "--rounds", "1")
    ops = [
        *("conv", "conv_transpose", "conv_weight_grad", "max_pool", "avg_pool", "batch_norm"),
        *("softmax", "log_softmax", "random_uniform", "random_normal"),
    ]
    summary = {line.split()[0]: line for line in out.splitlines() if line.strip()}
    for op in ops:
        assert op in summary, (op, out)
