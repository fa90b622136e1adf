"""GET /healthz, GET /metrics, structured logs and the SIGTERM drain, through real servers."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from typing import Any

import numpy as np
import pytest
import websockets.sync.client as ws_client
from websockets.exceptions import ConnectionClosed, InvalidStatus

import client
import protocol
from protocol import (
    PROTOCOL_VERSION,
    SERVER_ADAPTER,
    Batch,
    Hello,
    Read,
    ReadReply,
    Welcome,
    decode,
    encode,
)
from protocol.codec import to_frames
from protocol.ops import Binary, Full

from .ops_helpers import health, http_get, metrics, value
from .polling import wait_until
from .servers import ServerProcess, run_server

pytestmark = [pytest.mark.server, pytest.mark.wire]

TOKEN = "metrics-test-token"  # noqa: S105


def test_healthz_serving_and_no_token_needed() -> None:
    with run_server("--token", TOKEN) as proc:
        status, body = health(proc.port)
        assert status == 200
        assert body == {
            "status": "serving",
            "protocol": PROTOCOL_VERSION,
            "device": "ndarray",
            "version": protocol.__version__,
        }
        status, _, _ = http_get(proc.port, "/healthz?verbose=1")
        assert status == 200


def test_metrics_need_the_token_when_one_is_set() -> None:
    with run_server("--token", TOKEN) as proc:
        assert http_get(proc.port, "/metrics")[0] == 401
        assert http_get(proc.port, "/metrics", token="wrong")[0] == 401
        assert http_get(proc.port, "/metrics", token=TOKEN)[0] == 200
    with run_server("--token", TOKEN, "--metrics-auth", "none") as proc:
        assert http_get(proc.port, "/metrics")[0] == 200


def test_metrics_move_as_a_session_works() -> None:
    with run_server("--token", TOKEN) as proc:
        before = metrics(proc.port, TOKEN)
        assert value(before, "tensorwire_sessions_open") == 0
        assert value(before, "tensorwire_ops_total", kind="matmul") == 0
        assert value(before, "tensorwire_refusals_total", limit="auth") == 0

        with pytest.raises(client.AuthenticationError):
            client.RemoteDevice(proc.url, token="wrong")
        dev = client.RemoteDevice(proc.url, token=TOKEN)
        xp = client.namespace(dev)
        a = xp.ones((64, 32), dtype=xp.float32)
        b = xp.exp(a @ xp.ones((32, 16), dtype=xp.float32))
        np.testing.assert_allclose(b.numpy(), np.exp(np.full((64, 16), 32.0, np.float32)))
        bad = dev.submit_unchecked(
            Binary(op="matmul", out=10**6, x1=a.tensor_id, x2=a.tensor_id), a.meta
        )
        with pytest.raises(client.RemoteError):
            bad.numpy()
        held = dev.stats()

        during = metrics(proc.port, TOKEN)
        assert value(during, "tensorwire_sessions_open") == 1
        assert value(during, "tensorwire_sessions_opened_total") == 1
        assert value(during, "tensorwire_refusals_total", limit="auth") == 1
        assert value(during, "tensorwire_ops_total", kind="matmul") == 1
        assert value(during, "tensorwire_ops_total", kind="exp") == 1
        assert value(during, "tensorwire_ops_total", kind="full") == 2
        assert value(during, "tensorwire_op_errors_total", code="invalid_op") == 1
        assert value(during, "tensorwire_tensors_held") == held.tensors
        assert value(during, "tensorwire_tensor_bytes_held") == held.tensor_bytes > 0
        assert value(during, "tensorwire_read_seconds_count") == 2  # b and bad
        assert value(during, "tensorwire_read_seconds_sum") > 0
        assert value(during, "tensorwire_received_bytes_total") > value(
            before, "tensorwire_received_bytes_total"
        )
        assert value(during, "tensorwire_sent_bytes_total") >= 64 * 16 * 4  # b's bytes

        del a, b, bad
        dev.sync()
        dev.sync()  # the frees travel with the first sync
        assert value(metrics(proc.port, TOKEN), "tensorwire_tensor_bytes_held") == 0
        dev.close()
        wait_until(
            lambda: value(metrics(proc.port, TOKEN), "tensorwire_sessions_open") == 0,
            "the closed session to leave the gauge",
        )
        after = metrics(proc.port, TOKEN)
        assert value(after, "tensorwire_ops_total", kind="matmul") == 1  # kept after close
        assert value(after, "tensorwire_tensors_held") == 0


def test_metrics_on_their_own_port() -> None:
    args = ["--metrics-port", "0", "--memory-budget", "1GiB", "--log-format", "json"]
    with run_server(*args, "--log-level", "info") as proc:
        assert proc.stderr.wait_for("\n", timeout=10)  # written before stdout's line
        listening = json.loads(proc.stderr.lines()[0])
        assert listening["event"] == "listening"
        metrics_port = int(listening["metrics_port"])
        assert metrics_port not in (proc.port, 0)
        assert http_get(proc.port, "/metrics")[0] == 426  # the main port only upgrades
        samples = metrics(metrics_port)
        assert value(samples, "tensorwire_sessions_open") == 0
        assert value(samples, "tensorwire_memory_budget_bytes") == 2**30
        assert http_get(metrics_port, "/healthz")[0] == 200
        assert http_get(metrics_port, "/")[0] == 404


def _hello(ws: ws_client.ClientConnection) -> Welcome:
    ws.send(to_frames(encode(Hello(protocol=PROTOCOL_VERSION))))
    welcome, _ = decode(SERVER_ADAPTER, ws.recv(decode=False))
    assert isinstance(welcome, Welcome)
    return welcome


def test_sigterm_drains_in_flight_reads_then_exits_0() -> None:
    """A read the server has received is answered after SIGTERM; /healthz says 503 meanwhile,
    new sessions are refused, and the session is then closed with 1001."""
    shape = (4096, 4096)  # 64 MiB of float32: more than the socket buffers hold
    with run_server(
        "--shutdown-grace", "60", "--log-level", "info", "--log-format", "json"
    ) as proc:
        # max_queue=1: the client stops reading after one frame, so the reply stays in flight
        with ws_client.connect(proc.url, compression=None, max_size=None, max_queue=1) as ws:
            _hello(ws)
            batch = Batch(
                ops=[Full(out=1, shape=shape, dtype="float32", value=1.5)],
                requests=[Read(request_id=1, tensor=1)],
            )
            ws.send(to_frames(encode(batch)))
            wait_until(
                lambda: value(metrics(proc.port), "tensorwire_messages_in_flight") == 1,
                "the server to hold the read",
            )
            proc.process.send_signal(signal.SIGTERM)
            wait_until(lambda: health(proc.port)[0] == 503, "/healthz to say 503")
            assert health(proc.port)[1]["status"] == "draining"
            check = subprocess.run(  # the container health check fails while draining
                [sys.executable, "-m", "server.healthcheck"],
                capture_output=True,
                text=True,
                env={**os.environ, "TENSOR_SERVER_PORT": str(proc.port)},
                timeout=60,
            )
            assert check.returncode == 1 and check.stdout.startswith("HTTP 503: ")
            with pytest.raises(InvalidStatus) as refused:
                ws_client.connect(proc.url, open_timeout=10).close()
            assert refused.value.response.status_code == 503

            reply, buffers = decode(SERVER_ADAPTER, ws.recv(decode=False))
            assert isinstance(reply, ReadReply) and reply.shape == shape
            data = np.frombuffer(buffers[0], np.float32)
            assert data.size == shape[0] * shape[1] and bool(np.all(data == 1.5))
            with pytest.raises(ConnectionClosed) as closed:
                ws.recv()
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 1001
        assert proc.wait(30) == 0
        events = [json.loads(line)["event"] for line in proc.stderr.lines()]
        assert events.index("draining") < events.index("session closed") < events.index("drained")
        assert "refused" in events


def _hold_a_read(proc: ServerProcess, ws: Any) -> None:
    """Ask for a 64 MiB read that ``ws`` never receives, and wait until the server holds it."""
    _hello(ws)
    batch = Batch(
        ops=[Full(out=1, shape=(4096, 4096), dtype="float32", value=0.0)],
        requests=[Read(request_id=1, tensor=1)],
    )
    ws.send(to_frames(encode(batch)))
    wait_until(
        lambda: value(metrics(proc.port), "tensorwire_messages_in_flight") == 1,
        "the server to hold the read",
    )


def test_drain_gives_up_after_the_grace_period() -> None:
    """A client that never reads its reply cannot hold the server past the grace period."""
    with run_server("--shutdown-grace", "0.5", "--log-level", "info") as proc:
        with ws_client.connect(
            proc.url, compression=None, max_size=None, max_queue=1, close_timeout=1
        ) as ws:
            _hold_a_read(proc, ws)
            proc.process.send_signal(signal.SIGTERM)
            assert proc.wait(60) == 0
        assert "drain cut short sessions_left=1 reason=grace" in proc.stderr.text()


def test_idle_sessions_close_at_once_on_sigterm() -> None:
    with run_server("--shutdown-grace", "60") as proc:
        dev = client.RemoteDevice(proc.url)
        xp = client.namespace(dev)
        assert float(xp.sum(xp.ones((2,)))) == 2.0
        assert proc.stop(signal.SIGTERM, timeout=30) == 0
        with pytest.raises(client.ConnectionLost):
            dev.sync()
        dev.close()


TEXT_LINE = re.compile(
    r'^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z [A-Z]+ [a-z ]+( [a-z_]+=("([^"\\]|\\.)*"|[^ "]+))*$'
)


@pytest.mark.parametrize("fmt", ["json", "text"])
def test_one_line_per_event(fmt: str) -> None:
    with run_server("--token", TOKEN, "--log-level", "info", "--log-format", fmt) as proc:
        with pytest.raises(client.AuthenticationError):
            client.RemoteDevice(proc.url, token="wrong")
        with client.RemoteDevice(proc.url, token=TOKEN) as dev:
            a = client.namespace(dev).zeros((3,))
            a.numpy()
            a_id = a.tensor_id
            bad = dev.submit_unchecked(Binary(op="matmul", out=99, x1=a.tensor_id, x2=42), a.meta)
            with pytest.raises(client.RemoteError):
                bad.numpy()
        assert proc.stop() == 0
        lines = proc.stderr.lines()
    if fmt == "text":
        assert [line for line in lines if not TEXT_LINE.match(line)] == []
        assert any(" refused limit=auth " in line for line in lines)
        return
    events = [json.loads(line) for line in lines]
    assert all({"ts", "level", "event"} <= e.keys() for e in events)
    by_name = {e["event"]: e for e in events}
    assert by_name["refused"]["limit"] == "auth" and "token" in by_name["refused"]["reason"]
    opened, closed = by_name["session opened"], by_name["session closed"]
    assert opened["device"] == 0 and opened["peer"].startswith("127.0.0.1:")
    assert closed["session"] == opened["session"] and closed["peer"] == opened["peer"]
    assert closed["ops"] == 1
    failed = by_name["op failed"]
    assert failed["session"] == opened["session"] and failed["code"] == "unknown_tensor"
    assert failed["op"] == f"matmul(#{a_id}, #42) -> #99" and failed["level"] == "INFO"
    # the client's close and the SIGTERM race: the server may log "session closed" either side
    # of "draining"; the drain is always last
    names = [e["event"] for e in events]
    assert names[-1] == "drained" and names.index("draining") > names.index("session opened")
    assert TOKEN not in "\n".join(lines)


def test_silent_connection_is_counted_as_a_refusal() -> None:
    with run_server("--handshake-timeout", "0.5") as proc:
        with ws_client.connect(proc.url) as ws:  # never says hello
            with pytest.raises(ConnectionClosed) as closed:
                ws.recv(timeout=30)
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008
        samples = metrics(proc.port)
        assert value(samples, "tensorwire_refusals_total", limit="handshake_timeout") == 1
        assert value(samples, "tensorwire_sessions_opened_total") == 0


def test_a_second_signal_ends_the_drain() -> None:
    with run_server("--shutdown-grace", "600", "--log-level", "info") as proc:
        with ws_client.connect(
            proc.url, compression=None, max_size=None, max_queue=1, close_timeout=1
        ) as ws:
            _hold_a_read(proc, ws)
            proc.process.send_signal(signal.SIGTERM)
            wait_until(lambda: health(proc.port)[0] == 503, "/healthz to say 503")
            proc.process.send_signal(signal.SIGINT)
            assert proc.wait(60) == 0  # long before the 600 s grace
        assert "drain cut short sessions_left=1 reason=signal" in proc.stderr.text()
