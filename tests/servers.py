"""Real ``python -m server`` processes on loopback for tests: :mod:`server.process` with the
repository root as the working directory and this process's environment plus ``env``."""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from server.process import ServerProcess, start_server

__all__ = ["ROOT", "ServerProcess", "run_server"]

ROOT = Path(__file__).resolve().parent.parent


@contextmanager
def run_server(
    *args: str, env: Mapping[str, str] | None = None, timeout: float = 20.0
) -> Iterator[ServerProcess]:
    """``python -m server --port 0 ARGS`` until the block ends (then SIGTERM, or SIGKILL after
    10 s). Its log is ``proc.stderr`` (:class:`server.process.OutputTail`).

    Raises:
        server.process.StartError: it did not start; the message quotes its stderr.
    """
    with start_server(*args, cwd=ROOT, env={**os.environ, **(env or {})}, timeout=timeout) as proc:
        yield proc
