"""The client's own websocket transport against fake servers: pings answered while idle, a
reader woken when the server goes away, a close that gives up on a silent server."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest
from websockets.frames import Frame, Opcode
from websockets.http11 import Request
from websockets.server import ServerProtocol

import client
import client._buffers
import client._connection
from protocol import (
    CLIENT_ADAPTER,
    PROTOCOL_VERSION,
    Batch,
    Read,
    ReadReply,
    TensorMeta,
    Welcome,
    encode,
)
from protocol.codec import decode, encode_header, to_frames
from protocol.ops import Unary

pytestmark = pytest.mark.wire


def apply_mask(data: bytes, key: bytes) -> bytes:
    """RFC 6455's masking, written independently of the code under test."""
    repeated = np.resize(np.frombuffer(key, np.uint8), len(data))
    return (np.frombuffer(data, np.uint8) ^ repeated).tobytes()


WAIT = 30.0  # seconds: a bound for events that normally take milliseconds


class FakeServer:
    """One websocket connection on loopback, driven by hand: it completes the handshake and
    sends a Welcome, then does only what the test asks."""

    def __init__(self, listener: socket.socket, welcome: bool = True) -> None:
        self.listener = listener
        self.welcome = welcome
        self.url = f"ws://127.0.0.1:{listener.getsockname()[1]}"
        self.protocol = ServerProtocol()
        self.sock: socket.socket | None = None
        self.ready = threading.Event()

    def serve(self) -> None:
        self.sock, _ = self.listener.accept()
        self.sock.settimeout(WAIT)
        while not self.events_of(Request):
            pass
        self.read_message()  # the hello
        if not self.welcome:
            return
        welcome = Welcome(
            protocol=PROTOCOL_VERSION, device_index=0, device_count=1, server_id="s", session_id="t"
        )
        frames = to_frames(encode(welcome))
        assert isinstance(frames, bytes)
        self.protocol.send_binary(frames)
        self.flush()
        self.ready.set()

    def events_of(self, kind: type) -> list[object]:
        assert self.sock is not None
        data = self.sock.recv(1 << 16)
        if not data:
            raise ConnectionError("client left")
        self.protocol.receive_data(data)
        events = self.protocol.events_received()
        for event in events:
            if isinstance(event, Request):
                self.protocol.send_response(self.protocol.accept(event))
        self.flush()
        return [e for e in events if isinstance(e, kind)]

    def read_message(self) -> None:
        while not any(f.opcode is Opcode.BINARY for f in self.events_of(Frame)):  # type: ignore[attr-defined]
            pass

    def flush(self) -> None:
        assert self.sock is not None
        for data in self.protocol.data_to_send():
            if data:
                self.sock.sendall(data)


@contextmanager
def fake_server(welcome: bool = True) -> Iterator[FakeServer]:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        fake = FakeServer(listener, welcome)
        thread = threading.Thread(target=fake.serve, daemon=True)
        thread.start()
        try:
            yield fake
        finally:
            thread.join(WAIT)
            if fake.sock is not None:
                fake.sock.close()


@pytest.mark.inprocess
def test_idle_client_answers_pings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(client._connection, "KEEPALIVE_POLL", 0.01)
    with fake_server() as fake:
        dev = client.RemoteDevice(fake.url)
        assert fake.ready.wait(WAIT)
        fake.protocol.send_ping(b"are you there")
        fake.flush()
        pongs: list[object] = []
        while not pongs:  # nobody reads on the client: its keeper thread must answer
            pongs = [f for f in fake.events_of(Frame) if f.opcode is Opcode.PONG]  # type: ignore[attr-defined]
        assert pongs[0].data == b"are you there"  # type: ignore[attr-defined]
        dev._conn._ws.abort()
        dev.close()


@pytest.mark.inprocess
def test_blocked_reader_wakes_when_the_server_goes_away() -> None:
    with fake_server() as fake:
        dev = client.RemoteDevice(fake.url)
        assert fake.ready.wait(WAIT)
        errors: list[BaseException] = []

        def read() -> None:
            try:
                dev.sync()  # the fake never answers
            except BaseException as exc:  # noqa: BLE001 - recorded for the assertion
                errors.append(exc)

        reader = threading.Thread(target=read)
        reader.start()
        fake.read_message()  # the sync request arrived: the reader waits on the socket
        assert fake.sock is not None
        fake.sock.shutdown(socket.SHUT_RDWR)
        reader.join(WAIT)
        assert not reader.is_alive()
        assert len(errors) == 1 and isinstance(errors[0], client.ConnectionLost)
        with pytest.raises(client.ConnectionLost):
            client.namespace(dev).ones(3)  # every later call fails at once
        dev.close()


@pytest.mark.inprocess
def test_close_gives_up_on_a_silent_server(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(client._connection, "CLOSE_TIMEOUT", 0.2)
    with fake_server() as fake:
        dev = client.RemoteDevice(fake.url)
        assert fake.ready.wait(WAIT)
        dev.close()  # the fake never answers the close frame: cut after CLOSE_TIMEOUT
        with pytest.raises(client.ConnectionLost):
            dev.sync()


@pytest.mark.inprocess
def test_fragmented_reply_with_a_ping_inside_lands_in_the_array() -> None:
    """A read reply in three fragments (16-bit and 64-bit payload lengths) with a ping between
    them: the values arrive whole and the ping is answered."""
    values = np.arange(20000, dtype=np.float32)  # 80000 bytes
    data = values.tobytes()
    with fake_server() as fake:
        dev = client.RemoteDevice(fake.url)
        assert fake.ready.wait(WAIT)
        x = dev.submit_unchecked(Unary(op="exp", out=1, x=1), TensorMeta((20000,), "float32"))
        reply = ReadReply(request_id=1, shape=(20000,), dtype="float32", nbytes=len(data))
        got: list[np.ndarray[Any, Any]] = []
        reader = threading.Thread(target=lambda: got.append(x.numpy()))
        reader.start()
        fake.read_message()  # the read request
        fake.protocol.send_binary(encode_header(reply), fin=False)
        fake.protocol.send_ping(b"mid")
        fake.protocol.send_continuation(data[:1000], fin=False)
        fake.protocol.send_continuation(data[1000:], fin=True)
        fake.flush()
        reader.join(WAIT)
        assert len(got) == 1
        np.testing.assert_array_equal(got[0], values)
        pongs: list[object] = []
        while not pongs:
            pongs = [f for f in fake.events_of(Frame) if f.opcode is Opcode.PONG]  # type: ignore[attr-defined]
        fake.sock.shutdown(socket.SHUT_RDWR)  # type: ignore[union-attr]
        dev.close()


def test_process_exit_closes_an_open_device(url: str) -> None:
    """A device left open closes at exit (weakref.finalize): pending ops are sent, the process
    ends at once and quietly, its daemon keeper thread included."""
    script = (
        "import sys, client\n"
        "dev = client.RemoteDevice(sys.argv[1])\n"
        "x = client.namespace(dev).ones(3) + 1\n"
        "assert x.numpy().tolist() == [2.0, 2.0, 2.0]\n"
        "y = x * 2\n"  # pending at exit
    )
    done = subprocess.run(
        [sys.executable, "-c", script, url], capture_output=True, text=True, timeout=WAIT
    )
    assert done.returncode == 0 and done.stderr == "", done.stderr


@pytest.mark.asyncio
async def test_a_reply_wrapped_as_an_asyncio_future_resolves(url: str) -> None:
    """Nobody calls result(): add_done_callback (asyncio.wrap_future) must get it read."""
    with client.RemoteDevice(url) as dev:
        x = client.namespace(dev).arange(4, dtype="float32") * 2
        reply = dev._conn.request(lambda rid: Read(request_id=rid, tensor=x.tensor_id))
        got = await asyncio.wait_for(asyncio.wrap_future(reply), WAIT)
        np.testing.assert_array_equal(got, np.arange(4, dtype=np.float32) * 2)


@pytest.mark.inprocess
def test_a_server_that_never_welcomes_times_out() -> None:
    with fake_server(welcome=False) as fake:
        with pytest.raises(client.ConnectionLost, match="handshake"):
            client.RemoteDevice(fake.url, open_timeout=0.5)


def test_a_read_interrupted_mid_message_cuts_the_connection(url: str) -> None:
    """An exception while a reply is half read (here: raised by the decoder's sink) must not
    leave the next reader in the middle of a frame: the connection is cut there and then. The
    session resumes on a new one, where the server sends the reply again, whole."""
    with client.RemoteDevice(url) as dev:
        x = client.namespace(dev).ones(1 << 20)  # 8 MiB: a reply in many fragments
        real = client._buffers.PooledDecoder.advance
        calls = 0

        def advance(self: Any, n: int) -> None:
            nonlocal calls
            calls += 1
            if calls == 3:
                raise KeyboardInterrupt
            real(self, n)

        cuts: list[bool] = []
        ws = dev._conn._ws
        real_abort = ws.abort
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(client._buffers.PooledDecoder, "advance", advance)

            def abort() -> None:
                cuts.append(True)
                real_abort()

            mp.setattr(ws, "abort", abort)
            with pytest.raises(KeyboardInterrupt):
                x.numpy()
            assert cuts, "the half-read connection was left open"
        assert np.array_equal(x.numpy(), np.ones(1 << 20))
        assert dev._conn._ws is not ws  # a new connection


def _raw_frames(sock: socket.socket) -> list[tuple[int, bool, bytes, bytes]]:
    """Client frames read off the wire up to the end of one message: (opcode, fin, masking
    key, unmasked payload). Every client frame must be masked (RFC 6455, 5.1)."""

    def exactly(n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = sock.recv(n - len(data))
            assert chunk, "the client left"
            data += chunk
        return data

    frames: list[tuple[int, bool, bytes, bytes]] = []
    while not frames or not frames[-1][1]:
        first, second = exactly(2)
        assert second & 0x80, "an unmasked client frame"
        length = second & 0x7F
        if length >= 126:
            length = int.from_bytes(exactly(2 if length == 126 else 8), "big")
        key = exactly(4)
        payload = apply_mask(exactly(length), key)
        frames.append((first & 0x0F, bool(first & 0x80), key, payload))
    return frames


@pytest.mark.inprocess
@pytest.mark.parametrize("nbytes", [4096, 3 * (1 << 20) // 2 + 4])
def test_uploads_go_out_masked_with_a_fresh_key_per_frame(nbytes: int) -> None:
    """A small upload (one frame) and a large one (a header frame and fragments from the
    caller's memory): every frame masked with its own key, and the message decodes to the
    caller's bytes."""
    values = np.random.default_rng(nbytes).random(nbytes // 4, dtype=np.float32)
    with fake_server() as fake:
        dev = client.RemoteDevice(fake.url)
        assert fake.ready.wait(WAIT)
        assert fake.sock is not None

        def send() -> None:
            client.namespace(dev).asarray(values)
            dev._conn.flush()

        sender = threading.Thread(target=send)
        sender.start()
        frames = _raw_frames(fake.sock)
        sender.join(WAIT)
        assert [f[0] for f in frames] == [Opcode.BINARY] + [Opcode.CONT] * (len(frames) - 1)
        assert len({f[2] for f in frames}) == len(frames)
        message, buffers = decode(CLIENT_ADAPTER, b"".join(f[3] for f in frames))
        assert isinstance(message, Batch) and message.buffers == [values.nbytes]
        assert bytes(buffers[0]) == values.tobytes()
        if nbytes > 1 << 20:
            assert len(frames) > 2 and len(frames[0][3]) < 4096  # the header alone first
        fake.sock.shutdown(socket.SHUT_RDWR)
        dev.close()
