"""Tests run in parallel worker processes (pytest-xdist: ``-n auto`` in ``pyproject.toml``):
every server they start binds port 0, every file they write is under ``tmp_path``. A test
marked ``serial`` holds a wall-clock bound (a reply within a second, a session kept by pings,
a latency under attack) that the load of other tests beside it could break, so it runs alone.

Each worker holds a lock on a file of the run (the workers' common temporary directory) while
a test runs: a shared lock for a test, an exclusive one for a serial test, which so waits for
the tests in flight and holds the others back. A second lock, the gate, is taken for a moment
before the first: a serial test waits holding it, so that tests starting meanwhile queue behind
it instead of keeping it waiting for good.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

import pytest


class Turns:
    """The locks of one worker; :meth:`take` around each test."""

    def __init__(self, directory: Path) -> None:
        self._gate = self._open(directory / "serial-tests.gate")
        self._room = self._open(directory / "serial-tests.room")

    @staticmethod
    def _open(path: Path) -> IO[bytes]:
        return open(path, "ab")  # held open for the worker's life: the locks are on it

    @contextmanager
    def take(self, item: pytest.Item) -> Iterator[None]:
        alone = item.get_closest_marker("serial") is not None
        fcntl.flock(self._gate, fcntl.LOCK_EX)
        try:
            fcntl.flock(self._room, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        finally:
            fcntl.flock(self._gate, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(self._room, fcntl.LOCK_UN)


def serial_last(items: list[pytest.Item]) -> None:
    """Move the serial tests to the end of the run (in their order), where they wait for fewer
    long tests in flight: pytest-xdist hands out the tests in order, the end last."""
    items.sort(key=lambda item: item.get_closest_marker("serial") is not None)


def turns(config: pytest.Config) -> Turns | None:
    """This worker's locks; None when the tests run in one process (nothing to share)."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        return None
    # a worker's basetemp is the run's basetemp / its name (pytest-xdist): the parent is shared
    return Turns(Path(config.getoption("basetemp")).parent)
