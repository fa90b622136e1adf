"""Sending a session's messages to its client: the handshake's and ``Ack``s (not numbered), and
the numbered ones (replies, ``SessionError``, ``Dropped``), which a resumable session keeps in
its outbox (``server/live.py``) until the client has them.

Every send is bounded by ``--send-timeout``. A client that takes nothing for that long ends a
session that cannot resume (``send_timeout``); a resumable session's connection is cut instead,
as a lost one, and what it was sent waits for the client's next connection.
"""

from __future__ import annotations

from websockets.exceptions import ConnectionClosed

from protocol import Ack, ErrorCode, encode
from protocol.messages import Message

from .errors import Drop
from .live import Chunks, Live
from .metrics import Metrics
from .wire import WireConnection


class Replies:
    """Sends to clients within ``send_timeout`` seconds, counting the bytes in ``metrics``."""

    def __init__(self, send_timeout: float, metrics: Metrics) -> None:
        self._send_timeout = send_timeout
        self._metrics = metrics

    async def unnumbered(self, ws: WireConnection, message: Message) -> None:
        """Send a handshake message or an :class:`Ack` (neither numbered nor kept).

        Raises:
            Drop: ``send_timeout``, the client did not take it within ``send_timeout``.
            ConnectionClosed: the connection is closed.
        """
        try:
            sent = await ws.send_message(encode(message), self._send_timeout)
            self._metrics.messages.sent_bytes += sent
        except TimeoutError:
            raise self._not_taken() from None

    async def send(
        self, live: Live, message: Message, buffers: tuple[memoryview, ...] = ()
    ) -> None:
        """Send one numbered message (kept until acknowledged, for a resumable session).

        Raises:
            Drop: ``send_timeout``, the client did not take it within ``send_timeout``.
            ConnectionClosed: the connection is closed (not for a resumable session: its
                messages wait for the next connection).
        """
        chunks = encode(message, buffers)
        live.outbox.add(chunks)
        await self.write(live, chunks)

    async def write(self, live: Live, chunks: Chunks) -> None:
        """Send ``chunks`` on ``live``'s connection; a resumable session's is cut when the
        client does not take it in time (it will resume), else raises as :meth:`send`."""
        ws = live.ws
        if live.resumable and (not ws.is_open or ws.is_dropped):
            return  # kept in the outbox: sent again when the client resumes
        try:
            sent = await ws.send_message(chunks, self._send_timeout)
            self._metrics.messages.sent_bytes += sent
        except TimeoutError:
            if not live.resumable:
                raise self._not_taken() from None
            ws.abort()  # a connection that takes nothing: the client resumes on another
        except ConnectionClosed:
            if not live.resumable:
                raise

    async def acknowledge(self, live: Live) -> None:
        """Tell the client which of its messages arrived (:class:`Ack`)."""
        ws = live.ws
        if ws.is_open and not ws.is_dropped:
            try:
                await self.unnumbered(ws, Ack(received=ws.delivered))
            except ConnectionClosed:
                pass  # the welcome of a resumption says it instead

    async def taken(self, live: Live) -> None:
        """Wait until the transport is under its write limit again, as a send does.

        Raises:
            Drop: ``send_timeout``, the client did not take the replies in time (a session
                that cannot resume; a resumable one's connection is cut).
        """
        ws = live.ws
        if not ws.write_paused:
            return
        try:
            await ws.wait_writable(ws.loop.time() + self._send_timeout)
        except TimeoutError:
            if not live.resumable:
                raise self._not_taken() from None
            ws.abort()
        except ConnectionClosed:
            if not live.resumable:
                raise

    def _not_taken(self) -> Drop:
        timeout = self._send_timeout
        return Drop(ErrorCode.SEND_TIMEOUT, f"the client took no reply for {timeout} s")


__all__ = ["Replies"]
