"""Sessions that outlive their connection, at the protocol's level (protocol/README.md, "Resuming
a session"), against a real server: raw websocket sessions that announce ``resume``, lose their
TCP connection on purpose and take the session up again (or are refused, and why), the limits
on detached sessions, the secret kept out of the log and the metrics, and replies sent again.

The client's side (reconnecting by itself, resending) is tested through a cutting proxy in
``tests/test_cut_connections.py``; a killed server in ``tests/test_server_killed.py``.
"""

from __future__ import annotations

import socket
import urllib.request
from typing import Any

import numpy as np
import pytest

import client
from protocol import (
    FEATURE_RESUME,
    PROTOCOL_VERSION,
    SERVER_ADAPTER,
    Batch,
    ErrorCode,
    Hello,
    Read,
    ReadReply,
    Refused,
    Resume,
    Stats,
    StatsReply,
    Welcome,
    decode,
)
from protocol.ops import Full, InPlaceBinaryScalar
from protocol.scalars import scalar_from_python

from .polling import wait_until
from .raw import TOKEN, Raw
from .servers import ServerProcess, run_server

pytestmark = [pytest.mark.server, pytest.mark.wire]


class Session:
    """A raw session that announces ``resume``: its welcome, and the means to cut its TCP
    connection (no close frame) and to resume it on a new one."""

    def __init__(self, url: str, token: str | None = TOKEN) -> None:
        self.url, self.token = url, token
        self.raw = Raw(url, token=token, hello=False)
        self.raw.send(Hello(protocol=PROTOCOL_VERSION, features=[FEATURE_RESUME]))
        self.welcome: Welcome = self.raw.recv()
        assert self.welcome.type == "welcome" and self.welcome.resume_secret is not None

    def cut(self) -> None:
        """Lose the connection: no close frame, then a reset. Shut down first: the websockets
        client's own thread, blocked reading the socket, would keep it open past a close."""
        sock = self.raw.ws.socket
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        sock.shutdown(socket.SHUT_RDWR)
        sock.close()

    def resume(self, received: int = 0, secret: str | None = None, token: str | None = None) -> Any:
        """Hello again with a resume claim; the welcome (or refusal) it gets."""
        self.raw = Raw(self.url, token=token or self.token, hello=False)
        claim = Resume(
            session_id=self.welcome.session_id,
            secret=secret or self.welcome.resume_secret or "",
            received=received,
        )
        self.raw.send(Hello(protocol=PROTOCOL_VERSION, features=[FEATURE_RESUME], resume=claim))
        return self.raw.recv()


def _stats(raw: Raw) -> StatsReply:
    (reply,) = raw.request(Batch(requests=[Stats(request_id=99)]))
    assert isinstance(reply, StatsReply)
    return reply


@pytest.fixture(scope="module")
def resumable() -> Any:
    with run_server("--token", TOKEN, "--resume-window", "30", "--log-level", "DEBUG") as proc:
        yield proc


def _read(raw: Raw, request_id: int, tensor: int) -> np.ndarray:
    raw.send(Batch(requests=[Read(request_id=request_id, tensor=tensor)]))
    reply, buffers = decode(SERVER_ADAPTER, raw.ws.recv(timeout=30, decode=False))
    assert isinstance(reply, ReadReply) and reply.request_id == request_id, reply
    return np.frombuffer(buffers[0], dtype=reply.dtype).reshape(reply.shape)


def test_a_session_resumes_with_its_tensors_and_ops_apply_once(resumable: ServerProcess) -> None:
    s = Session(resumable.url)
    one = scalar_from_python(1.0)
    s.raw.send(Batch(ops=[Full(out=1, shape=(4,), value=one, dtype="float64")]))
    s.raw.send(Batch(ops=[InPlaceBinaryScalar(op="add", out=1, scalar=one)]))
    assert isinstance(_stats(s.raw), StatsReply)  # all three arrived
    s.cut()
    welcome = s.resume(received=1)
    assert isinstance(welcome, Welcome) and welcome.resumed and welcome.received == 3
    assert welcome.session_id == s.welcome.session_id
    assert np.array_equal(_read(s.raw, 2, 1), np.full(4, 2.0))  # 1 + 1, once
    s.raw.close()


def test_a_reply_lost_with_its_connection_is_sent_again(resumable: ServerProcess) -> None:
    s = Session(resumable.url)
    one = scalar_from_python(2.5)
    s.raw.send(
        Batch(
            ops=[Full(out=1, shape=(3,), value=one, dtype="float64")],
            requests=[Read(request_id=7, tensor=1)],
        )
    )
    first = s.raw.recv()  # sent; as if lost with the connection: the resume claims none
    assert isinstance(first, ReadReply) and first.request_id == 7
    s.cut()
    welcome = s.resume(received=0)
    assert isinstance(welcome, Welcome) and welcome.received == 1
    again = s.raw.recv()
    assert isinstance(again, ReadReply) and again.request_id == 7  # once more, as it was
    s.raw.close()


def test_the_secret_is_needed_and_so_is_the_token(resumable: ServerProcess) -> None:
    s = Session(resumable.url)
    s.cut()
    wrong = "A" * 43
    refused = s.resume(secret=wrong)
    assert isinstance(refused, Refused) and refused.error.code is ErrorCode.SESSION_UNKNOWN
    assert refused.server_id == s.welcome.server_id
    welcome = s.resume()  # the session was not touched by the wrong claims
    assert isinstance(welcome, Welcome) and welcome.resumed
    s.raw.close()


def test_the_secret_is_never_logged_nor_in_the_metrics(resumable: ServerProcess) -> None:
    s = Session(resumable.url)
    s.cut()
    assert isinstance(s.resume(), Welcome)
    s.raw.close()
    secret = s.welcome.resume_secret
    assert secret is not None
    wait_until(lambda: "session resumed" in resumable.stderr.text(), "the resume's log line", 10)
    request = urllib.request.Request(
        f"http://127.0.0.1:{resumable.port}/metrics", headers={"Authorization": f"Bearer {TOKEN}"}
    )
    with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310 - loopback
        metrics = response.read().decode()
    assert "tensorwire_sessions_resumed_total" in metrics
    assert secret not in resumable.stderr.text() and secret not in metrics


def test_a_detached_session_keeps_its_memory_until_its_window_passes() -> None:
    with run_server("--resume-window", "1.5", "--log-level", "INFO") as proc:
        witness = Raw(proc.url, token=None)
        s = Session(proc.url, token=None)
        one = scalar_from_python(1.0)
        s.raw.send(Batch(ops=[Full(out=1, shape=(1 << 17,), value=one, dtype="float64")]))
        wait_until(lambda: _stats(witness).server_tensor_bytes == 1 << 20, "the tensor", 10)
        s.cut()
        wait_until(lambda: "session detached" in proc.stderr.text(), "the detach", 10)
        assert _stats(witness).server_tensor_bytes == 1 << 20  # still counted, while it waits
        wait_until(lambda: _stats(witness).server_tensor_bytes == 0, "the window to pass", 10)
        refused = s.resume()
        assert isinstance(refused, Refused) and refused.error.code is ErrorCode.SESSION_EXPIRED
        witness.close()


def test_the_oldest_detached_session_is_dropped_past_the_limits() -> None:
    flags = ("--max-detached", "3", "--max-detached-per-token", "2", "--log-level", "INFO")
    with run_server(*flags) as proc:
        a1, a2, b1, a3, b2 = (Session(proc.url, token=t) for t in ("a", "a", "b", "a", "b"))
        for s in (a1, a2, b1, a3):
            s.cut()
            wait_until(
                lambda s=s: f"session={s.welcome.session_id}" in proc.stderr.text(), "log", 10
            )
        wait_until(lambda: "--max-detached-per-token (2)" in proc.stderr.text(), "a drop", 10)
        b2.cut()  # four waiting now: past --max-detached, the oldest of all (a2) goes
        wait_until(lambda: "--max-detached (3)" in proc.stderr.text(), "another drop", 10)
        for dropped in (a1, a2):
            refused = dropped.resume()
            assert isinstance(refused, Refused), refused
            assert refused.error.code is ErrorCode.SESSION_DROPPED
        for kept in (b1, a3, b2):
            assert isinstance(kept.resume(), Welcome)
            kept.raw.close()


def test_a_client_ends_with_session_lost_when_its_window_passed() -> None:
    from bench.cutting_proxy import CuttingProxy, address

    with run_server("--resume-window", "0.5", "--log-level", "INFO") as proc:
        with CuttingProxy(address(proc.url)) as proxy:
            dev = client.RemoteDevice(proxy.url(), reconnect_timeout=5.0)
            x = client.namespace(dev).ones(3)
            assert np.array_equal(x.numpy(), np.ones(3))
            proxy.target = ("127.0.0.1", 1)  # nothing listens: reconnections fail meanwhile
            proxy.cut_all()
            wait_until(lambda: "session detached" in proc.stderr.text(), "the detach", 10)
            wait_until(lambda: "detached session ended" in proc.stderr.text(), "the expiry", 10)
            proxy.target = address(proc.url)
            with pytest.raises(client.SessionLost) as lost:
                x.numpy()
            assert lost.value.reason == "expired" and "resume from a checkpoint" in str(lost.value)
            dev.close()


def test_another_token_cannot_take_a_session_over() -> None:
    with run_server("--resume-window", "30") as proc:  # no token: any bearer is let in
        s = Session(proc.url, token="mine")
        s.cut()
        refused = s.resume(token="theirs")  # the right secret, from another client
        assert isinstance(refused, Refused) and refused.error.code is ErrorCode.SESSION_UNKNOWN
        welcome = s.resume(token="mine")
        assert isinstance(welcome, Welcome) and welcome.resumed
        s.raw.close()


def test_a_session_the_server_ended_is_lost_with_its_reason() -> None:
    with run_server("--idle-timeout", "0.5") as proc:
        dev = client.RemoteDevice(proc.url)
        x = client.namespace(dev).ones(2)
        x.numpy()
        wait_until(lambda: _gone(proc.url), "the idle timeout to end the session", 10)
        with pytest.raises(client.SessionLost) as lost:
            x.numpy()
        assert lost.value.reason == "dropped" and lost.value.code is ErrorCode.IDLE_TIMEOUT
        dev.close()


def _gone(url: str) -> bool:
    """Whether the server holds no session but the one asking."""
    raw = Raw(url, token=None)
    try:
        return _stats(raw).connections == 1
    finally:
        raw.close()


def test_a_client_that_never_acknowledges_cannot_hold_replies_past_the_bound(
    resumable: ServerProcess,
) -> None:
    from server.live import KEPT_MOST

    s = Session(resumable.url)
    many = KEPT_MOST + 1
    s.raw.send(Batch(requests=[Stats(request_id=i) for i in range(many)]))  # ack stays 0
    for _ in range(many):
        assert isinstance(s.raw.recv(), StatsReply)
    s.cut()  # its replies were let go: the session could not resume, so it ended
    refused = s.resume(received=0)
    assert isinstance(refused, Refused) and refused.error.code is ErrorCode.SESSION_DROPPED
