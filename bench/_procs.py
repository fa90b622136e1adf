"""Child processes the suite measures against: a real server and the ceiling peer.

Rule: imports only the standard library. Linux only for memory figures (``/proc``).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LISTENING = re.compile(r"^listening on (ws://[^:]+:(\d+))$")


@dataclass
class Child:
    """A started child process and the first line it printed."""

    process: subprocess.Popen[str]
    line: str

    @property
    def pid(self) -> int:
        return self.process.pid


@contextmanager
def child(args: Sequence[str], timeout: float = 60.0) -> Iterator[Child]:
    """Run ``python ARGS`` in the repository root until the block ends, after its first line.

    Raises:
        RuntimeError: the child exited or printed nothing within ``timeout`` seconds.
    """
    process = subprocess.Popen(
        [sys.executable, *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline().rstrip("\n")
        if not line:
            raise RuntimeError(f"{' '.join(args)} exited with {process.wait(timeout)}")
        yield Child(process, line)
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
        if process.stdout is not None:
            process.stdout.close()


@contextmanager
def server(*args: str) -> Iterator[tuple[str, Child]]:
    """A real ``python -m server --port 0 ARGS``; yields its URL and the process.

    Raises:
        RuntimeError: the server did not report its address.
    """
    with child(["-m", "server", "--port", "0", *args]) as proc:
        match = LISTENING.match(proc.line)
        if match is None:
            raise RuntimeError(f"unexpected first line from the server: {proc.line!r}")
        yield match.group(1), proc


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


def cpu_load() -> str:
    """The 1, 5 and 15 minute load averages and the core count, for the report."""
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} {five:.2f} {fifteen:.2f} on {os.cpu_count()} cores"
