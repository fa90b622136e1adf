"""``python -m bench.summary RUN.json ...``: the judged figures of several runs side by side.

Prints a Markdown table, one row per judged figure and one column per run (value, and * where
the goal was not met), headed by each run's date and load average, then a row per workload
that failed in some run (``failed`` in that run's column).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def _key(figure: dict[str, Any]) -> str:
    workload = figure["workload"]
    for word in ("100000 ", "10000 ", "16 ", "100 "):
        workload = workload.replace(word, "", 1) if workload.startswith(word) else workload
    return f"{workload}: {figure['figure']}"


def _load(meta: dict[str, Any]) -> str:
    """The 1-minute load average before and after the run."""
    return f"{meta['load_before'].split()[0]}-{meta.get('load_after', '?').split()[0]}"


def table(runs: list[dict[str, Any]], names: list[str]) -> str:
    """Markdown: judged figures (rows) by run (columns)."""
    rows: dict[str, list[str]] = {}
    for i, run in enumerate(runs):
        for figure in run["figures"]:
            if figure["goal"] is None:
                continue
            goal = f"{figure['goal']['op']} {figure['goal']['value']:g}"
            cells = rows.setdefault(f"{_key(figure)} ({goal})", [""] * len(runs))
            cells[i] = f"{figure['value']:.3g}" + ("" if figure["met"] else " *")
        for failure in run.get("failures", []):  # a workload that raised has no figures
            rows.setdefault(f"{failure['workload']}: failed", [""] * len(runs))[i] = "failed"
    header = [f"{name}<br>load {_load(run['meta'])}" for name, run in zip(names, runs, strict=True)]
    lines = ["| figure (goal) | " + " | ".join(header) + " |", "|" + " --- |" * (len(runs) + 1)]
    lines += [f"| {name} | " + " | ".join(cells) + " |" for name, cells in rows.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    paths = [Path(p) for p in (argv if argv is not None else sys.argv[1:])]
    runs = [json.loads(p.read_text()) for p in paths]
    print(table(runs, [p.stem for p in paths]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
