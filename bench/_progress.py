"""Progress while the suite runs: a rich progress bar when installed, lines on stderr if not."""

from __future__ import annotations

import sys
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any


class Progress:
    """One bar per workload: ``with progress.step(name, ticks) as tick: ... tick() ...``."""

    def __init__(self) -> None:
        self._rich: Any = None
        try:
            from rich.console import Console
            from rich.progress import Progress as RichProgress
            from rich.progress import TimeElapsedColumn
        except ImportError:
            return
        columns = (*RichProgress.get_default_columns()[:-1], TimeElapsedColumn())
        self._rich = RichProgress(*columns, console=Console(stderr=True))  # stdout: the table

    def __enter__(self) -> Progress:
        if self._rich is not None:
            self._rich.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._rich is not None:
            self._rich.stop()

    @contextmanager
    def step(self, name: str, ticks: int) -> Iterator[Callable[[], None]]:
        """A bar of ``ticks`` steps named ``name``; call the yielded function once per step.
        An exception (not Ctrl-C) that ends the step is shown with its traceback, the bar
        marked failed, and raised on."""
        start = time.perf_counter()
        if self._rich is not None:
            task = self._rich.add_task(name, total=ticks)
            try:
                yield lambda: self._rich.advance(task)
            except Exception:
                self._rich.update(task, description=f"{name}: FAILED")
                self._rich.console.print_exception()
                raise
            self._rich.update(task, completed=ticks)
            return
        print(f"{name} ...", file=sys.stderr, flush=True)
        try:
            yield lambda: None
        except Exception:
            traceback.print_exc()
            print(f"{name}: FAILED after {time.perf_counter() - start:.1f} s", file=sys.stderr)
            raise
        print(f"{name}: {time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)
