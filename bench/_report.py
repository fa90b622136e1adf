"""Figures, their goals, and how they are printed and written.

Standard library only (``rich`` if installed, for the table): an import contract says so.
"""

from __future__ import annotations

import json
import operator
import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

_COMPARE: dict[str, Callable[[float, float], bool]] = {"<=": operator.le, ">=": operator.ge}


@dataclass(frozen=True)
class Stat:
    """Median, min, max (and p99 where asked) of repeated measurements, in ``unit``."""

    unit: str
    median: float
    min: float
    max: float
    n: int
    p99: float | None = None

    @classmethod
    def of(cls, samples: Sequence[float], unit: str, p99: bool = False) -> Stat:
        """Summarise ``samples`` (at least one). Raises ValueError when empty."""
        if not samples:
            raise ValueError("no samples")
        ordered = sorted(samples)
        tail = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] if p99 else None
        return cls(unit, statistics.median(ordered), ordered[0], ordered[-1], len(ordered), tail)

    def show(self) -> str:
        tail = f" p99 {_num(self.p99)}" if self.p99 is not None else ""
        return f"{_num(self.median)} [{_num(self.min)}-{_num(self.max)}]{tail} {self.unit}"


@dataclass(frozen=True)
class Goal:
    op: str  # "<=" or ">="
    value: float

    def met(self, value: float) -> bool:
        return _COMPARE[self.op](value, self.value)

    def __str__(self) -> str:
        return f"{self.op} {_num(self.value)}"


@dataclass(frozen=True)
class Figure:
    """One row: ``value`` (what the goal judges) from ``measured`` and ``reference``."""

    workload: str
    figure: str
    value: float
    goal: Goal | None
    measured: Stat
    reference: Stat | None = None
    reference_name: str | None = None

    @property
    def met(self) -> bool | None:
        return None if self.goal is None else self.goal.met(self.value)

    def as_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["goal"] = None if self.goal is None else {"op": self.goal.op, "value": self.goal.value}
        data["met"] = self.met
        return data


@dataclass(frozen=True)
class Failure:
    """A workload that raised: its name and the exception's one-line summary. The run goes on
    with the next workload, and its table and JSON show this in place of the figures."""

    workload: str
    error: str

    @classmethod
    def of(cls, workload: str, exc: BaseException) -> Failure:
        lines = str(exc).strip().splitlines()
        return cls(workload, f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__)


def _num(x: float) -> str:
    if x == 0 or 0.01 <= abs(x) < 1e5:
        return f"{x:.3g}" if abs(x) < 100 else f"{x:.0f}"
    return f"{x:.3g}"


def rows(figures: Sequence[Figure], failures: Sequence[Failure]) -> list[list[str]]:
    """The table's rows: workload, figure, value, goal, met, measured, reference; then one
    row per failed workload: its name, ``failed``, and the error where a figure is measured."""
    out = []
    for f in figures:
        met = {True: "yes", False: "NO", None: "-"}[f.met]
        reference = f"{f.reference_name}: {f.reference.show()}" if f.reference else ""
        goal = str(f.goal) if f.goal else ""
        out.append([f.workload, f.figure, _num(f.value), goal, met, f.measured.show(), reference])
    out += [[f.workload, "failed", "-", "", "NO", f.error, ""] for f in failures]
    return out


HEADERS = ["workload", "figure", "value", "goal", "met", "measured: median [min-max]", "reference"]


def print_table(figures: Sequence[Figure], title: str, failures: Sequence[Failure]) -> None:
    """Print the table with rich when installed, as Markdown otherwise."""
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        print(title)
        print(markdown(figures, failures))
        return
    table = Table(title=title)
    for header in HEADERS:
        table.add_column(header, overflow="fold")
    for row in rows(figures, failures):
        table.add_row(*row)
    Console().print(table)


def markdown(figures: Sequence[Figure], failures: Sequence[Failure]) -> str:
    """The table as Markdown, as ``bench/README.md`` shows it."""
    lines = ["| " + " | ".join(HEADERS) + " |", "|" + " --- |" * len(HEADERS)]
    lines += ["| " + " | ".join(row) + " |" for row in rows(figures, failures)]
    return "\n".join(lines)


def write_json(
    path: Path, meta: dict[str, Any], figures: Sequence[Figure], failures: Sequence[Failure]
) -> None:
    """Write ``{"meta": ..., "figures": [...], "failures": [{"workload", "error"}, ...]}`` to
    ``path`` (parents created)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    body = {
        "meta": meta,
        "figures": [f.as_json() for f in figures],
        "failures": [asdict(f) for f in failures],
    }
    path.write_text(json.dumps(body, indent=2) + "\n")
