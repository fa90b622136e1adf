"""Access control and connection faults through a real server: token, bind, TLS, Origin,
connection limit, silent/idle/slow clients, deadlines, and clients that die mid-upload or
mid-op. Each checks the documented error, whether the connection is kept, and that another
session's tensors and the server's byte accounting are unaffected."""

from __future__ import annotations

import asyncio
import gc
import ssl
import subprocess
import sys
import time
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import trustme
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.frames import Frame, Opcode

import client
from protocol import PROTOCOL_VERSION, Batch, ErrorCode, ErrorInfo, Read, Sync, encode
from protocol.ops import AnyOp, Binary, Full
from server.__main__ import build_server
from server.listener import Listener
from server.websocket import Upgrades, WebSocketSettings
from server.wire import WireConnection

from .polling import wait_until
from .raw import TOKEN, Raw, RawSocket, Witness
from .servers import ROOT, ServerProcess, run_server

pytestmark = pytest.mark.wire

ONE_THREAD = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


@pytest.fixture(autouse=True)
def _no_token_in_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TENSOR_SERVER_TOKEN", raising=False)


@pytest.fixture(scope="module")
def secured() -> Iterator[ServerProcess]:
    with run_server("--token", TOKEN) as proc:
        yield proc


@pytest.fixture
def witness(secured: ServerProcess) -> Iterator[Witness]:
    w = Witness(secured.url)
    yield w
    w.close()


# --- token -----------------------------------------------------------------------------------


@pytest.mark.parametrize("token", [None, "wrong", TOKEN[:-1], TOKEN + "x", ""])
def test_missing_or_wrong_token_is_a_typed_refusal(
    secured: ServerProcess, witness: Witness, token: str | None
) -> None:
    with pytest.raises(client.AuthenticationError) as info:
        client.RemoteDevice(secured.url, token=token)
    assert info.value.code == ErrorCode.AUTH_FAILED and "TENSOR_SERVER_TOKEN" in str(info.value)
    with pytest.raises(InvalidStatus) as raw:  # refused on the HTTP upgrade: no session exists
        Raw(secured.url, token=token)
    assert raw.value.response.status_code == 401
    assert ErrorInfo.model_validate_json(raw.value.response.body or b"").code == "auth_failed"
    assert witness.dev.stats().connections == 1
    witness.assert_intact()


def test_token_in_another_scheme_is_refused(secured: ServerProcess) -> None:
    import websockets.sync.client

    with pytest.raises(InvalidStatus) as info:
        websockets.sync.client.connect(
            secured.url, additional_headers={"Authorization": f"Basic {TOKEN}"}
        )
    assert info.value.response.status_code == 401


def test_token_is_not_a_hello_field(secured: ServerProcess, witness: Witness) -> None:
    raw = Raw(secured.url, hello=False)
    hello = f'{{"type": "hello", "protocol": {PROTOCOL_VERSION}, "token": "{TOKEN}"}}'.encode()
    raw.send_raw(len(hello).to_bytes(4, "little") + hello)
    reply = raw.recv()
    assert reply.type == "refused" and reply.error.code == ErrorCode.BAD_MESSAGE
    raw.close()
    witness.assert_intact()


@pytest.mark.server
def test_token_from_the_environment_on_both_sides(monkeypatch: pytest.MonkeyPatch) -> None:
    with run_server(env={"TENSOR_SERVER_TOKEN": "from-env"}) as proc:
        with pytest.raises(client.AuthenticationError):
            client.RemoteDevice(proc.url)
        monkeypatch.setenv("TENSOR_SERVER_TOKEN", "from-env")
        with client.RemoteDevice(proc.url) as dev:
            assert client.namespace(dev).ones(2).numpy().tolist() == [1.0, 1.0]


# --- bind ------------------------------------------------------------------------------------


@pytest.mark.server
def test_non_loopback_bind_without_token_refuses_to_start() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "server", "--host", "0.0.0.0", "--port", "0"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and done.stdout == ""
    (line,) = done.stderr.splitlines()
    assert "refusing to bind 0.0.0.0 without a token" in line and "--token" in line
    assert "TENSOR_SERVER_TOKEN" in line


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.1.2.3", "gpu-box.example"])  # noqa: S104
def test_exposed_hosts_need_a_token(host: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        build_server(["--host", host])
    assert info.value.code == 2
    assert capsys.readouterr().err.count("\n") == 1
    assert build_server(["--host", host, "--token", "t"]).warnings == [
        f"serving {host} without TLS: the token and tensors travel in clear; "
        "use --tls-cert/--tls-key"
    ]
    (warning,) = build_server(["--host", host, "--insecure"]).warnings
    assert warning.startswith("--insecure: serving")


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "::1", "127.8.9.10"])
def test_loopback_needs_no_token(host: str) -> None:
    assert build_server(["--host", host]).warnings == []


# --- TLS -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    tmp = tmp_path_factory.mktemp("tls")
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    cert.private_key_and_cert_chain_pem.write_to_path(str(tmp / "server.pem"))
    ca.cert_pem.write_to_path(str(tmp / "ca.pem"))
    return tmp / "server.pem", tmp / "ca.pem"


@pytest.mark.server
def test_tls_verified_with_a_ca_file(tls_files: tuple[Path, Path]) -> None:
    pem, ca = tls_files
    with run_server("--token", TOKEN, "--tls-cert", str(pem), "--tls-key", str(pem)) as proc:
        assert proc.url.startswith("wss://")
        with client.RemoteDevice(proc.url, token=TOKEN, ca_file=str(ca)) as dev:
            a = client.namespace(dev).asarray(np.arange(300_000.0))  # fragments over TLS
            np.testing.assert_array_equal(a.numpy(), np.arange(300_000.0))
        with pytest.raises(client.ConnectionLost, match="CERTIFICATE_VERIFY_FAILED"):
            client.RemoteDevice(proc.url, token=TOKEN)  # verified by default: unknown CA
        with pytest.raises(client.ConnectionLost):
            client.RemoteDevice(proc.url.replace("wss://", "ws://"), token=TOKEN, open_timeout=5)


@pytest.mark.server
def test_bad_tls_files_refuse_to_start(tmp_path: Path) -> None:
    missing = str(tmp_path / "missing.pem")
    done = subprocess.run(
        [sys.executable, "-m", "server", "--tls-cert", missing, "--tls-key", missing],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1
    assert "cannot load --tls-cert" in done.stderr


# --- Origin ----------------------------------------------------------------------------------


def test_foreign_origin_is_refused_by_default(secured: ServerProcess, witness: Witness) -> None:
    with pytest.raises(InvalidStatus) as info:
        Raw(secured.url, origin="http://evil.example")
    assert info.value.response.status_code == 403
    assert ErrorInfo.model_validate_json(info.value.response.body or b"").code == "origin_refused"
    witness.assert_intact()


@pytest.mark.server
def test_allowed_origin_is_accepted() -> None:
    with run_server("--token", TOKEN, "--allowed-origins", "https://app.example") as proc:
        Raw(proc.url, origin="https://app.example").close()
        with pytest.raises(InvalidStatus):
            Raw(proc.url, origin="https://other.example")


# --- connections -----------------------------------------------------------------------------


@pytest.mark.server
def test_too_many_connections() -> None:
    with run_server("--token", TOKEN, "--max-connections", "2") as proc:
        w = Witness(proc.url)
        second = client.RemoteDevice(proc.url, token=TOKEN)
        with pytest.raises(client.ServerBusyError) as info:
            client.RemoteDevice(proc.url, token=TOKEN)
        assert info.value.code == ErrorCode.TOO_MANY_CONNECTIONS
        second.close()

        def connects() -> bool:
            try:
                client.RemoteDevice(proc.url, token=TOKEN).close()
            except client.ServerBusyError:
                return False  # the closed connection's handler has not finished yet
            return True

        wait_until(connects, "a connection slot to be free again")
        w.assert_intact()
        w.close()


@pytest.fixture
def impatient() -> Iterator[ServerProcess]:
    args = (
        "--handshake-timeout",
        "0.5",
        "--idle-timeout",
        "1",
        "--send-timeout",
        "1",
        "--write-limit",
        "64KiB",
    )
    with run_server("--token", TOKEN, *args) as proc:
        yield proc


def server_bytes(url: str) -> int:
    with client.RemoteDevice(url, token=TOKEN) as probe:
        return probe.stats().server_tensor_bytes


def test_silent_client_is_closed_after_handshake_timeout(impatient: ServerProcess) -> None:
    raw = Raw(impatient.url, hello=False)
    with pytest.raises(ConnectionClosed) as info:
        raw.recv()
    assert info.value.rcvd is not None and info.value.rcvd.code == 1008
    assert info.value.rcvd.reason.startswith("idle_timeout: no hello")


def test_idle_client_is_closed(impatient: ServerProcess) -> None:
    dev = client.RemoteDevice(impatient.url, token=TOKEN)
    client.namespace(dev).ones(1000).numpy()
    wait_until(
        lambda: dev._conn._error is not None,  # noqa: SLF001 - closed by the server
        "the server to close the idle session",
    )
    with pytest.raises(client.ConnectionLost) as info:
        dev.sync()
    assert info.value.code == ErrorCode.IDLE_TIMEOUT
    dev.close()
    wait_until(lambda: server_bytes(impatient.url) == 0, "the server to hold no bytes")


@pytest.mark.serial
def test_a_session_busier_than_the_idle_timeout_stays_open(impatient: ServerProcess) -> None:
    """Idle means one wait longer than the timeout, not the time since the session began:
    syncs back to back for 2.5 s (the timeout is 1 s; each waits for its reply, no pauses)
    keep it open, then silence closes it."""
    with client.RemoteDevice(impatient.url, token=TOKEN) as dev:
        x = client.namespace(dev).ones(10)
        start = time.monotonic()
        while time.monotonic() - start < 2.5:
            dev.sync()
        assert float(client.namespace(dev).sum(x)) == 10.0
        wait_until(
            lambda: dev._conn._error is not None,  # noqa: SLF001 - closed by the server
            "the server to close the idle session",
        )
        with pytest.raises(client.ConnectionLost) as info:
            dev.sync()
        assert info.value.code == ErrorCode.IDLE_TIMEOUT


def test_slowloris_upload_is_closed(impatient: ServerProcess) -> None:
    sock = RawSocket(impatient.url)
    sock.hello()
    header = Batch(buffers=[2**20]).model_dump_json().encode()
    sock.frame(len(header).to_bytes(4, "little") + header + b"0123456789", fin=False)
    data = sock.read_until(b"idle_timeout")  # the server's close frame
    sock.close()
    assert b"idle_timeout: nothing received" in data
    wait_until(lambda: server_bytes(impatient.url) == 0, "the server to hold no bytes")


def test_client_that_never_reads_is_dropped(impatient: ServerProcess) -> None:
    sock = RawSocket(impatient.url)
    sock.hello()
    ops: list[AnyOp] = [Full(out=1, shape=(2**21,), dtype="float64", value=1.0)]  # 16 MiB x16
    batch = Batch(ops=ops, requests=[Read(request_id=i, tensor=1) for i in range(16)])
    sock.frame(b"".join(encode(batch)))
    with client.RemoteDevice(impatient.url, token=TOKEN) as probe:
        wait_until(lambda: probe.stats().server_tensor_bytes == 16 * 2**20, "16 MiB held")
        wait_until(lambda: probe.stats().connections == 1, "the drop after --send-timeout")
        assert probe.stats().server_tensor_bytes == 0
    sock.vanish()


# --- clients that die, ops that run long ------------------------------------------------------


def test_client_dying_mid_upload(secured: ServerProcess, witness: Witness) -> None:
    sock = RawSocket(secured.url)
    sock.hello()
    header = Batch(buffers=[8 * 2**20]).model_dump_json().encode()
    sock.frame(len(header).to_bytes(4, "little") + header + b"\x00" * 2**20, fin=False)
    sock.frame(b"\x00" * 2**20, Opcode.CONT, fin=False)
    sock.vanish()  # no close frame, 6 MiB never sent
    wait_until(lambda: witness.dev.stats().connections == 1, "the dead client's session to end")
    witness.assert_intact()


def test_slow_op_does_not_block_other_sessions(secured: ServerProcess, witness: Witness) -> None:
    """While one session's long matmul chain runs, another session's reads and the server's
    pings are served; then its client dies mid-op and the accounting returns to baseline (a
    client that does not resume: a resumable session would wait for it, its tensors kept)."""
    n = 1500
    busy = client.RemoteDevice(secured.url, token=TOKEN, reconnect_attempts=0)
    xp = client.namespace(busy)
    a = xp.ones((n, n))
    m = a
    for _ in range(8):
        m = m @ a  # 8 x 7 GFLOP: seconds, not milliseconds
    done = busy._conn.request(lambda rid: Sync(request_id=rid))  # noqa: SLF001
    in_flight = witness.bytes + 2 * n * n * 8  # a, plus the running matmul's reservation
    wait_until(lambda: witness.server_bytes() >= in_flight, "the first matmul to start")
    np.testing.assert_array_equal(witness.tensor.numpy(), witness.expected)  # served meanwhile
    raw = Raw(secured.url)
    raw.ws.ping().wait(10)  # a pong, from another connection, while numpy runs
    raw.close()
    assert not done.done()  # ... and the chain had not finished
    conn = busy._conn  # noqa: SLF001 - the client dies mid-op: its socket is cut, no close
    conn._ws.abort()  # noqa: SLF001
    with pytest.raises(client.ConnectionLost):
        done.result(30)
    busy.close()
    wait_until(lambda: witness.dev.stats().connections == 1, "the busy session to end")
    wait_until(
        lambda: witness.server_bytes() == witness.bytes, "the worker thread to finish", timeout=100
    )
    witness.assert_intact()


@pytest.mark.server
def test_op_past_its_deadline_closes_the_session() -> None:
    with run_server("--token", TOKEN, "--op-deadline", "0.1", env=ONE_THREAD) as proc:
        w = Witness(proc.url)
        dev = client.RemoteDevice(proc.url, token=TOKEN)
        xp = client.namespace(dev)
        a = xp.ones((3000, 3000), dtype=xp.float32)
        b = a @ a  # 54 GFLOP on one thread: far past 0.1 s
        with pytest.raises(client.ConnectionLost) as info:
            b.numpy()
        assert info.value.code == ErrorCode.DEADLINE_EXCEEDED
        assert "per-op deadline" in str(info.value)
        dev.close()
        np.testing.assert_array_equal(w.tensor.numpy(), w.expected)  # served during the op
        wait_until(lambda: w.server_bytes() == w.bytes, "the op's bytes to go", timeout=100)
        w.assert_intact()
        w.close()


def test_matmul_op_types_are_still_checked(secured: ServerProcess, witness: Witness) -> None:
    raw = Raw(secured.url)
    ops: list[AnyOp] = [
        Full(out=1, shape=(2, 3), dtype="float64", value=1.0),
        Binary(op="matmul", out=2, x1=1, x2=1),
    ]
    (reply,) = raw.request(Batch(ops=ops, frees=[1], requests=[Read(request_id=1, tensor=2)]))
    assert reply.error.code == ErrorCode.INVALID_OP
    raw.request(Batch(frees=[2], requests=[Sync(request_id=2)]))
    raw.close()
    witness.assert_intact()


@pytest.mark.server
def test_client_that_does_not_answer_pings_is_dropped() -> None:
    with run_server("--token", TOKEN, "--ping-interval", "0.2", "--ping-timeout", "0.2") as proc:
        sock = RawSocket(proc.url)  # answers nothing, not even pings
        sock.hello()
        data = sock.read_until(b"keepalive ping timeout")
        sock.close()
        assert b"keepalive ping timeout" in data
        wait_until(lambda: server_bytes(proc.url) == 0, "the server to hold no bytes")


def test_permessage_deflate_is_never_negotiated(secured: ServerProcess) -> None:
    import websockets.sync.client

    headers = {"Authorization": f"Bearer {TOKEN}"}
    with websockets.sync.client.connect(secured.url, additional_headers=headers) as ws:
        assert ws.response is not None  # the client offered deflate (its default) ...
        assert "Sec-WebSocket-Extensions" not in ws.response.headers  # ... and got none


def test_broken_websocket_framing_closes_with_1002(
    secured: ServerProcess, witness: Witness
) -> None:
    sock = RawSocket(secured.url)
    sock.hello()
    sock.sock.sendall(Frame(Opcode.BINARY, b"unmasked").serialize(mask=False, extensions=[]))
    data = sock.read_until(b"incorrect masking")  # RFC 6455: client frames must be masked
    sock.close()
    assert b"\x03\xea" in data  # close code 1002, protocol error
    wait_until(lambda: witness.dev.stats().connections == 1, "the broken session to end")
    witness.assert_intact()


@pytest.mark.server
def test_a_flooding_client_is_held_back_by_tcp() -> None:
    """While a session's slow op runs, it cannot queue more than a few messages in the
    server: the server stops reading the socket and the sender's kernel buffer fills."""
    with run_server("--token", TOKEN, "--max-queued", "2", env=ONE_THREAD) as proc:
        w = Witness(proc.url)
        sock = RawSocket(proc.url)
        sock.hello()
        ops: list[AnyOp] = [Full(out=1, shape=(1500, 1500), dtype="float64", value=1.0)]
        ops += [Binary(op="matmul", out=i, x1=i - 1, x2=1) for i in range(2, 10)]
        sock.frame(b"".join(encode(Batch(ops=ops))))
        upload = Batch(buffers=[2**20])
        message = Frame(Opcode.BINARY, b"".join(encode(upload, [memoryview(bytes(2**20))])))
        wire = message.serialize(mask=True, extensions=[])
        sock.sock.setblocking(False)
        sent = 0
        with pytest.raises(BlockingIOError):
            while sent < 256 * 2**20:
                sent += sock.sock.send(wire)
        assert sent < 64 * 2**20  # a few queued MiB plus socket buffers, not 256 MiB
        np.testing.assert_array_equal(w.tensor.numpy(), w.expected)  # others are served
        sock.vanish()
        wait_until(lambda: w.server_bytes() == w.bytes, "the flood's bytes to go", timeout=100)
        w.assert_intact()
        w.close()


@pytest.mark.server
def test_a_client_gone_during_a_long_op_ends_its_session_at_once() -> None:
    """The session does not wait for numpy: a 432 GFLOP matmul on one thread runs for
    minutes, and the session of the client that asked for it ends as soon as it is gone (the
    worker thread finishes alone, then its memory is given back)."""
    with run_server("--token", TOKEN, env=ONE_THREAD) as proc:
        sock = RawSocket(proc.url)
        sock.hello()
        ops: list[AnyOp] = [Full(out=1, shape=(6000, 6000), dtype="float64", value=1.0)]
        ops.append(Binary(op="matmul", out=2, x1=1, x2=1))
        sock.frame(b"".join(encode(Batch(ops=ops, requests=[Read(request_id=1, tensor=2)]))))
        with client.RemoteDevice(proc.url, token=TOKEN) as probe:
            wait_until(
                lambda: probe.stats().server_tensor_bytes == 6000 * 6000 * 8, "the matmul to run"
            )
            sock.vanish()
            wait_until(lambda: probe.stats().connections == 1, "the vanished session to end")
            # its tensors stay counted until the thread lets go of them: real memory
            assert probe.stats().server_tensor_bytes == 6000 * 6000 * 8


@pytest.mark.server
def test_sigterm_exits_after_the_grace_while_numpy_runs() -> None:
    with run_server("--token", TOKEN, "--shutdown-grace", "1", env=ONE_THREAD) as proc:
        dev = client.RemoteDevice(proc.url, token=TOKEN)
        a = client.namespace(dev).ones((6000, 6000))  # a @ a: 432 GFLOP on one thread
        pending = dev._conn.request(lambda rid: Sync(request_id=rid))  # noqa: SLF001
        b = a @ a
        dev.flush()
        probe = client.RemoteDevice(proc.url, token=TOKEN)
        wait_until(
            lambda: probe.stats().server_tensor_bytes == 2 * 6000 * 6000 * 8, "the matmul to run"
        )
        assert proc.stop(timeout=15) == 0  # drained for 1 s, then numpy is abandoned
        pending.result(10)  # its reply was sent before the drain (it waits in the socket)
        with pytest.raises(client.ConnectionLost):
            b.numpy()
        probe.close()
        dev.close()


@pytest.mark.serial
@pytest.mark.server
def test_a_session_with_work_in_flight_is_not_idle() -> None:
    """The work (8 single-threaded 2000x2000 matmuls, about 2 s here) outlasts the idle
    timeout, and nothing is sent meanwhile; the client's one gap that counts, from its
    welcome to its batch, is far under the timeout's second."""
    with run_server("--token", TOKEN, "--idle-timeout", "1", env=ONE_THREAD) as proc:
        with client.RemoteDevice(proc.url, token=TOKEN) as dev:
            xp = client.namespace(dev)
            a = xp.ones((2000, 2000))
            m = a
            for _ in range(8):
                m = m @ a / 2000.0  # seconds of work, with nothing sent meanwhile
            np.testing.assert_allclose(m.numpy(), np.ones((2000, 2000)))


@pytest.mark.inprocess
@pytest.mark.asyncio
async def test_a_failed_tls_handshake_leaves_nothing_behind(tls_files: tuple[Path, Path]) -> None:
    """Plain TCP to a TLS port (a probe, a scanner): the handshake fails, asyncio never tells
    the connection it was made or lost, and the listener must keep nothing of it."""
    pem, _ = tls_files
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(pem)
    made: list[weakref.ref[WireConnection]] = []

    def connection(settings: WebSocketSettings, upgrades: Upgrades) -> WireConnection:
        ws = WireConnection(settings, upgrades)
        made.append(weakref.ref(ws))
        return ws

    async def handler(ws: Any) -> None:
        return None

    listener = Listener(handler, lambda ws, request: None, WebSocketSettings(None), connection)
    await listener.start("127.0.0.1", 0, context)
    try:
        for _ in range(3):
            reader, writer = await asyncio.open_connection("127.0.0.1", listener.port)
            writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")  # no TLS ClientHello
            await writer.drain()
            assert await asyncio.wait_for(reader.read(), 10) == b""  # the server hung up
            writer.close()
            await writer.wait_closed()
        await asyncio.sleep(0.1)  # the server's side of the last one ends
        gc.collect()
        assert len(made) == 3 and [r() for r in made] == [None, None, None]
    finally:
        await listener.close()
