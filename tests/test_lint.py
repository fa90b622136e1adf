"""The packages stay mypy --strict and ruff clean (configuration in pyproject.toml)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from .servers import ROOT

PACKAGES = ["protocol", "server", "client"]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=600
    )


def test_mypy_strict() -> None:
    result = _run("mypy", *PACKAGES)
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_check_and_format() -> None:
    check = _run("ruff", "check", *PACKAGES, "tests")
    assert check.returncode == 0, check.stdout + check.stderr
    fmt = _run("ruff", "format", "--check", *PACKAGES, "tests")
    assert fmt.returncode == 0, fmt.stdout + fmt.stderr


NEVER_ON_WIRE_INPUT = re.compile(
    r"\bimport pickle\b|\bpickle\.loads?\b|\bcloudpickle\b|\beval\(|\bexec\(|allow_pickle *= *True"
    r"|np\.load\(|numpy\.load\(|dtype=object|dtype=\"O\"|marshal\.loads"
)


def test_nothing_unpickles_or_evaluates() -> None:
    hits = [
        f"{path}:{n}: {line.strip()}"
        for package in ("server", "protocol")
        for path in sorted((ROOT / package).rglob("*.py"))
        for n, line in enumerate(Path(path).read_text().splitlines(), 1)
        if NEVER_ON_WIRE_INPUT.search(line)
    ]
    assert hits == []
