"""The server wire's states at their edges: bytes held while no decoders are set, a closing
connection, a lost one, and the websocket's timers (the open, close and keepalive timeouts).
Each test runs the real ``WireConnection`` on loopback under the real listener, with a handler
standing in for the connection loop and a hand-written client that can send anything in one
write."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import os
import socket
import struct
import time
from collections.abc import Awaitable, Callable

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response

from protocol import CLIENT_ADAPTER, PROTOCOL_VERSION, Batch, Hello, MessageDecoder, encode
from protocol.framing import Opcode, apply_mask, frame_header
from server.listener import Listener
from server.responses import plain
from server.websocket import WebSocket, WebSocketSettings
from server.wire import WireConnection

pytestmark = [pytest.mark.inprocess, pytest.mark.wire]

Handler = Callable[[WireConnection], Awaitable[None]]
SETTINGS = WebSocketSettings(max_message_size=1 << 20, close_timeout=5)


def _frame(opcode: Opcode, payload: bytes) -> bytes:
    mask = os.urandom(4)
    return frame_header(opcode, True, len(payload), mask) + apply_mask(payload, mask)


def _message(message: Hello | Batch) -> bytes:
    return _frame(Opcode.BINARY, b"".join(bytes(c) for c in encode(message)))


def _decoders() -> MessageDecoder[Hello | Batch]:
    return MessageDecoder(CLIENT_ADAPTER, 1 << 16, max_buffer_bytes=0)


def _upgraded(port: int) -> socket.socket:
    """A raw client socket, upgraded (the 101 response read)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall(
        f"GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n".encode()
    )
    response = b""
    while not response.endswith(b"\r\n\r\n"):  # byte by byte: frames may follow at once
        response += sock.recv(1)
    assert response.startswith(b"HTTP/1.1 101"), response
    return sock


def _upgrade_all(ws: WebSocket, request: Request) -> Response | None:
    return None


async def _serve(
    handler: Handler,
    client: Callable[[int], None],
    settings: WebSocketSettings = SETTINGS,
    process_request: Callable[[WebSocket, Request], Response | None] = _upgrade_all,
) -> None:
    async def run(ws: WebSocket) -> None:
        assert isinstance(ws, WireConnection)
        await handler(ws)

    listener = Listener(run, process_request, settings, WireConnection)
    await listener.start("127.0.0.1", 0, None)
    try:
        await asyncio.to_thread(client, listener.port)
    finally:
        await listener.close()


@pytest.mark.asyncio
async def test_bytes_held_behind_the_hello_are_not_parsed_once_the_connection_is_lost() -> None:
    """A ping right behind the hello waits for decoders; the client leaves; receiving then
    says the connection closed (feeding websockets after its end of stream would raise)."""
    outcome: asyncio.Future[BaseException | None] = asyncio.get_running_loop().create_future()

    async def handler(ws: WireConnection) -> None:
        ws.decode_one(_decoders)
        assert await ws.receive() is not None  # the hello; the ping stays held
        await asyncio.shield(ws.lost)
        ws.decoders = _decoders
        try:
            await ws.receive()
        except BaseException as exc:  # noqa: BLE001 - which exception is the point
            outcome.set_result(exc)
        else:
            outcome.set_result(None)

    def client(port: int) -> None:
        with _upgraded(port) as sock:
            hello = _message(Hello(protocol=PROTOCOL_VERSION))
            sock.sendall(hello + _frame(Opcode.PING, b"keepalive"))  # one write

    await _serve(handler, client)
    assert isinstance(await asyncio.wait_for(outcome, 10), ConnectionClosed)


@pytest.mark.asyncio
async def test_a_refused_hello_with_a_batch_behind_it_still_closes_cleanly() -> None:
    """After a refused hello nothing decodes the batch behind it: it is dropped, and the
    client's close frame behind that still completes the close handshake."""
    closed: asyncio.Future[int | None] = asyncio.get_running_loop().create_future()

    async def handler(ws: WireConnection) -> None:
        ws.decode_one(_decoders)
        await ws.receive()
        await ws.close(1000, "handshake refused")  # no decoders are set again
        closed.set_result(ws.close_received)

    def client(port: int) -> None:
        with _upgraded(port) as sock:
            sock.sendall(_message(Hello(protocol=PROTOCOL_VERSION)) + _message(Batch()))
            seen = b""
            while b"handshake refused" not in seen:
                chunk = sock.recv(4096)
                assert chunk, "the server closed without its close frame"
                seen += chunk
            sock.sendall(_frame(Opcode.CLOSE, struct.pack("!H", 1000)))
            while sock.recv(4096):
                pass

    await _serve(handler, client)
    assert await asyncio.wait_for(closed, 10) == 1000


@pytest.mark.asyncio
async def test_a_close_right_after_the_upgrade_completes_the_close_handshake() -> None:
    """The client's close reply may arrive while the wire still waits on the upgrade: it must
    be parsed (websockets' state is then CLOSING, not OPEN), or the close would time out."""
    closed: asyncio.Future[bool] = asyncio.get_running_loop().create_future()

    async def handler(ws: WebSocket) -> None:
        await ws.close(1001, "going away")
        closed.set_result(ws.close_received is not None)  # the client's reply was read

    listener = Listener(handler, _upgrade_all, SETTINGS, WireConnection)
    await listener.start("127.0.0.1", 0, None)
    try:
        async with connect(f"ws://127.0.0.1:{listener.port}", compression=None) as ws:
            await ws.wait_closed()
            assert await asyncio.wait_for(closed, 30)
            assert ws.close_code == 1001
    finally:
        await listener.close()


def _read_all(sock: socket.socket) -> bytes:
    """Everything the server sends until it ends the stream (or resets it)."""
    seen = b""
    try:
        while chunk := sock.recv(4096):
            seen += chunk
    except ConnectionResetError:
        pass
    return seen


def _no_handler(ws: WireConnection) -> Awaitable[None]:
    raise AssertionError("no connection should be upgraded")


@pytest.mark.asyncio
async def test_a_connection_that_sends_no_request_is_cut_at_the_open_timeout() -> None:
    def client(port: int) -> None:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n")  # never ends
            started = time.monotonic()
            assert _read_all(sock) == b""
            assert 0.2 <= time.monotonic() - started < 5

    await _serve(_no_handler, client, dataclasses.replace(SETTINGS, open_timeout=0.3))


@pytest.mark.asyncio
async def test_a_request_answered_without_an_upgrade_gets_the_response_and_the_end() -> None:
    def answer(ws: WebSocket, request: Request) -> Response:
        return plain(404, f"nothing at {request.path}")

    def client(port: int) -> None:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(b"GET /nowhere HTTP/1.1\r\nHost: x\r\n\r\n")
            seen = _read_all(sock)
            assert seen.startswith(b"HTTP/1.1 404 Not Found\r\n"), seen
            assert seen.endswith(b"\r\n\r\nnothing at /nowhere\n"), seen

    await _serve(_no_handler, client, process_request=answer)


@pytest.mark.asyncio
async def test_a_client_that_never_answers_the_close_is_cut_at_the_close_timeout() -> None:
    took: asyncio.Future[float] = asyncio.get_running_loop().create_future()

    async def handler(ws: WireConnection) -> None:
        started = time.monotonic()
        await ws.close(1000, "bye")
        took.set_result(time.monotonic() - started)

    def client(port: int) -> None:
        with _upgraded(port) as sock:
            assert b"bye" in _read_all(sock)  # the close frame, then the cut: never answered

    await _serve(handler, client, dataclasses.replace(SETTINGS, close_timeout=0.3))
    assert 0.2 <= await asyncio.wait_for(took, 10) < 5


@pytest.mark.asyncio
async def test_a_client_that_does_not_answer_pings_is_closed_1011() -> None:
    def client(port: int) -> None:
        with _upgraded(port) as sock:
            seen = _read_all(sock)  # pings, then the close frame; never a pong
            assert seen.startswith(bytes([0x80 | Opcode.PING, 4])), seen
            assert struct.pack("!H", 1011) + b"keepalive ping timeout" in seen

    async def handler(ws: WireConnection) -> None:
        await ws.lost

    settings = dataclasses.replace(SETTINGS, ping_interval=0.05, ping_timeout=0.2)
    await _serve(handler, client, settings)


@pytest.mark.asyncio
async def test_a_client_that_answers_pings_stays_and_is_pinged_again() -> None:
    def client(port: int) -> None:
        with _upgraded(port) as sock:
            for _ in range(3):  # each ping answered with its payload
                head = sock.recv(2)
                assert head == bytes([0x80 | Opcode.PING, 4]), head
                payload = sock.recv(4)
                sock.sendall(_frame(Opcode.PONG, payload))
            sock.sendall(_frame(Opcode.CLOSE, struct.pack("!H", 1000)))
            _read_all(sock)

    pinged: list[int] = []

    async def handler(ws: WireConnection) -> None:
        ws.decoders = _decoders  # frames are parsed (while none are set, bytes are held)
        await ws.lost
        pinged.append(ws.close_code or 0)

    settings = dataclasses.replace(SETTINGS, ping_interval=0.05, ping_timeout=1.0)
    await _serve(handler, client, settings)
    assert pinged == [1000]


@pytest.mark.asyncio
async def test_a_handler_that_raises_closes_its_connection_1011(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def handler(ws: WireConnection) -> None:
        raise RuntimeError("a bug")

    def client(port: int) -> None:
        with _upgraded(port) as sock:
            assert struct.pack("!H", 1011) in _read_all(sock)

    await _serve(handler, client, dataclasses.replace(SETTINGS, close_timeout=0.3))
    assert "connection handler failed" in caplog.text
