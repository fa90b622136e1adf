"""``python -m server``: the listening line, signals, and the startup validator."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import anyio
import pytest

import client
import server
from protocol import CaptureSpec, NdArraySpec, RemoteSpec
from server import ServerConfig, UnsupportedDeviceError

from .servers import ROOT, run_server

# Loaded into the server process through PYTHONPATH: records every bind/listen attempt.
BIND_GUARD = """
import socket, os
_marker = os.environ["BIND_MARKER"]
def _record(name, original):
    def wrapper(self, *args):
        with open(_marker, "a") as f:
            f.write(f"{name} {args}\\n")
        return original(self, *args)
    return wrapper
socket.socket.bind = _record("bind", socket.socket.bind)
socket.socket.listen = _record("listen", socket.socket.listen)
"""


def _run_guarded(
    tmp_path: Path, *args: str, timeout: float = 20
) -> subprocess.CompletedProcess[str]:
    (tmp_path / "sitecustomize.py").write_text(BIND_GUARD)
    env = {
        "PYTHONPATH": str(tmp_path),
        "BIND_MARKER": str(tmp_path / "binds.log"),
        "PATH": "/usr/bin:/bin",
    }
    return subprocess.run(
        [sys.executable, "-m", "server", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.mark.server
@pytest.mark.parametrize(
    "device, expected",
    [
        ("remote:ws://127.0.0.1:9999", "cannot host a remote server on a remote device"),
        ("remote:wss://gpu.example:443/x", "never reuse a client's remote device config"),
        ("capture:ndarray", "cannot host a remote server on a capture device"),
        ("capture:ndarray:3", "serve the inner device instead: --device ndarray:3"),
        ("capture:capture:ndarray", "serve the inner device instead: --device ndarray"),
        ("capture:remote:ws://h:1", "cannot host a remote server on a capture device"),
        ("cuda", "unknown device spec 'cuda'; valid kinds: ndarray, ndarray:N"),
        ("ndarray:zero", "valid kinds: ndarray, ndarray:N, ws://HOST:PORT (or remote:URL)"),
        ("remote:nonsense", "valid kinds"),
    ],
)
def test_validator_refuses_before_binding(tmp_path: Path, device: str, expected: str) -> None:
    port = _free_port()
    result = _run_guarded(tmp_path, "--device", device, "--port", str(port))
    assert result.returncode == 2
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and expected in lines[0], result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "binds.log").exists(), "a socket was bound or listened on"
    with socket.socket() as s:  # and the port is still free
        s.bind(("127.0.0.1", port))


@pytest.mark.server
def test_bind_guard_sees_a_real_bind(tmp_path: Path) -> None:
    """The control for the test above: the guard does record a server that binds."""
    (tmp_path / "sitecustomize.py").write_text(BIND_GUARD)
    env = {"PYTHONPATH": str(tmp_path), "BIND_MARKER": str(tmp_path / "binds.log")}
    with run_server(env=env) as proc:
        assert proc.port > 0
    log = (tmp_path / "binds.log").read_text()
    assert "bind" in log and "listen" in log


@pytest.mark.parametrize(
    "spec", [RemoteSpec(url="ws://127.0.0.1:1"), CaptureSpec(inner=NdArraySpec())]
)
def test_programmatic_entry_raises_typed_error(
    spec: RemoteSpec | CaptureSpec, monkeypatch: pytest.MonkeyPatch
) -> None:
    binds: list[object] = []
    monkeypatch.setattr(socket.socket, "bind", lambda self, *a: binds.append(a))
    threads = threading.active_count()
    config = ServerConfig(device=spec, port=0)
    with pytest.raises(UnsupportedDeviceError, match="cannot host a remote server"):
        server.Server(config)
    with pytest.raises(UnsupportedDeviceError):
        anyio.run(server.serve, config, backend="asyncio")
    assert binds == [] and threading.active_count() == threads


@pytest.mark.server
def test_bad_flags_exit_2_with_one_line(tmp_path: Path) -> None:
    result = _run_guarded(tmp_path, "--port", "70000")
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1
    assert "--port" in result.stderr
    assert not (tmp_path / "binds.log").exists()


@pytest.mark.server
def test_help_lists_the_flags() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "server", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 0
    for flag in ["--device", "--host", "--port"]:
        assert flag in result.stdout


@pytest.mark.server
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signals_close_sessions_and_exit_0(sig: signal.Signals) -> None:
    with run_server() as proc:
        assert proc.url == f"ws://127.0.0.1:{proc.port}"
        dev = client.RemoteDevice(proc.url)
        x = client.namespace(dev).ones(3)
        assert x.numpy().sum() == 3
        assert proc.stop(sig) == 0
        assert proc.stdout.lines() == [proc.line]  # the listening line was the only line
        with pytest.raises(ConnectionError):
            x.numpy()
        dev.close()
