"""Child processes the suite measures against (a real server, the ceiling peer), started by
:mod:`server.process`, and their memory.

Standard library only (and :mod:`server.process`, which is too; an import contract checks
both). Linux only for memory figures (``/proc``).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

from server.process import ChildProcess, ServerProcess, start_child, start_server

ROOT = Path(__file__).resolve().parent.parent


@contextmanager
def child(args: Sequence[str], timeout: float = 60.0) -> Iterator[ChildProcess]:
    """Run ``python ARGS`` in the repository root until the block ends, after its first line
    (``.line``).

    Raises:
        server.process.StartError: it exited or printed nothing within ``timeout`` seconds.
    """
    with start_child([sys.executable, *args], cwd=ROOT, timeout=timeout) as proc:
        yield proc


@contextmanager
def server(
    *args: str, repo: Path = ROOT, env: Mapping[str, str] | None = None
) -> Iterator[tuple[str, ServerProcess]]:
    """A real ``python -m server --port 0 ARGS`` of the checkout ``repo`` (this one unless
    told), with ``env`` (this process's environment unless told); yields its URL and the
    process.

    Raises:
        server.process.StartError: the server did not report its address.
    """
    with start_server(*args, cwd=repo, env=env, timeout=60.0) as proc:
        yield proc.url, proc


def _status(pid: int) -> dict[str, int]:
    fields: dict[str, int] = {}
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            key, _, value = line.partition(":")
            if value.strip().endswith("kB"):
                fields[key] = int(value.split()[0]) * 1024
    return fields


def rss(pid: int) -> int:
    """Resident set size of process ``pid`` in bytes."""
    return _status(pid)["VmRSS"]


def peak_rss(pid: int) -> int:
    """Peak resident set size (VmHWM) in bytes since start or :func:`reset_peak`."""
    return _status(pid)["VmHWM"]


def reset_peak(pid: int) -> bool:
    """Reset the peak RSS of ``pid`` to its current RSS (Linux ``clear_refs``); False if the
    kernel refuses, in which case the peak counts from the process start.
    """
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as refs:
            refs.write("5")
    except OSError:
        return False
    return True


def cpu_seconds(pid: int) -> float:
    """The CPU time process ``pid``'s threads have used, in seconds, to the nanosecond
    (``/proc/PID/task/*/schedstat``; clock ticks, 10 ms, would round a block of reads to 0)."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/schedstat") as schedstat:
                total += int(schedstat.read().split()[0])
        except (OSError, IndexError, ValueError):  # a thread that ended meanwhile
            continue
    return total / 1e9


def cpu_load() -> str:
    """The 1, 5 and 15 minute load averages and the core count, for the report."""
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} {five:.2f} {fifteen:.2f} on {os.cpu_count()} cores"
