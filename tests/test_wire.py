"""Protocol v1 on the wire: a raw websocket client against a real server."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

import client
from protocol import (
    PROTOCOL_VERSION,
    SERVER_ADAPTER,
    Batch,
    Dropped,
    ErrorCode,
    Hello,
    Read,
    ReadReply,
    Refused,
    SessionError,
    Sync,
    SyncReply,
    Welcome,
    byte_view,
    decode,
    encode,
)
from protocol.codec import encode_header
from protocol.messages import Message, Request
from protocol.ops import Binary, FromBuffer, Unary

from .servers import ServerProcess, run_server

pytestmark = pytest.mark.wire


def _send(ws: ClientConnection, message: Message, buffers: list[memoryview] | None = None) -> None:
    ws.send(b"".join(bytes(c) for c in encode(message, buffers or [])))


def _recv(ws: ClientConnection) -> tuple[Any, list[Any]]:
    data = ws.recv(timeout=10)
    assert isinstance(data, bytes)
    return decode(SERVER_ADAPTER, data)


@pytest.fixture
def raw(server: ServerProcess) -> Iterator[ClientConnection]:
    with connect(server.url, compression=None, max_size=2**26) as ws:
        _send(ws, Hello(protocol=PROTOCOL_VERSION))
        welcome, _ = _recv(ws)
        assert isinstance(welcome, Welcome) and welcome.device_count == 2
        yield ws


def _refusal(url: str, data: bytes) -> Refused:
    with connect(url, compression=None) as ws:
        ws.send(data)
        reply, _ = _recv(ws)
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=10)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1000  # clean close
    assert isinstance(reply, Refused)
    return reply


def test_version_mismatch_is_refused_and_closed_cleanly(url: str) -> None:
    data = b"".join(bytes(c) for c in encode(Hello(protocol=99)))
    reply = _refusal(url, data)
    assert reply.error.code is ErrorCode.VERSION_MISMATCH and reply.protocol == PROTOCOL_VERSION
    assert "v99" in reply.error.message and f"v{PROTOCOL_VERSION}" in reply.error.message


def test_client_raises_version_mismatch(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import client._opening

    newer = PROTOCOL_VERSION + 1
    monkeypatch.setattr(client._opening, "PROTOCOL_VERSION", newer)
    with pytest.raises(client.VersionMismatchError) as refused:
        client.RemoteDevice(url)
    message = str(refused.value)
    assert f"speaks protocol v{PROTOCOL_VERSION}" in message and f"speaks v{newer}" in message
    assert "upgrade the server" in message


def test_first_message_must_be_hello(url: str) -> None:
    reply = _refusal(url, b"".join(bytes(c) for c in encode(Batch())))
    assert reply.error.code is ErrorCode.BAD_MESSAGE


def test_garbage_handshake_is_refused(url: str) -> None:
    assert _refusal(url, b"\xff\x00garbage").error.code is ErrorCode.BAD_MESSAGE


def test_malformed_messages_keep_the_session(raw: ClientConnection) -> None:
    values = np.arange(4, dtype=np.float32)
    _send(
        raw,
        Batch(ops=[FromBuffer(out=1, shape=(4,), dtype="float32", buffer=0)], buffers=[16]),
        [byte_view(values)],
    )
    bad: list[bytes | str] = [
        b"\x03\x00\x00\x00{}}",
        b"\x00",
        '{"type": "batch"}',  # a text frame
        b"".join(bytes(c) for c in encode(Hello(protocol=1))),  # hello twice
        encode_header(Batch(buffers=[4])) + b"12",  # truncated buffers
    ]
    for number, data in enumerate(bad, 2):  # the first batch above is message 1
        raw.send(data)
        reply, _ = _recv(raw)
        assert isinstance(reply, Dropped) and reply.error.code is ErrorCode.BAD_MESSAGE
        assert reply.message == number
    _send(raw, Batch(ops=[Unary(op="exp", out=2, x=1)], requests=[Read(request_id=1, tensor=2)]))
    reply, buffers = _recv(raw)
    assert isinstance(reply, ReadReply) and reply.request_id == 1
    np.testing.assert_array_equal(np.frombuffer(buffers[0], np.float32), np.exp(values))


def test_replies_come_in_request_order(raw: ClientConnection) -> None:
    requests: list[Request] = [
        Sync(request_id=5),
        Read(request_id=6, tensor=77),
        Sync(request_id=7),
    ]
    _send(raw, Batch(requests=requests))
    replies = [_recv(raw)[0] for _ in requests]
    assert [r.request_id for r in replies] == [5, 6, 7]
    assert isinstance(replies[0], SyncReply) and replies[1].type == "request_failed"
    assert replies[1].error.code is ErrorCode.UNKNOWN_TENSOR


def test_reusing_an_id_is_refused_and_keeps_the_tensor(raw: ClientConnection) -> None:
    values = np.ones(2, dtype=np.float64)
    op = FromBuffer(out=1, shape=(2,), dtype="float64", buffer=0)
    _send(raw, Batch(ops=[op], buffers=[16]), [byte_view(values)])
    _send(
        raw, Batch(ops=[Unary(op="negative", out=1, x=1)], requests=[Read(request_id=1, tensor=1)])
    )
    error, _ = _recv(raw)
    assert isinstance(error, SessionError) and error.error.code is ErrorCode.DUPLICATE_TENSOR
    reply, buffers = _recv(raw)
    assert isinstance(reply, ReadReply)
    np.testing.assert_array_equal(np.frombuffer(buffers[0], np.float64), values)


@pytest.mark.server
def test_token_is_checked() -> None:
    with run_server("--token", "s3cret") as proc:
        with pytest.raises(client.AuthenticationError, match="auth_failed"):
            client.RemoteDevice(proc.url, token="wrong")
        with pytest.raises(client.AuthenticationError):
            client.RemoteDevice(proc.url)
        with client.RemoteDevice(proc.url, token="s3cret") as dev:
            assert client.namespace(dev).ones(2).numpy().tolist() == [1.0, 1.0]


def test_a_batch_without_ops_waits_for_earlier_work(raw: ClientConnection) -> None:
    """A read-only batch is answered by the receiving task only when nothing before it is
    unanswered: behind a batch whose matmul runs in a worker thread, its reply comes second."""
    values = np.ones((256, 256), dtype=np.float32)
    upload = FromBuffer(out=1, shape=(256, 256), dtype="float32", buffer=0)
    heavy = Batch(
        ops=[upload, Binary(op="matmul", out=2, x1=1, x2=1)],
        requests=[Read(request_id=1, tensor=2)],
        buffers=[values.nbytes],
    )
    _send(raw, heavy, [byte_view(values)])
    _send(raw, Batch(requests=[Read(request_id=2, tensor=1), Sync(request_id=3)]))
    replies = [_recv(raw) for _ in range(3)]
    assert [r.request_id for r, _ in replies] == [1, 2, 3]
    np.testing.assert_array_equal(np.frombuffer(replies[0][1][0], np.float32), np.full(65536, 256))
    np.testing.assert_array_equal(np.frombuffer(replies[1][1][0], np.float32), np.ones(65536))
