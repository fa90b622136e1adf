"""The house stays in order: imports go downward only (import-linter's contracts in
``pyproject.toml``), modules stay small enough to read, and functions short enough to follow."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from .servers import ROOT

PACKAGES = ("protocol", "server", "client")
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60


def _modules() -> list[Path]:
    return sorted(p for package in PACKAGES for p in (ROOT / package).rglob("*.py"))


def test_the_import_contracts_are_kept() -> None:
    lint = Path(sys.executable).with_name("lint-imports")
    result = subprocess.run(
        [str(lint), "--no-cache", "--no-logo"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "BROKEN" not in result.stdout


def test_no_module_is_over_400_lines() -> None:
    long = {
        str(p.relative_to(ROOT)): n
        for p in _modules()
        if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert long == {}


def test_no_function_is_over_60_lines() -> None:
    long = []
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                assert node.end_lineno is not None
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({lines})")
    assert long == []


def test_no_module_states_an_import_rule_that_nothing_checks() -> None:
    """Import rules live in pyproject.toml, where import-linter checks them, not in prose."""
    stated = [
        str(path.relative_to(ROOT))
        for path in _modules()
        if "Rule: " in (ast.get_docstring(ast.parse(path.read_text())) or "")
    ]
    assert stated == []
