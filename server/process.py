"""Start ``python -m server`` as a child process and learn its address: the one launcher that
the tests and the benchmarks share.

It imports only the standard library (an import contract in ``pyproject.toml`` checks it), so
importing it loads neither numpy, websockets nor anyio. Nothing in the server imports it: a
server never starts processes.

    with start_server("--token", TOKEN, cwd=ROOT) as srv:   # python -m server --port 0 ...
        srv.url, srv.host, srv.port      # "ws://127.0.0.1:PORT", "127.0.0.1", PORT
        ...
        assert srv.stop() == 0           # SIGTERM drains; then the exit status
        log = srv.stderr.text()          # everything it logged (its last 64 KiB)

The server prints one line once bound, ``listening on ws://HOST:PORT`` (``wss://`` with TLS;
an IPv6 HOST in brackets, ``[::1]``). Its stdout and stderr are read continuously on daemon
threads into bounded buffers (:class:`OutputTail`), so a chatty server (``--log-level INFO``
with many sessions) never blocks on a full pipe, and a test can still read its log lines.
:func:`start_child` is the same for any command that announces itself with a first line.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, NamedTuple, Self

__all__ = [
    "LISTENING",
    "TAIL_BYTES",
    "ChildProcess",
    "OutputTail",
    "ServerProcess",
    "StartError",
    "parse_listening",
    "start_child",
    "start_server",
]

TAIL_BYTES = 64 * 1024  # how much of each output stream is kept: the last 64 KiB
_CHUNK = 64 * 1024
_DRAIN_S = 10.0  # how long to wait for a pipe's end once its process has exited
_IN_MESSAGE = 8 * 1024  # how much of the stderr tail a StartError message quotes

LISTENING = re.compile(r"^listening on ((wss?)://(\[[^\]\s]+\]|[^\s\[\]/:]+):(\d+))$")


class StartError(RuntimeError):
    """The child exited, printed nothing within the timeout, or printed an unexpected first
    line. It has been stopped; :attr:`stderr` holds what it wrote there (the last 64 KiB)."""

    def __init__(self, message: str, stderr: str, returncode: int | None) -> None:
        tail = stderr[-_IN_MESSAGE:]
        super().__init__(f"{message}; stderr:\n{tail}" if tail else f"{message}; stderr empty")
        self.stderr = stderr
        self.returncode = returncode


class OutputTail:
    """The last ``limit`` bytes of a pipe, read to its end by a daemon thread.

    The kept text starts at a line boundary once older output is dropped. Read it with
    :meth:`text`; wait for something to appear with :meth:`wait_for`, for the end with
    :meth:`wait_closed`.
    """

    def __init__(self, stream: IO[bytes], name: str, limit: int = TAIL_BYTES) -> None:
        self._stream = stream
        self._limit = limit
        self._buf = bytearray()
        self._head = bytearray()  # the output up to its first newline
        self._first: bytes | None = None
        self._closed = False
        self._cond = threading.Condition()
        self.total = 0  # bytes read so far, kept or not
        self._thread = threading.Thread(target=self._drain, name=name, daemon=True)
        self._thread.start()

    def _drain(self) -> None:
        read1 = getattr(self._stream, "read1", self._stream.read)
        try:
            while chunk := read1(_CHUNK):
                with self._cond:
                    self._add(chunk)
                    self._cond.notify_all()
        except (OSError, ValueError):
            pass  # the pipe broke or was closed under us: the end, as far as we can tell
        finally:
            with self._cond:
                self._closed = True
                self._cond.notify_all()
            self._stream.close()

    def _add(self, chunk: bytes) -> None:
        self.total += len(chunk)
        if self._first is None:
            self._head += chunk
            end = self._head.find(b"\n")
            if end >= 0:
                self._first = bytes(self._head[:end])
                self._head.clear()
            elif len(self._head) > self._limit:
                self._first = bytes(self._head)  # no newline in 64 KiB: take what there is
                self._head.clear()
        self._buf += chunk
        excess = len(self._buf) - self._limit
        if excess > 0:
            newline = self._buf.find(b"\n", excess - 1)  # drop at least `excess`
            del self._buf[: newline + 1 if newline >= 0 else excess]

    def text(self) -> str:
        """What is kept so far (all of it once :meth:`wait_closed` is True and the process
        wrote less than the limit)."""
        with self._cond:
            return self._buf.decode("utf-8", "replace")

    def lines(self) -> list[str]:
        return self.text().splitlines()

    @property
    def closed(self) -> bool:
        """True once the pipe has ended (the process exited or closed it)."""
        with self._cond:
            return self._closed

    def first_line(self, timeout: float) -> str | None:
        """The first line, without its newline; None if the pipe ended, or ``timeout``
        seconds passed, before a whole line arrived."""
        with self._cond:
            self._cond.wait_for(lambda: self._first is not None or self._closed, timeout)
            if self._first is None:
                return None
            return self._first.decode("utf-8", "replace").rstrip("\r")

    def wait_for(self, needle: str, timeout: float) -> bool:
        """Wait until ``needle`` is in the kept text; False if the pipe ended, or ``timeout``
        seconds passed, without it."""
        encoded = needle.encode()
        with self._cond:
            self._cond.wait_for(lambda: encoded in self._buf or self._closed, timeout)
            return encoded in self._buf

    def wait_closed(self, timeout: float = _DRAIN_S) -> bool:
        """Wait for the pipe's end and the thread's exit; False after ``timeout`` seconds (a
        process the child started may still hold the pipe open)."""
        self._thread.join(timeout)
        return not self._thread.is_alive()


class _Started(NamedTuple):
    process: subprocess.Popen[bytes]
    stdout: OutputTail
    stderr: OutputTail
    line: str


class ChildProcess:
    """A child process that announced itself with a first line on stdout (:attr:`line`).

    Its stdout (after that line too) and stderr are drained into :class:`OutputTail` buffers.
    Use it as a context manager, or call :meth:`close`: the child is terminated if it still
    runs.
    """

    def __init__(self, started: _Started) -> None:
        self.process = started.process
        self.stdout = started.stdout
        self.stderr = started.stderr
        self.line = started.line

    @property
    def pid(self) -> int:
        return self.process.pid

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the exit and for both pipes to be drained to their end; the exit status.

        Raises:
            subprocess.TimeoutExpired: still running after ``timeout`` seconds.
            RuntimeError: it exited, but a pipe stayed open (a process it started holds it),
                so what it printed may be cut short.
        """
        status = self.process.wait(timeout)
        if not (self.stdout.wait_closed() and self.stderr.wait_closed()):
            raise RuntimeError(
                f"{self.process.args!r} exited with {status}, but its output pipes stayed "
                f"open for {_DRAIN_S} s: a process it started holds them"
            )
        return status

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10.0) -> int:
        """Send ``sig`` (if it still runs) and :meth:`wait` up to ``timeout`` seconds; the exit
        status (negative: ended by that signal).

        Raises:
            subprocess.TimeoutExpired: it did not exit; it still runs (call :meth:`kill`).
        """
        if self.process.poll() is None:
            self.process.send_signal(sig)
        return self.wait(timeout)

    def kill(self) -> None:
        """SIGKILL, and wait for the end."""
        self.process.kill()
        self.wait(10)

    def close(self) -> None:
        """Terminate the child if it still runs (SIGTERM, then SIGKILL after 10 s) and drain
        its pipes. Safe to call more than once."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
        self.wait(10)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class ServerProcess(ChildProcess):
    """A running ``python -m server``: :attr:`url` as printed (``ws://[::1]:PORT`` for IPv6),
    :attr:`scheme` (``ws`` or ``wss``), :attr:`host` without brackets (for sockets) and
    :attr:`port`.

    Raises:
        ValueError: the first line is not ``listening on ws[s]://HOST:PORT``.
    """

    def __init__(self, started: _Started) -> None:
        super().__init__(started)
        parsed = parse_listening(started.line)
        if parsed is None:
            raise ValueError(f"unexpected first line from the server: {started.line!r}")
        self.url, self.host, self.port = parsed
        self.scheme = self.url.split("://", 1)[0]


def parse_listening(line: str) -> tuple[str, str, int] | None:
    """``(url, host, port)`` of a ``listening on ...`` line (host without IPv6 brackets); None
    for any other line."""
    match = LISTENING.match(line)
    if match is None:
        return None
    return match.group(1), match.group(3).strip("[]"), int(match.group(4))


def start_child(
    argv: Sequence[str],
    *,
    cwd: str | Path | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float = 60.0,
) -> ChildProcess:
    """Run ``argv`` until it prints its first line on stdout; return it running.

    ``env`` is the child's whole environment (default: this process's); ``cwd`` its working
    directory (default: this process's).

    Raises:
        StartError: it exited, or printed no whole line, within ``timeout`` seconds.
        OSError: ``argv[0]`` could not be run.
    """
    return ChildProcess(_spawn(argv, cwd, env, timeout))


def start_server(
    *args: str,
    command: Sequence[str] | None = None,
    cwd: str | Path | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float = 20.0,
) -> ServerProcess:
    """Run ``python -m server --port 0 ARGS`` (this interpreter) until it is listening.

    ``command`` replaces that whole command line (e.g. a container's exact CMD, which takes its
    port from ``TENSOR_SERVER_PORT``); it must print the same first line. ``cwd`` and ``env``
    as for :func:`start_child`: ``python -m server`` must be importable there.

    Raises:
        StartError: the server exited (a bad setting, a port in use), printed nothing within
            ``timeout`` seconds, or printed something other than ``listening on ...``; the
            message quotes its stderr.
    """
    if command is not None and args:
        raise TypeError("pass either ARGS or command, not both")
    argv = command if command is not None else [sys.executable, "-m", "server", "--port", "0"]
    started = _spawn([*argv, *args], cwd, env, timeout)
    try:
        return ServerProcess(started)
    except ValueError as exc:
        child = ChildProcess(started)
        child.close()
        raise StartError(str(exc), child.stderr.text(), child.process.returncode) from None


def _spawn(
    argv: Sequence[str], cwd: str | Path | None, env: Mapping[str, str] | None, timeout: float
) -> _Started:
    process = subprocess.Popen(  # noqa: S603 - the caller's own command line, no shell
        list(argv),
        cwd=cwd,
        env=dict(env) if env is not None else None,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert process.stdout is not None and process.stderr is not None
    stdout = OutputTail(process.stdout, f"stdout of {process.pid}")
    stderr = OutputTail(process.stderr, f"stderr of {process.pid}")
    started = _Started(process, stdout, stderr, "")
    line = stdout.first_line(timeout)
    if line is not None:
        return started._replace(line=line)
    try:  # its stdout ended: it is exiting (or closed stdout, which is as bad)
        status = process.wait(_DRAIN_S) if stdout.closed else None
    except subprocess.TimeoutExpired:
        status = None
    what = (
        f"printed no line within {timeout} s (stopped)"
        if status is None
        else f"exited with status {status} before printing a line"
    )
    ChildProcess(started).close()
    raise StartError(f"{' '.join(argv)} {what}", stderr.text(), process.returncode)
