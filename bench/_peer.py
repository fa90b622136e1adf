"""The ceiling peer: ``python -m bench._peer`` serves the references the suite divides by.

It prints one line, ``tcp PORT ws PORT floor PORT``, then serves on loopback until terminated:

- plain TCP (blocking sockets, TCP_NODELAY): the client sends ``U`` + u64 n and then n bytes,
  which the peer receives into a fresh array and acknowledges with one byte (``R``: into an
  array of n bytes it keeps and reuses, as the server reuses freed tensors); or ``P`` + u64 n
  (the peer prepares n bytes and answers ``r``), then ``D``, and the peer sends those bytes;
- a bare websockets server (asyncio implementation, compression off, messages read with
  ``recv_streaming``): a message starting ``E`` is echoed (ping-pong); ``U`` + u64 n, then
  fragments, is received into a fresh array and answered ``k``; ``P`` + u64 n prepares n bytes
  (answer ``r``) and ``D`` sends them as :data:`FRAGMENT` fragments. This measures the websocket
  library alone, without anything of Tensorwire;
- the floor (:class:`_Floor`, an asyncio ``BufferedProtocol``): ``U`` + u64 n, then n bytes in
  masked websocket frames (:data:`FRAME_HEADER`), received straight into one array it keeps,
  unmasked there by the server's own ``unmask_in_place`` and answered with a 3-byte frame. It
  is the least any Python asyncio server that speaks websocket can do with an upload: no frame
  parsing beyond the fixed header, no message to decode, nothing to run; a client must mask
  what it sends (RFC 6455, 5.3).

It runs in its own process, as the server does, so that both sides of every ceiling pay the
same process boundary as the real thing.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import threading

import numpy as np
from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed

from protocol.framing import unmask_in_place

COMMAND = struct.Struct("<cQ")
FRAGMENT = 1 << 18  # as protocol.codec.to_frames fragments large messages
FRAME_HEADER = struct.Struct("!BBQ4s")  # a masked frame's header, 64-bit length: the floor's
FLOOR_REPLY = b"\x82\x01k"  # one binary frame, payload "k"


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
            _, n = COMMAND.unpack(self._want)
            if self._kept.nbytes != n:
                self._kept = np.empty(n, dtype=np.uint8)
            self._pos = 0
        else:
            _, _, length, self._key = FRAME_HEADER.unpack(self._want)
            self._want = self._kept[self._pos : self._pos + length].data
            return
        self._want = self._head


async def main() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    threading.Thread(target=_accept, args=(listener,), daemon=True).start()
    floor = await asyncio.get_running_loop().create_server(_Floor, "127.0.0.1", 0)
    async with serve(
        _ws_peer, "127.0.0.1", 0, compression=None, max_size=None, write_limit=1 << 20
    ) as ws_server:
        ws_port = ws_server.sockets[0].getsockname()[1]
        floor_port = floor.sockets[0].getsockname()[1]
        print(f"tcp {listener.getsockname()[1]} ws {ws_port} floor {floor_port}", flush=True)
        await asyncio.Future()


if __name__ == "__main__":
    asyncio.run(main())
