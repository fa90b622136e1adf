"""The ceiling peer: ``python -m bench._peer`` serves the references the suite divides by.

It prints one line, ``tcp PORT ws PORT``, then serves on loopback until terminated:

- plain TCP (blocking sockets, TCP_NODELAY): the client sends ``U`` + u64 n and then n bytes,
  which the peer receives into a fresh array and acknowledges with one byte; or ``P`` + u64 n
  (the peer prepares n bytes and answers ``r``), then ``D``, and the peer sends those bytes;
- a bare websockets echo server (asyncio implementation, compression off), for ping-pong.

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

COMMAND = struct.Struct("<cQ")


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
    prepared = np.empty(0, dtype=np.uint8)
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
            elif command == b"P":
                prepared = np.ones(n, dtype=np.uint8)
                conn.sendall(b"r")
            elif command == b"D":
                conn.sendall(prepared.data)


def _accept(listener: socket.socket) -> None:
    while True:
        conn, _ = listener.accept()
        threading.Thread(target=_serve_tcp, args=(conn,), daemon=True).start()


async def _echo(ws: ServerConnection) -> None:
    async for message in ws:
        await ws.send(message)


async def main() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    threading.Thread(target=_accept, args=(listener,), daemon=True).start()
    async with serve(_echo, "127.0.0.1", 0, compression=None, max_size=None) as ws_server:
        ws_port = ws_server.sockets[0].getsockname()[1]
        print(f"tcp {listener.getsockname()[1]} ws {ws_port}", flush=True)
        await asyncio.Future()


if __name__ == "__main__":
    asyncio.run(main())
