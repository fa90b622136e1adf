"""The suite's tiers: every test carries one marker saying the most it needs, so that
``pytest -m unit`` (or ``inprocess``, ``server``, ``e2e``) runs one tier.

- ``unit``: this process only, no network and no server (a tool such as ruff may run);
- ``inprocess``: loopback sockets from this process only: the real serving code (or a raw
  websocket peer) served here, or a client that finds nothing listening;
- ``server``: ``python -m server`` in a child process (started by the test or its fixture);
- ``e2e``: a program run as its user runs it: an example, the bench, the soak.

A test's tier is the marker on the test, its class or its module (one of them), or else the
highest tier of the fixtures it uses (:data:`FIXTURE_TIERS`), or else ``unit``. A marker may not
be lower than its fixtures'. While a test runs, an audit hook (:func:`sys.addaudithook`) sees
the sockets it binds or connects and the processes it starts: more than its tier allows fails
it, so a marker cannot claim less than the test does.
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

TIERS = ("unit", "inprocess", "server", "e2e")

# Fixtures that start a server (names are suite-wide: a fixture of that name in any module).
# Fixtures built on them (url, dev, xp, witness, ...) need no entry: a test's fixtures include
# what they depend on.
SERVER_FIXTURES = (
    "server",
    "servers",
    "three_devices",
    "counted",
    "impatient",
    "limited",
    "secured",
    "source",
    "target",
    "capped",
    "mlp_server",
    "example_server",
)
FIXTURE_TIERS = {"live": "inprocess"} | dict.fromkeys(SERVER_FIXTURES, "server")

_EXAMPLES = str(Path(__file__).resolve().parent.parent / "examples")


def assign(items: Sequence[pytest.Item]) -> None:
    """Give each item its one tier marker.

    Raises:
        pytest.UsageError: a test has two tier markers, or one lower than a fixture's tier.
    """
    for item in items:
        marked = {mark.name for mark in item.iter_markers() if mark.name in TIERS}
        tiers = [FIXTURE_TIERS.get(name, "unit") for name in item.fixturenames]
        needed = max(tiers, key=TIERS.index, default="unit")
        if len(marked) > 1:
            raise pytest.UsageError(f"{item.nodeid}: one tier, not {sorted(marked)}")
        if not marked:
            item.add_marker(needed)
        elif TIERS.index(declared := marked.pop()) < TIERS.index(needed):
            raise pytest.UsageError(f"{item.nodeid}: marked {declared}, but a fixture is {needed}")


def tier(item: pytest.Item) -> str:
    return next(mark.name for mark in item.iter_markers() if mark.name in TIERS)


class Audit:
    """What the running test did beyond its tier, seen by an audit hook (installed once: a
    hook cannot be removed, so it looks at :attr:`running` and does nothing between tests)."""

    def __init__(self) -> None:
        self.running: str | None = None  # the tier of the test that runs now
        self.beyond: list[str] = []
        sys.addaudithook(self._hook)

    @contextmanager
    def watching(self, item: pytest.Item) -> Iterator[None]:
        self.running, self.beyond = tier(item), []
        try:
            yield
        finally:
            self.running = None

    def _hook(self, event: str, args: tuple[Any, ...]) -> None:
        if self.running is None or self.running == "e2e":
            return
        if event in ("socket.bind", "socket.connect") and self.running == "unit":
            if args[0].family in (socket.AF_INET, socket.AF_INET6):
                self.beyond.append(f"{event.removeprefix('socket.')} {args[1]!r}")
        elif event == "subprocess.Popen":
            argv = [args[1]] if isinstance(args[1], str | bytes) else args[1]
            command = [os.fsdecode(arg) for arg in argv]
            needs = _tier_of_command(command)
            if TIERS.index(needs) > TIERS.index(self.running):
                self.beyond.append(f"{needs}: {' '.join(command)[:200]}")

    def report(self, report: pytest.TestReport) -> None:
        """Fail this phase's report if the test went beyond its tier during it."""
        if self.beyond:
            report.outcome = "failed"
            done = "; ".join(self.beyond)
            report.longrepr = f"marked {tier_of(report)} (tests/tiers.py), but did: {done}"
            self.beyond = []


def tier_of(report: pytest.TestReport) -> str:
    return next(k for k in TIERS if report.keywords.get(k))


def _tier_of_command(argv: list[str]) -> str:
    """The tier a child process needs: an example or the bench is e2e, a server is server;
    anything else (a tool on the sources) any test may run."""
    modules = [module for flag, module in zip(argv, argv[1:], strict=False) if flag == "-m"]
    if any(arg.startswith(_EXAMPLES) for arg in argv) or any(
        module.split(".")[0] == "bench" for module in modules
    ):
        return "e2e"
    return "server" if "server" in modules else "unit"
