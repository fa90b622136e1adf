"""server.process, the launcher the tests and the benchmarks share: the address line (ws and
wss, IPv4, IPv6 and names), output drained so a chatty server never blocks, the stderr tail
kept and quoted when a start fails, and an import that stays light."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import trustme

import client
from protocol.ops import Binary
from server.process import (
    TAIL_BYTES,
    OutputTail,
    StartError,
    parse_listening,
    start_child,
    start_server,
)

from .servers import ROOT, run_server

LOG_LINE_START = r"^\d{4}-\d\d-\d\dT"


@pytest.mark.parametrize(
    ("line", "parsed"),
    [
        ("listening on ws://127.0.0.1:8765", ("ws://127.0.0.1:8765", "127.0.0.1", 8765)),
        ("listening on wss://127.0.0.1:443", ("wss://127.0.0.1:443", "127.0.0.1", 443)),
        ("listening on ws://[::1]:40001", ("ws://[::1]:40001", "::1", 40001)),
        ("listening on wss://[fe80::1%eth0]:9", ("wss://[fe80::1%eth0]:9", "fe80::1%eth0", 9)),
        ("listening on ws://gpu-box.local:1", ("ws://gpu-box.local:1", "gpu-box.local", 1)),
        ("listening on http://127.0.0.1:80", None),
        ("listening on ws://::1:80", None),  # IPv6 without brackets is ambiguous
        ("listening on ws://127.0.0.1", None),
        ("serving on ws://127.0.0.1:80", None),
    ],
)
def test_the_listening_line(line: str, parsed: tuple[str, str, int] | None) -> None:
    assert parse_listening(line) == parsed


@pytest.mark.server
def test_a_wss_server(tmp_path: Path) -> None:
    ca = trustme.CA()
    pem, ca_file = tmp_path / "server.pem", tmp_path / "ca.pem"
    ca.issue_cert("127.0.0.1").private_key_and_cert_chain_pem.write_to_path(str(pem))
    ca.cert_pem.write_to_path(str(ca_file))
    with run_server("--tls-cert", str(pem), "--tls-key", str(pem)) as proc:
        assert (proc.scheme, proc.host) == ("wss", "127.0.0.1")
        assert proc.url == f"wss://127.0.0.1:{proc.port}"
        with client.RemoteDevice(proc.url, ca_file=str(ca_file)) as dev:
            assert client.namespace(dev).arange(4).numpy().tolist() == [0, 1, 2, 3]
        assert proc.stop() == 0


def _has_ipv6_loopback() -> bool:
    if not socket.has_ipv6:
        return False
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as sock:
            sock.bind(("::1", 0))
    except OSError:
        return False
    return True


@pytest.mark.server
@pytest.mark.skipif(not _has_ipv6_loopback(), reason="this machine has no IPv6 loopback (::1)")
def test_an_ipv6_loopback_server() -> None:
    with run_server("--host", "::1") as proc:
        assert (proc.scheme, proc.host) == ("ws", "::1")
        assert proc.url == f"ws://[::1]:{proc.port}"
        socket.create_connection((proc.host, proc.port), timeout=10).close()
        with client.RemoteDevice(proc.url) as dev:
            assert float(client.namespace(dev).sum(client.namespace(dev).ones(5))) == 5.0


@pytest.mark.server
def test_a_chatty_server_never_blocks_on_its_log() -> None:
    """Far more than a pipe buffer (64 KiB) of INFO lines while a client keeps working: the
    launcher drains stderr, keeps its last 64 KiB from a line's start, and the newest line."""
    # --log-rate 0: every line is written, as a server without a bound on them would
    with (
        run_server("--log-level", "INFO", "--log-rate", "0") as proc,
        client.RemoteDevice(proc.url) as dev,
    ):
        xp = client.namespace(dev)
        a = xp.zeros((2,))
        for round_ in range(10):
            for i in range(500):  # one "op failed" line each, about 100 bytes
                out = 10_000_000 + round_ * 1000 + i
                dev.submit_unchecked(Binary(op="matmul", out=out, x1=a.tensor_id, x2=42), a.meta)
            assert float(xp.sum(a + round_)) == 2.0 * round_  # still served
        last = f"-> #{10_000_000 + 9 * 1000 + 499}"
        assert proc.stderr.wait_for(last, timeout=30)
        assert proc.stderr.total > 4 * TAIL_BYTES
        kept = proc.stderr.lines()
        assert TAIL_BYTES - 200 < len(proc.stderr.text().encode()) <= TAIL_BYTES
        assert all(re.match(LOG_LINE_START, line) for line in kept)  # each from its start
        assert all(" INFO op failed " in line for line in kept)
    assert proc.process.returncode == 0  # SIGTERM drained it
    assert " INFO drained" in proc.stderr.lines()[-1]


def test_stdout_after_the_first_line_is_drained_too() -> None:
    code = (
        "import signal, sys\n"
        "print('ready', flush=True)\n"
        "sys.stdout.write('x' * 1_000_000); sys.stdout.flush()\n"  # blocks if nobody reads
        "print('wrote it all', file=sys.stderr, flush=True)\n"
        "signal.pause()\n"
    )
    with start_child([sys.executable, "-c", code]) as proc:
        assert proc.line == "ready"
        assert proc.stderr.wait_for("wrote it all", timeout=60)
        # The write returned once the last bytes were in the pipe; the draining thread may
        # still be reading them (a loaded machine made this race visible): wait for it.
        deadline = time.monotonic() + 30
        while proc.stdout.total < len("ready\n") + 1_000_000 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert proc.stdout.total == len("ready\n") + 1_000_000
        assert len(proc.stdout.text()) <= TAIL_BYTES
    assert proc.process.returncode == -signal.SIGTERM  # when the block ended


def test_a_tail_keeps_whole_lines() -> None:
    read_end, write_end = os.pipe()
    tail = OutputTail(os.fdopen(read_end, "rb"), "test tail", limit=1000)
    with os.fdopen(write_end, "wb") as writer:
        writer.write(b"".join(b"line %04d\n" % i for i in range(1000)))
    assert tail.wait_closed()
    assert tail.closed and tail.total == 10_000
    assert tail.lines() == [f"line {i:04d}" for i in range(900, 1000)]
    assert tail.first_line(timeout=0) == "line 0000"


@pytest.mark.server
def test_a_server_that_exits_raises_with_its_stderr() -> None:
    with pytest.raises(StartError) as info:
        start_server("--device", "remote:ws://gpu-box:8765", cwd=ROOT)
    assert info.value.returncode == 2
    assert "exited with status 2 before printing a line" in str(info.value)
    assert "cannot host a remote server on a remote device" in str(info.value)
    assert info.value.stderr.count("\n") == 1


@pytest.mark.server
def test_a_server_already_on_its_port_raises_with_its_stderr() -> None:
    with run_server() as first, pytest.raises(StartError) as info:
        start_server(command=[sys.executable, "-m", "server", "--port", str(first.port)], cwd=ROOT)
    assert info.value.returncode == 1 and "in use" in info.value.stderr


def test_a_child_that_prints_nothing_is_stopped_after_the_timeout() -> None:
    silent = [sys.executable, "-c", "import signal; signal.pause()"]
    with pytest.raises(StartError, match=r"printed no line within 0.5 s \(stopped\)") as info:
        start_child(silent, timeout=0.5)
    assert info.value.returncode is not None  # not left running


def test_an_unexpected_first_line_is_refused() -> None:
    with pytest.raises(StartError, match="unexpected first line from the server: 'hello'"):
        start_server(command=[sys.executable, "-c", "print('hello')"])


def test_importing_the_launcher_stays_light() -> None:
    heavy = "{'numpy', 'websockets', 'anyio', 'pydantic'}"
    code = f"import sys, server.process; print(sorted({heavy} & set(sys.modules)))"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60
    )
    assert result.returncode == 0 and result.stdout.strip() == "[]", result.stderr
