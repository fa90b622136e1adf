"""Protocol-level tools for fault tests: a raw websocket client that can send anything, and a
witness session whose tensors must survive every fault another session causes."""

from __future__ import annotations

import base64
import os
import socket
import struct
from collections.abc import Sequence
from contextlib import ExitStack
from typing import Any

import numpy as np
from websockets.frames import Frame, Opcode
from websockets.sync.client import ClientConnection, connect

import client
from protocol import PROTOCOL_VERSION, SERVER_ADAPTER, Batch, Hello, decode, encode
from protocol.codec import to_frames
from protocol.messages import Message

from .polling import wait_until

TOKEN = "s3cret-token"  # noqa: S105 - a test token


class Raw:
    """A websocket session that speaks the protocol by hand (and breaks it on purpose)."""

    def __init__(self, url: str, token: str | None = TOKEN, hello: bool = True, **kw: Any) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token is not None else None
        self._stack = ExitStack()
        self.ws: ClientConnection = self._stack.enter_context(
            connect(url, additional_headers=headers, compression=None, max_size=2**31, **kw)
        )
        if hello:
            self.send(Hello(protocol=PROTOCOL_VERSION))
            self.welcome = self.recv()
            assert self.welcome.type == "welcome", self.welcome

    def send(self, message: Message, buffers: Sequence[memoryview] = ()) -> None:
        self.ws.send(to_frames(encode(message, buffers)))

    def send_raw(self, data: bytes | list[bytes]) -> None:
        self.ws.send(data)

    def recv(self, timeout: float = 30) -> Any:
        data = self.ws.recv(timeout=timeout, decode=False)
        message, _ = decode(SERVER_ADAPTER, data)
        return message

    def request(self, batch: Batch, buffers: Sequence[memoryview] = ()) -> list[Any]:
        """Send ``batch`` and return one reply per request in it."""
        self.send(batch, buffers)
        return [self.recv() for _ in batch.requests]

    def close(self) -> None:
        self._stack.close()


class Witness:
    """Another session holding known tensors; faults elsewhere must leave it untouched."""

    def __init__(self, url: str, token: str | None = TOKEN, **kw: Any) -> None:
        self.dev = client.RemoteDevice(url, token=token, **kw)
        self.xp = client.namespace(self.dev)
        self.expected = np.arange(1000, dtype=np.float64).reshape(10, 100)
        self.tensor = self.xp.asarray(self.expected)
        self.dev.sync()
        self.bytes = self.dev.stats().tensor_bytes
        assert self.bytes == self.expected.nbytes

    def server_bytes(self) -> int:
        return self.dev.stats().server_tensor_bytes

    def assert_intact(self) -> None:
        """Its tensor is unchanged, and once every other session has let go, the server's
        tensor bytes are exactly the witness's own (accounting back to baseline)."""
        np.testing.assert_array_equal(self.tensor.numpy(), self.expected)
        assert self.dev.stats().tensor_bytes == self.bytes
        wait_until(
            lambda: self.server_bytes() == self.bytes, "the server's bytes to be the witness's"
        )

    def close(self) -> None:
        self.dev.close()


class RawSocket:
    """A websocket client written by hand on a TCP socket: it can stop mid-message, send
    frames websockets would never send, and vanish without a close frame."""

    def __init__(self, url: str, token: str | None = TOKEN) -> None:
        host, port = url.removeprefix("ws://").rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=30)
        key = base64.b64encode(os.urandom(16)).decode()
        auth = f"Authorization: Bearer {token}\r\n" if token is not None else ""
        self.sock.sendall(
            (
                f"GET / HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\n"
                f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                f"Sec-WebSocket-Version: 13\r\n{auth}\r\n"
            ).encode()
        )
        response = b""
        while b"\r\n\r\n" not in response:
            chunk = self.sock.recv(4096)
            assert chunk, response
            response += chunk
        self.status = int(response.split(b" ", 2)[1])
        self.rest = response.split(b"\r\n\r\n", 1)[1]

    def frame(self, data: bytes, opcode: Opcode = Opcode.BINARY, fin: bool = True) -> None:
        self.sock.sendall(Frame(opcode, data, fin=fin).serialize(mask=True, extensions=[]))

    def hello(self) -> None:
        self.frame(to_frames(encode(Hello(protocol=PROTOCOL_VERSION))))  # type: ignore[arg-type]
        while len(self.rest) < 2:  # the welcome's frame has started to arrive
            self.rest += self.sock.recv(4096)

    def read_until(self, marker: bytes) -> bytes:
        """What the server sends, up to ``marker`` (or until it closes the connection)."""
        data = self.rest
        while marker not in data and (chunk := self.sock.recv(65536)):
            data += chunk
        return data

    def vanish(self) -> None:
        """Close the TCP connection with no close frame (a client process that died)."""
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.sock.close()

    def close(self) -> None:
        self.sock.close()
