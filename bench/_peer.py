"""The ceiling peer: ``python -m bench._peer`` serves the references the suite divides by.

It prints one line, ``tcp PORT ws PORT floor PORT``, then serves on loopback until terminated:

- plain TCP (blocking sockets, TCP_NODELAY): the client sends ``U`` + u64 n and then n bytes,
  which the peer receives into a fresh array and acknowledges with one byte (``R``: into an
  array of n bytes it keeps and reuses, as the server reuses freed tensors); or ``Q`` + u64 n
  and n bytes, received into a fresh array that the peer holds and does not acknowledge, as
  many times as the client likes, then ``S`` + u64 0, which the peer answers with one byte
  before it drops what it held (a stream of uploads confirmed once, as by a ``sync``); or
  ``P`` + u64 n (the peer prepares n bytes and answers ``r``), then ``D``, and the peer sends
  those bytes;
- a bare websockets server (asyncio implementation, compression and keepalive off, messages
  read with ``recv_streaming``): a message starting ``E`` is echoed (ping-pong); ``U`` + u64 n,
  then fragments, is received into a fresh array and answered ``k``; ``P`` + u64 n prepares n
  bytes (answer ``r``) and ``D`` sends them as :data:`FRAGMENT` fragments. This measures the
  websocket library alone, without anything of Tensorwire;
- the floor (:class:`_Floor`, an asyncio ``BufferedProtocol``): ``U`` + u64 n, then n bytes in
  masked websocket frames (:data:`FRAME_HEADER`), received straight into one array it keeps,
  unmasked there by the server's own ``unmask_in_place`` and answered with a 3-byte frame. It
  is the least any Python asyncio server that speaks websocket can do with an upload: no frame
  parsing beyond the fixed header, no message to decode, nothing to run; a client must mask
  what it sends (RFC 6455, 5.3). ``E`` + u64 0 instead turns the connection into the floor of
  a read (:class:`_FloorRoundTrips`): from then on, each small masked frame (a read request's
  size) is unmasked and answered with one small unmasked frame (:data:`FLOOR_ANSWER`, a
  one-element read reply's size).

It runs in its own process, as the server does, so that both sides of every ceiling pay the
same process boundary as the real thing.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import threading
from typing import Any

import numpy as np
from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed

from protocol.framing import unmask_in_place

COMMAND = struct.Struct("<cQ")
FRAGMENT = 1 << 18  # as protocol.codec.to_frames fragments large messages
FRAME_HEADER = struct.Struct("!BBQ4s")  # a masked frame's header, 64-bit length: the floor's
FLOOR_REPLY = b"\x82\x01k"  # one binary frame, payload "k"
FLOOR_REQUEST = 113  # payload bytes of a round trip's request: a one-element read's batch
FLOOR_ANSWER = b"\x82\x64" + bytes(100)  # one binary frame the size of a one-element read reply
# Both ends of the websocket ceiling (here and bench.ceilings.WsCeiling). Keepalive is off: a
# client's event loop runs only while it measures, so nothing would answer a ping between its
# transfers, and a measurement needs no keepalive.
WS_OPTIONS: dict[str, Any] = {
    "compression": None,
    "max_size": None,
    "write_limit": 1 << 20,
    "ping_interval": None,
}


def recv_exactly(sock: socket.socket, target: memoryview) -> None:
    """Fill ``target`` from ``sock``. Raises ConnectionError on a closed socket."""
    got = 0
    while got < len(target):
        n = sock.recv_into(target[got:])
        if n == 0:
            raise ConnectionError("peer closed")
        got += n


def _serve_tcp(conn: socket.socket) -> None:
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    prepared = kept = np.empty(0, dtype=np.uint8)
    held: list[np.ndarray] = []  # a stream's uploads, until it is confirmed
    header = bytearray(COMMAND.size)
    with conn:
        while True:
            try:
                recv_exactly(conn, memoryview(header))
            except ConnectionError:
                return
            command, n = COMMAND.unpack(header)
            if command == b"U":
                recv_exactly(conn, np.empty(n, dtype=np.uint8).data)
                conn.sendall(b"k")
            elif command == b"R":
                if kept.nbytes != n:
                    kept = np.empty(n, dtype=np.uint8)
                recv_exactly(conn, kept.data)
                conn.sendall(b"k")
            elif command == b"Q":
                held.append(np.empty(n, dtype=np.uint8))
                recv_exactly(conn, held[-1].data)
            elif command == b"S":
                conn.sendall(b"k")
                held.clear()
            elif command == b"P":
                prepared = np.ones(n, dtype=np.uint8)
                conn.sendall(b"r")
            elif command == b"D":
                conn.sendall(prepared.data)


def _accept(listener: socket.socket) -> None:
    while True:
        conn, _ = listener.accept()
        threading.Thread(target=_serve_tcp, args=(conn,), daemon=True).start()


async def _ws_peer(ws: ServerConnection) -> None:
    prepared = np.empty(0, dtype=np.uint8)
    while True:
        fragments = ws.recv_streaming(decode=False)
        try:
            first = await anext(fragments)
        except ConnectionClosed:
            return
        if first[:1] == b"E":
            rest = [bytes(first), *[bytes(f) async for f in fragments]]
            await ws.send(b"".join(rest))
            continue
        command, n = COMMAND.unpack_from(first)
        if command == b"U":
            target, offset = np.empty(n, dtype=np.uint8), 0
            async for fragment in fragments:
                target[offset : offset + len(fragment)] = np.frombuffer(fragment, np.uint8)
                offset += len(fragment)
            await ws.send(b"k")
        elif command == b"P":
            async for _ in fragments:
                pass
            prepared = np.ones(n, dtype=np.uint8)
            await ws.send(b"r")
        elif command == b"D":
            async for _ in fragments:
                pass
            view = prepared.data
            await ws.send([view[i : i + FRAGMENT] for i in range(0, len(view), FRAGMENT)])


class _Floor(asyncio.BufferedProtocol):
    """Receives each upload into ``self._kept``: a command, then frame headers and payloads,
    each read straight into place (``get_buffer`` offers exactly what is wanted next)."""

    def __init__(self) -> None:
        self._transport: asyncio.Transport | None = None
        self._head = memoryview(bytearray(FRAME_HEADER.size))
        self._kept = np.empty(0, dtype=np.uint8)
        self._want = self._head[: COMMAND.size]  # filled from self._got on
        self._got = 0
        self._pos = 0  # bytes of the upload unmasked
        self._key = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._transport = transport

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._want[self._got :]

    def buffer_updated(self, nbytes: int) -> None:
        self._got += nbytes
        if self._got < len(self._want):
            return
        self._got = 0
        if self._want.obj is not self._head.obj:  # a frame's payload is in: unmask it
            unmask_in_place(self._want, self._key, 0)  # as the server unmasks
            self._pos += len(self._want)
            if self._pos == self._kept.nbytes:
                assert self._transport is not None
                self._transport.write(FLOOR_REPLY)
                self._want = self._head[: COMMAND.size]
                return
        elif len(self._want) == COMMAND.size:
            command, n = COMMAND.unpack(self._want)
            if command == b"E":  # round trips from now on; nothing more was read
                assert self._transport is not None
                self._transport.set_protocol(_FloorRoundTrips(self._transport))
                return
            if self._kept.nbytes != n:
                self._kept = np.empty(n, dtype=np.uint8)
            self._pos = 0
        else:
            _, _, length, self._key = FRAME_HEADER.unpack(self._want)
            self._want = self._kept[self._pos : self._pos + length].data
            return
        self._want = self._head


class _FloorRoundTrips(asyncio.BufferedProtocol):
    """The floor of a read: each small masked frame (payload under 126 bytes) that arrives is
    unmasked as the server unmasks, and answered with :data:`FLOOR_ANSWER`. Reads whatever has
    arrived, as the server's wire reads ahead."""

    def __init__(self, transport: asyncio.Transport) -> None:
        self._transport = transport
        self._inbox = memoryview(bytearray(1 << 16))
        self._filled = 0

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._inbox[self._filled :]

    def buffer_updated(self, nbytes: int) -> None:
        self._filled += nbytes
        inbox, at = self._inbox, 0
        while self._filled - at >= 2:
            end = at + 6 + (inbox[at + 1] & 0x7F)  # header, key, payload
            if end > self._filled:
                break
            unmask_in_place(inbox[at + 6 : end], bytes(inbox[at + 2 : at + 6]), 0)
            self._transport.write(FLOOR_ANSWER)
            at = end
        rest = self._filled - at
        inbox[:rest] = inbox[at : self._filled]
        self._filled = rest


async def main() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    threading.Thread(target=_accept, args=(listener,), daemon=True).start()
    floor = await asyncio.get_running_loop().create_server(_Floor, "127.0.0.1", 0)
    async with serve(_ws_peer, "127.0.0.1", 0, **WS_OPTIONS) as ws_server:
        ws_port = ws_server.sockets[0].getsockname()[1]
        floor_port = floor.sockets[0].getsockname()[1]
        print(f"tcp {listener.getsockname()[1]} ws {ws_port} floor {floor_port}", flush=True)
        await asyncio.Future()


if __name__ == "__main__":
    asyncio.run(main())
