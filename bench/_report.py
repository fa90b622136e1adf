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


def _num(x: float) -> str:
    if x == 0 or 0.01 <= abs(x) < 1e5:
        return f"{x:.3g}" if abs(x) < 100 else f"{x:.0f}"
    return f"{x:.3g}"


def rows(figures: Sequence[Figure]) -> list[list[str]]:
    """The table's rows: workload, figure, value, goal, met, measured, reference."""
    out = []
    for f in figures:
        met = {True: "yes", False: "NO", None: "-"}[f.met]
        reference = f"{f.reference_name}: {f.reference.show()}" if f.reference else ""
        goal = str(f.goal) if f.goal else ""
        out.append([f.workload, f.figure, _num(f.value), goal, met, f.measured.show(), reference])
    return out


HEADERS = ["workload", "figure", "value", "goal", "met", "measured: median [min-max]", "reference"]


def print_table(figures: Sequence[Figure], title: str) -> None:
    """Print the table with rich when installed, as Markdown otherwise."""
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        print(title)
        print(markdown(figures))
        return
    table = Table(title=title)
    for header in HEADERS:
        table.add_column(header, overflow="fold")
    for row in rows(figures):
        table.add_row(*row)
    Console().print(table)


def markdown(figures: Sequence[Figure]) -> str:
    """The table as Markdown, as ``bench/README.md`` shows it."""
    lines = ["| " + " | ".join(HEADERS) + " |", "|" + " --- |" * len(HEADERS)]
    lines += ["| " + " | ".join(row) + " |" for row in rows(figures)]
    return "\n".join(lines)


def write_json(path: Path, meta: dict[str, Any], figures: Sequence[Figure]) -> None:
    """Write ``{"meta": ..., "figures": [...]}`` to ``path`` (parents created)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    body = {"meta": meta, "figures": [f.as_json() for f in figures]}
    path.write_text(json.dumps(body, indent=2) + "\n")
