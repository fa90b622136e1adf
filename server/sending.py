"""Sending on the server's websocket wire: data frames framed here, payloads never copied.

Each frame's header is written and then the payload's memoryview: websockets'
``Frame.serialize`` copied every byte. On plain TCP, while asyncio's transport holds nothing,
all of a reply's frames go straight to the socket in gathered ``sendmsg`` calls (the transport
would make two sends per frame, and copy what the socket did not take); the rest goes through
the transport, whose write buffer limit (``write_limit``) is the backpressure. A reply's send
deadline is a loop timer made only while it waits (``WebSocket.wait_writable``).

A strided buffer (a read of a ``broadcast_to`` view, a slice, a transpose: the session hands
the view, not a copy) is copied into each fragment only as that fragment is sent, so a reply
holds at most one fragment beyond the transport's write limit, whatever the tensor's size.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from protocol.codec import to_frames
from protocol.framing import Opcode, frame_header

from .websocket import WebSocket

SMALL_SEND = 1 << 18  # frames below this go out in one write, header and payload joined
IOV_MAX = 1024  # buffers one sendmsg takes (Linux)
FRAGMENT = 1 << 18  # bytes of a large message's fragments (as protocol.codec.to_frames cuts)


class SendingConnection(WebSocket):
    """A server websocket that sends whole Tensorwire messages itself (:meth:`send_message`),
    framed here."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._send_lock = asyncio.Lock()

    async def send_message(
        self, chunks: Sequence[bytes | memoryview], within: float | None = None
    ) -> int:
        """Send one binary message (``chunks`` concatenated); returns its size in bytes.

        Raises:
            ConnectionClosed: the connection is closing or closed.
            TimeoutError: the client did not take the message within ``within`` seconds (the
                connection is then in the middle of a message: the caller must drop it).
        """
        deadline = None if within is None else self.loop.time() + within
        total = sum(memoryview(c).nbytes for c in chunks)
        if total > FRAGMENT and any(map(_strided, chunks)):  # copied as it is sent
            async with self._send_lock:
                for header, payload in _fragments(chunks):
                    await self._write(header, payload, 0, deadline)
            return total
        headers, parts = _framed(chunks)
        async with self._send_lock:
            first, skip = self._send_now(headers, parts)
            for i in range(first, len(parts)):
                await self._write(headers[i], parts[i], skip if i == first else 0, deadline)
        return total

    def can_send_now(self) -> bool:
        """Whether :meth:`send_message_now` may send: the connection is open and nothing is
        being sent or waits in the transport (so a message sent now keeps its order)."""
        return (
            self.is_open
            and not self._send_lock.locked()
            and not self.transport.get_write_buffer_size()
        )

    def send_message_now(self, chunks: Sequence[bytes | memoryview]) -> int:
        """Send one small binary message without waiting, from a callback (when
        :meth:`can_send_now`): to the socket now, and what the socket does not take to the
        transport's buffer, which keeps the order of every later send and its flow control.
        For small messages only: nothing bounds what is buffered here. Returns its size.
        """
        headers, parts = _framed(chunks)
        first, skip = self._send_now(headers, parts)
        for i in range(first, len(parts)):
            self._write_to_transport(headers[i], parts[i], skip if i == first else 0)
        return sum(memoryview(c).nbytes for c in chunks)

    def _send_now(
        self, headers: list[bytes], parts: Sequence[bytes | memoryview]
    ) -> tuple[int, int]:
        """Write the frames straight to a plain TCP socket while asyncio's transport holds
        nothing (so order is kept), gathered into as few ``sendmsg`` calls as the socket takes.
        Returns where the transport takes over: the first frame not wholly sent, and how many
        of its bytes (header first) were.
        """
        sock, transport = self.raw_socket, self.transport
        if (
            sock is None
            or transport.get_write_buffer_size()
            or transport.is_closing()
            or not self.is_open
        ):
            return 0, 0
        buffers: list[bytes | memoryview] = []
        for header, part in zip(headers, parts, strict=True):
            buffers += (header, part)
        index = offset = 0  # the first buffer not wholly sent, and its bytes sent
        while index < len(buffers):
            batch = buffers[index : index + IOV_MAX]
            if offset:
                batch[0] = memoryview(batch[0])[offset:]
            try:
                sent = sock.sendmsg(batch)
            except OSError:  # would block, or failed: the transport's write sees it
                break
            sent += offset
            offset = 0
            while index < len(buffers) and sent >= len(buffers[index]):
                sent -= len(buffers[index])
                index += 1
            if sent:
                offset = sent
                break
        if index == len(buffers):
            return len(parts), 0
        frame, in_payload = divmod(index, 2)
        return frame, offset + (len(headers[frame]) if in_payload else 0)

    async def _write(
        self, header: bytes, payload: bytes | memoryview, skip: int, deadline: float | None
    ) -> None:
        """Write one frame (less its first ``skip`` bytes, already sent) to the transport;
        wait while the transport is over its write limit."""
        if not self.is_open or self.is_dropped:  # a dead transport would log each write
            await self.raise_if_closing()
        self._write_to_transport(header, payload, skip)
        if self.write_paused:  # over the write limit: wait for the client to take bytes
            await self.wait_writable(deadline)

    def _write_to_transport(self, header: bytes, payload: bytes | memoryview, skip: int) -> None:
        """Hand one frame (less its first ``skip`` bytes, already sent) to the transport."""
        if skip >= len(header):
            self.transport.write(memoryview(payload)[skip - len(header) :])
        elif len(payload) < SMALL_SEND:
            self.transport.write((header + payload)[skip:])
        else:
            self.transport.write(header[skip:])
            self.transport.write(payload)


def _strided(chunk: bytes | memoryview) -> bool:
    return isinstance(chunk, memoryview) and not chunk.c_contiguous


def _fragments(chunks: Sequence[bytes | memoryview]) -> Iterator[tuple[bytes, bytes | memoryview]]:
    """The frame header and payload of each fragment of one binary message, as
    :func:`_framed` cuts it, a strided buffer's fragment copied only when it is taken."""
    spans = [(c, at) for c in chunks[1:] for at in range(0, memoryview(c).nbytes, FRAGMENT)]
    last = len(spans)
    yield frame_header(Opcode.BINARY, not last, len(chunks[0])), chunks[0]
    for i, (chunk, at) in enumerate(spans, 1):
        view = memoryview(chunk)
        if view.c_contiguous:
            payload = view.cast("B")[at : at + FRAGMENT]
        else:  # a fragment holds whole elements: every itemsize divides FRAGMENT
            array = np.asarray(view)
            size = array.itemsize
            payload = array.flat[at // size : (at + FRAGMENT) // size].view(np.uint8).data
        yield frame_header(Opcode.CONT, i == last, len(payload)), payload


def _framed(chunks: Sequence[bytes | memoryview]) -> tuple[list[bytes], list[bytes | memoryview]]:
    """The frame headers and payloads of one binary message: one frame, or 256 KiB fragments
    that a client receives in place (payloads are byte views: their len() is their bytes). A
    strided buffer is copied whole here: a small one, or one sent with :meth:`send_message_now`
    (small by its contract)."""
    chunks = [c.tobytes() if _strided(c) else c for c in chunks]  # type: ignore[union-attr]
    frames = to_frames(chunks)
    parts: list[bytes | memoryview] = [frames] if isinstance(frames, bytes) else list(frames)
    last = len(parts) - 1
    headers = [
        frame_header(Opcode.CONT if i else Opcode.BINARY, i == last, len(part))
        for i, part in enumerate(parts)
    ]
    return headers, parts


__all__ = ["SendingConnection"]
