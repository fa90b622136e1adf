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


SOURCES = [*PACKAGES, "bench", "tests", "examples", "tools"]  # every Python file of the repository


def test_mypy_strict() -> None:
    result = _run("mypy", *PACKAGES, "bench")
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_check_and_format() -> None:
    check = _run("ruff", "check", *SOURCES)
    assert check.returncode == 0, check.stdout + check.stderr
    fmt = _run("ruff", "format", "--check", *SOURCES)
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


REASONS = ROOT / "bench" / "REASONS.md"
# A pointer from code to the figure behind a choice: (bench/REASONS.md, 'Entry title'), which may
# wrap across comment or docstring lines.
REASON_POINTER = re.compile(r"bench/REASONS\.md, '([^']+)'")


def _unwrapped(text: str) -> str:
    return re.sub(r"\s*\n\s*(?:# )?", " ", text)


def test_every_pointer_to_the_bench_reasons_names_an_entry() -> None:
    entries = {
        line[3:].strip() for line in REASONS.read_text().splitlines() if line.startswith("## ")
    }
    pointers = {
        (str(path.relative_to(ROOT)), title)
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
        for title in REASON_POINTER.findall(_unwrapped(path.read_text()))
    }
    assert pointers, "no pointer found: the pattern no longer matches how code cites the reasons"
    assert sorted(p for p in pointers if p[1] not in entries) == []


# Formatting is not a size budget: no `# fmt: skip` (or `# fmt: off`) anywhere. A module that
# the formatter makes too long is split, not packed.
def test_no_format_skips() -> None:
    skips = [
        f"{path.relative_to(ROOT)}:{n}"
        for folder in SOURCES
        for path in sorted((ROOT / folder).rglob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(r"#\s*fmt:\s*(?:skip|off)\s*$", line)
    ]
    assert skips == []
