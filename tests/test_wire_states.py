"""The server wire's reading states (``server.wire.Reading``) at their edges: bytes held during
the upgrade and while no decoders are set, a closing connection, a lost one. Each test runs
the real ``WireConnection`` on loopback under websockets' server, with a handler standing in
for the connection loop and a hand-written client that can send anything in one write."""

from __future__ import annotations

import asyncio
import base64
import os
import socket
import struct
from collections.abc import Awaitable, Callable

import pytest
from websockets.asyncio.client import connect
from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed

from protocol import CLIENT_ADAPTER, PROTOCOL_VERSION, Batch, Hello, MessageDecoder, encode
from protocol.framing import Opcode, apply_mask, frame_header
from server.wire import WireConnection

pytestmark = pytest.mark.inprocess

Handler = Callable[[WireConnection], Awaitable[None]]


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
    while b"\r\n\r\n" not in response:
        response += sock.recv(4096)
    assert response.startswith(b"HTTP/1.1 101"), response
    return sock


async def _serve(handler: Handler, client: Callable[[int], None]) -> None:
    async def run(ws: ServerConnection) -> None:
        assert isinstance(ws, WireConnection)
        await handler(ws)

    async with serve(
        run, "127.0.0.1", 0, create_connection=WireConnection, compression=None, close_timeout=5
    ) as server:
        await asyncio.to_thread(client, server.sockets[0].getsockname()[1])


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
        closed.set_result(None if ws.protocol.close_rcvd is None else ws.protocol.close_rcvd.code)

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

    async def handler(ws: ServerConnection) -> None:
        await ws.close(1001, "going away")
        closed.set_result(ws.protocol.close_rcvd is not None)  # the client's reply was read

    async with serve(handler, "127.0.0.1", 0, create_connection=WireConnection) as server:
        port = server.sockets[0].getsockname()[1]
        async with connect(f"ws://127.0.0.1:{port}", compression=None) as ws:
            await ws.wait_closed()
            assert await asyncio.wait_for(closed, 30)
            assert ws.protocol.close_code == 1001
