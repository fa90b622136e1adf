"""Sending on the server's websocket wire: data frames framed here, payloads never copied.

Rule: imports asyncio, websockets, ``protocol`` and ``server.frames`` only.

Each frame's header is written to the transport and then the payload's memoryview: websockets'
``Frame.serialize`` copied every byte. The transport's write buffer limit (``write_limit``) is
the backpressure, and a reply's send deadline is a loop timer made only while it waits.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from websockets.asyncio.server import ServerConnection
from websockets.frames import Opcode
from websockets.protocol import State

from protocol.codec import to_frames

from .frames import frame_header

SMALL_SEND = 1 << 18  # frames below this go out in one write, header and payload joined


class SendingConnection(ServerConnection):
    """A websockets server connection that sends whole Tensorwire messages itself
    (:meth:`send_message`); the rest is websockets'."""

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
        frames = to_frames(chunks)  # one frame, or 256 KiB fragments a client receives in place
        parts = [frames] if isinstance(frames, bytes) else frames
        async with self._send_lock:
            last = len(parts) - 1
            for i, part in enumerate(parts):
                opcode = Opcode.CONT if i else Opcode.BINARY
                await self._write(opcode, i == last, part, deadline)
        return sum(memoryview(c).nbytes for c in chunks)

    async def _write(
        self, opcode: Opcode, fin: bool, payload: bytes | memoryview, deadline: float | None
    ) -> None:
        if self.protocol.state is not State.OPEN:
            async with self.send_context():  # waits for the close, raises ConnectionClosed
                pass
        length = memoryview(payload).nbytes
        header = frame_header(opcode, fin, length)
        if length < SMALL_SEND:
            self.transport.write(header + payload)
        else:
            self.transport.write(header)
            self.transport.write(payload)
        if self.paused:  # over the write limit: wait for the client to take bytes
            await self._drain(deadline)

    async def _drain(self, deadline: float | None) -> None:
        """Wait until the transport is under its write limit again (websockets' flow control
        wakes the waiter), up to ``deadline``: a timer of the loop's, made only when waiting,
        instead of a cancel scope around every send.

        Raises:
            TimeoutError: the deadline passed.
            ConnectionClosed: the connection was lost meanwhile.
        """
        waiter: asyncio.Future[None] = self.loop.create_future()
        expired = []

        def expire() -> None:
            if not waiter.done():
                expired.append(True)
                waiter.set_result(None)

        timer = None if deadline is None else self.loop.call_at(deadline, expire)
        self.drain_waiters.append(waiter)
        try:
            await waiter
        except Exception:  # connection_lost passes its error on
            await asyncio.shield(self.connection_lost_waiter)
            raise self.close_exc from None
        finally:
            self.drain_waiters.remove(waiter)
            if timer is not None:
                timer.cancel()
        if expired:
            raise TimeoutError("the client took no bytes before the send deadline")


__all__ = ["SendingConnection"]
