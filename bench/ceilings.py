"""The client ends of the ceiling peer's references (:mod:`bench._peer`), each transfer
timed in seconds: plain TCP, the floor of uploads (masked frames into a bare asyncio
receiver), and the websocket library alone."""

from __future__ import annotations

import asyncio
import os
import socket
import time
from collections.abc import Callable, Sequence

import numpy as np
from websockets.asyncio.client import connect

from protocol.framing import apply_mask

from ._peer import COMMAND, FLOOR_REPLY, FRAGMENT, FRAME_HEADER, WS_OPTIONS, recv_exactly


def timed(fn: Callable[[], object]) -> float:
    """Seconds ``fn()`` takes."""
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


class TcpCeiling:
    """Plain TCP transfers to and from the peer over loopback."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def upload(self, data: np.ndarray, reused: bool = False) -> float:
        """Seconds to upload ``data`` into a fresh array (``reused``: one the peer keeps)."""

        def run() -> None:
            self.sock.sendall(COMMAND.pack(b"R" if reused else b"U", data.nbytes))
            self.sock.sendall(data.data)
            recv_exactly(self.sock, memoryview(bytearray(1)))

        return timed(run)

    def stream(self, arrays: Sequence[np.ndarray]) -> float:
        """Seconds to upload each of ``arrays`` into a fresh array the peer holds, with no
        acknowledgement (``Q``), then have the whole stream confirmed by one byte (``S``)."""

        def run() -> None:
            for data in arrays:
                self.sock.sendall(COMMAND.pack(b"Q", data.nbytes))
                self.sock.sendall(data.data)
            self.sock.sendall(COMMAND.pack(b"S", 0))
            recv_exactly(self.sock, memoryview(bytearray(1)))

        return timed(run)

    def download(self, nbytes: int, into: np.ndarray | None = None) -> float:
        """Seconds to download ``nbytes`` into a fresh array, or into ``into`` (reused)."""
        self.sock.sendall(COMMAND.pack(b"P", nbytes))
        recv_exactly(self.sock, memoryview(bytearray(1)))

        def run() -> None:
            self.sock.sendall(COMMAND.pack(b"D", 0))
            target = np.empty(nbytes, dtype=np.uint8) if into is None else into
            recv_exactly(self.sock, target.data)

        return timed(run)

    def close(self) -> None:
        self.sock.close()


class FloorCeiling:
    """Uploads as masked websocket frames, written as Tensorwire's client writes them (header,
    then the payload masked with a fresh key by the client's own
    :func:`protocol.framing.apply_mask`, in :data:`FRAGMENT` frames), into the peer's bare
    asyncio receiver: what is left of an upload when the server does nothing else."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._reply = memoryview(bytearray(len(FLOOR_REPLY)))

    def upload(self, data: np.ndarray) -> float:
        view = data.reshape(-1).view(np.uint8).data
        n = len(view)

        def run() -> None:
            self.sock.sendall(COMMAND.pack(b"U", n))
            for at in range(0, n, FRAGMENT):
                part, key = view[at : at + FRAGMENT], os.urandom(4)
                flags = (0x80 if at + FRAGMENT >= n else 0) | (0 if at else 2)
                self.sock.sendall(FRAME_HEADER.pack(flags, 0x80 | 127, len(part), key))
                self.sock.sendall(apply_mask(part, key))
            recv_exactly(self.sock, self._reply)

        return timed(run)

    def close(self) -> None:
        self.sock.close()


class WsCeiling:
    """The websocket library alone: transfers with the peer's websocket server, on an event
    loop of its own run in the calling thread only while a transfer of its runs: keepalive is
    off on both ends (:data:`bench._peer.WS_OPTIONS`), as nothing would answer a ping while the
    other contenders take their turns."""

    def __init__(self, port: int) -> None:
        self.loop = asyncio.new_event_loop()
        url = f"ws://127.0.0.1:{port}"
        self.ws = self.loop.run_until_complete(connect(url, proxy=None, **WS_OPTIONS))

    async def _upload(self, data: np.ndarray) -> float:
        view = data.reshape(-1).view(np.uint8).data
        start = time.perf_counter()
        header = COMMAND.pack(b"U", data.nbytes)
        await self.ws.send(
            [header, *(view[i : i + FRAGMENT] for i in range(0, len(view), FRAGMENT))]
        )
        await self.ws.recv()
        return time.perf_counter() - start

    async def _download(self, nbytes: int) -> float:
        await self.ws.send(COMMAND.pack(b"P", nbytes))
        await self.ws.recv()
        start = time.perf_counter()
        await self.ws.send(COMMAND.pack(b"D", 0))
        target, offset = np.empty(nbytes, dtype=np.uint8), 0
        async for fragment in self.ws.recv_streaming(decode=False):
            target[offset : offset + len(fragment)] = np.frombuffer(fragment, np.uint8)
            offset += len(fragment)
        return time.perf_counter() - start

    def upload(self, data: np.ndarray) -> float:
        return self.loop.run_until_complete(self._upload(data))

    def download(self, nbytes: int) -> float:
        return self.loop.run_until_complete(self._download(nbytes))

    def close(self) -> None:
        self.loop.run_until_complete(self.ws.close())
        self.loop.close()
