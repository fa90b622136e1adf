"""The scripts of ``examples/`` imported into this process, so that a test about what they
compute runs their ``main`` without starting an interpreter (a test about how a user runs one
starts it: ``subprocess``)."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType

import pytest

from .servers import ROOT

EXAMPLES = ROOT / "examples"


@contextmanager
def imported(name: str) -> Iterator[ModuleType]:
    """``examples/NAME.py`` as a module (it imports its neighbours as a script would)."""
    sys.path.insert(0, str(EXAMPLES))
    try:
        yield importlib.import_module(name)
    finally:
        sys.path.remove(str(EXAMPLES))


def run_main(
    example: ModuleType, capsys: pytest.CaptureFixture[str], *args: str
) -> tuple[int, list[str], str]:
    """The example's ``main(args)`` in this process: its exit status, stdout lines, stderr."""
    status = example.main(list(args))
    out, err = capsys.readouterr()
    return status, out.splitlines(), err
