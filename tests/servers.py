"""Start real ``python -m server`` processes on loopback for tests (and benchmarks)."""

from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LISTENING = re.compile(r"^listening on (wss?://(.+):(\d+))$")


@dataclass
class ServerProcess:
    process: subprocess.Popen[str]
    url: str
    port: int

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10.0) -> int:
        """Send ``sig`` and wait for the exit status."""
        if self.process.poll() is None:
            self.process.send_signal(sig)
        return self.process.wait(timeout)

    def kill(self) -> None:
        self.process.kill()
        self.process.wait(10)


def _read_line(process: subprocess.Popen[str], timeout: float) -> str:
    assert process.stdout is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([process.stdout], [], [], 0.1)
        if ready:
            return process.stdout.readline().rstrip("\n")
        if process.poll() is not None:
            break
    stderr = process.stderr.read() if process.stderr and process.poll() is not None else ""
    raise RuntimeError(
        f"server printed no line within {timeout}s (exit {process.poll()}): {stderr}"
    )


@contextmanager
def run_server(
    *args: str, env: Mapping[str, str] | None = None, timeout: float = 20.0
) -> Iterator[ServerProcess]:
    """``python -m server --port 0 ARGS`` until the block ends; yields its URL."""
    full_env = {**os.environ, **(env or {})}
    process = subprocess.Popen(
        [sys.executable, "-m", "server", "--port", "0", *args],
        cwd=ROOT,
        env=full_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = _read_line(process, timeout)
        match = LISTENING.match(line)
        if match is None:
            raise RuntimeError(f"unexpected first line from server: {line!r}")
        yield ServerProcess(process, match.group(1), int(match.group(3)))
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)
        for stream in (process.stdout, process.stderr):
            if stream is not None:
                stream.close()
