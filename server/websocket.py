"""The server's side of one websocket: websockets' sans-I/O ``ServerProtocol`` over an asyncio
transport that this module owns.

The protocol (websockets' documented sans-I/O API: ``receive_data``, ``events_received``,
``data_to_send``, ``send_close``, ``send_ping``, ``fail``, ``accept``, ``send_response``,
``state``, ``close_code``, ``close_exc``) parses the HTTP upgrade request, answers pings, runs
the close handshake and says how the connection ended. It sees the upgrade request and whole
control frames only: data frames are the wire's, parsed by ``server/wire.py`` and framed by
``server/sending.py``, so that payloads go between the socket and arrays without copies.

This module does the I/O around the protocol: it writes what the protocol produces and
half-closes or closes TCP when the protocol says so, cuts a connection whose close handshake
does not end within :data:`CLOSE_TIMEOUT`, sends keepalive pings and drops a peer that does
not answer them, and keeps asyncio's write flow control (``write_limit``). The upgrade itself
is answered by the listener's callback (``server/listener.py``) as soon as the request is whole.

States are the protocol's: CONNECTING until the upgrade is answered, OPEN, CLOSING once either
side sent a close frame, CLOSED once the TCP connection is gone.
"""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from websockets.exceptions import ConnectionClosed
from websockets.frames import Frame, Opcode
from websockets.http11 import Request, Response
from websockets.protocol import State
from websockets.server import ServerProtocol

from protocol.framing import close_payload

CLOSE_TIMEOUT = 10.0  # seconds a close handshake may take before the TCP connection is cut
KEEPALIVE_TIMEOUT = "keepalive ping timeout"  # the close reason when a pong does not come


@dataclass(frozen=True)
class WebSocketSettings:
    """What every connection of a listener shares: limits and timers (seconds; None: off)."""

    max_message_size: int | None
    write_limit: int = 1 << 16
    open_timeout: float | None = 10.0
    ping_interval: float | None = 20.0
    ping_timeout: float | None = 20.0
    close_timeout: float = CLOSE_TIMEOUT


@dataclass(frozen=True)
class Upgrades:
    """The listener's side of a connection: ``made`` is called once its transport is there
    (after a TLS handshake: one that fails never makes it), ``answer`` returns the response to
    a whole upgrade request (101 accepts it), ``opened`` is called once the connection is
    open (it starts the handler)."""

    made: Callable[[WebSocket], None]
    answer: Callable[[WebSocket, Request], Response]
    opened: Callable[[WebSocket], None]


class WebSocket(asyncio.BufferedProtocol):
    """One server websocket connection: the protocol's state, its I/O and its timers.

    Subclasses (``server/wire.py``) implement ``get_buffer`` and ``buffer_updated`` and hand the
    upgrade request and control frames to :meth:`feed`.
    """

    def __init__(self, settings: WebSocketSettings, upgrades: Upgrades) -> None:
        self.settings = settings
        self.protocol = ServerProtocol(max_size=None)  # it sees control frames only
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport = None  # type: ignore[assignment]  # connection_made
        self.raw_socket: socket.socket | None = None  # plain TCP only: gathered sendmsg calls
        self.close_received: int | None = None  # the code of the peer's close frame
        self.client = ""  # who the upgrade says it is (server.guard.client_of): set on accept
        self.lost: asyncio.Future[None] = self.loop.create_future()  # the TCP connection ended
        self._upgrades = upgrades
        self._write_paused = False
        self._drain_waiters: list[asyncio.Future[None]] = []
        self._close_timer: asyncio.TimerHandle | None = None
        self._ping_timer: asyncio.TimerHandle | None = None
        self._ping: tuple[bytes, float] | None = None  # the ping awaiting its pong, sent when

    # --- asyncio's callbacks ----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        transport.set_write_buffer_limits(high=self.settings.write_limit)
        self.raw_socket = _plain_socket(transport)
        if self.settings.open_timeout is not None:
            self._close_timer = self.loop.call_later(self.settings.open_timeout, self._cut)
        self._upgrades.made(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.protocol.receive_eof()  # idempotent: the state is CLOSED from here on
        for timer in (self._close_timer, self._ping_timer):
            if timer is not None:
                timer.cancel()
        self._close_timer = self._ping_timer = None
        if self.raw_socket is not None:
            self.raw_socket.close()  # our duplicate of the descriptor, not asyncio's socket
            self.raw_socket = None
        self.lost.set_result(None)
        self._write_paused = False
        self._wake_writers()

    def eof_received(self) -> bool | None:
        """The peer half-closed: the connection is over (None: asyncio closes the transport)."""
        self.protocol.receive_eof()
        self._send_output()
        return None

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        self._wake_writers()

    # --- the protocol ---------------------------------------------------------------------------

    def feed(self, data: bytes) -> None:
        """Give the protocol bytes it owns: the upgrade request, or one whole control frame;
        write its answers and act on what it received."""
        if self.protocol.state is State.CLOSED:
            return
        self.protocol.receive_data(data)
        events = self.protocol.events_received()
        self._send_output()
        for event in events:
            if isinstance(event, Request):
                self._answer(event)
            elif isinstance(event, Frame):
                self._control(event)

    def _answer(self, request: Request) -> None:
        try:
            response = self._upgrades.answer(self, request)
        except Exception:  # a bug in the answer: 500, as websockets' servers answer then
            self.protocol.logger.error("answering the upgrade failed", exc_info=True)
            response = self.protocol.reject(500, "Failed to open a WebSocket connection.\n")
        if self.protocol.state is not State.CONNECTING:
            return  # the request was broken: the protocol answered it already
        self.protocol.send_response(response)
        self._send_output()
        if self.is_open:  # accepted
            if self._close_timer is not None:
                self._close_timer.cancel()
                self._close_timer = None
            if self.settings.ping_interval is not None:
                self._schedule_ping(self.settings.ping_interval)
            self._upgrades.opened(self)

    def _control(self, frame: Frame) -> None:
        if frame.opcode is Opcode.CLOSE:
            self.close_received = close_payload(frame.data)[0]
        elif frame.opcode is Opcode.PONG and self._ping is not None:
            sent_data, sent_at = self._ping
            if frame.data == sent_data:  # the answer to our keepalive ping: the next one
                self._ping = None
                if self._ping_timer is not None:
                    self._ping_timer.cancel()
                    self._ping_timer = None
                latency = self.loop.time() - sent_at
                self._schedule_ping(max(0.0, self._ping_interval - latency))

    def _send_output(self) -> None:
        """Write what the protocol produced; half-close TCP where it says the stream ends
        (close it under TLS, which cannot half-close); start the close timer when it expects
        the connection to end."""
        for data in self.protocol.data_to_send():
            if self.transport.is_closing():
                break
            if data:
                self.transport.write(data)
            elif self.transport.can_write_eof():
                try:
                    self.transport.write_eof()
                except OSError:  # the peer is gone already
                    self.transport.abort()
            else:
                self.transport.close()
        if self.protocol.close_expected():
            self._expect_close()

    def _expect_close(self) -> None:
        """Cut the connection if it is still there after the close timeout."""
        if self._close_timer is None and not self.lost.done():
            self._close_timer = self.loop.call_later(self.settings.close_timeout, self._cut)

    def _cut(self) -> None:
        """The open timer (cancelled once the upgrade is accepted) or the close timer: the
        connection did not get there, or did not end, in time."""
        self._close_timer = None
        self.abort()

    # --- keepalive --------------------------------------------------------------------------

    @property
    def _ping_interval(self) -> float:
        interval = self.settings.ping_interval
        assert interval is not None  # pings are sent only with an interval
        return interval

    def _schedule_ping(self, delay: float) -> None:
        if self._ping_timer is None and not self.lost.done():
            self._ping_timer = self.loop.call_later(delay, self._send_ping)

    def _send_ping(self) -> None:
        """Send a keepalive ping; without its pong within the ping timeout, the peer is gone
        (the next ping follows the pong, a ping interval after the last one was sent). Without
        a ping timeout, pings go on every ping interval, answered or not."""
        self._ping_timer = None
        if self.protocol.state is not State.OPEN or self.transport.is_closing():
            return
        data = os.urandom(4)
        self._ping = (data, self.loop.time())
        self.protocol.send_ping(data)
        self._send_output()
        timeout = self.settings.ping_timeout
        if timeout is None:
            self._schedule_ping(self._ping_interval)
        else:
            self._ping_timer = self.loop.call_later(timeout, self._ping_timed_out, data)

    def _ping_timed_out(self, data: bytes) -> None:
        self._ping_timer = None
        if self._ping is not None and self._ping[0] == data:
            self.fail(1011, KEEPALIVE_TIMEOUT)

    # --- state ------------------------------------------------------------------------------

    @property
    def upgrading(self) -> bool:
        return self.protocol.state is State.CONNECTING

    @property
    def is_open(self) -> bool:
        return self.protocol.state is State.OPEN

    @property
    def is_closed(self) -> bool:
        return self.protocol.state is State.CLOSED

    @property
    def is_dropped(self) -> bool:
        """Whether the TCP connection is going or gone whatever the protocol's state says: a
        write failed (the peer reset it) or it was aborted. Nothing more should be written:
        asyncio logs a warning for each write after the fifth to a dead transport."""
        return self.transport.is_closing()

    @property
    def taking_data(self) -> bool:
        """Whether data frames still count: not after the client's close frame (the protocol
        discards what follows it), but still after ours, which the client may not have read."""
        state = self.protocol.state
        return (state is State.OPEN or state is State.CLOSING) and self.close_received is None

    @property
    def close_code(self) -> int | None:
        """The code of the client's close frame once the connection is closed (1006: none)."""
        return self.protocol.close_code

    @property
    def remote_address(self) -> Any:
        return self.transport.get_extra_info("peername")

    def closed_error(self) -> ConnectionClosed:
        """The ``ConnectionClosed`` that says how the connection ended (once it has)."""
        return self.protocol.close_exc

    # --- closing ----------------------------------------------------------------------------

    def fail(self, code: int, reason: str) -> None:
        """A protocol violation or a dead peer: send a close frame, end the TCP stream, and
        read nothing more (the close timer cuts what does not end)."""
        if self.protocol.state is State.CLOSED:
            return
        self.protocol.fail(code, reason)
        self._send_output()

    def abort(self) -> None:
        """Cut the TCP connection at once (a client that does not read cannot take a close)."""
        self.transport.abort()

    async def close(self, code: int = 1000, reason: str = "") -> None:
        """Start the close handshake, unless it started, and return once the TCP connection
        is gone: the client closes it after its close frame, or the close timeout cuts it."""
        if not self._send_close(code, reason) and self.protocol.state is State.CONNECTING:
            self.abort()
        self._expect_close()
        await asyncio.shield(self.lost)

    async def close_silent(self, code: int, reason: str) -> None:
        """Send a close frame, then end the TCP connection without waiting for the peer's:
        for a peer that sent nothing in time, whose close would otherwise hold its connection
        slot for the close timeout. The frame is written before the end, so a peer that reads
        still learns why."""
        self._send_close(code, reason)
        if self.transport.get_write_buffer_size():
            self.abort()  # it does not read: what waits would never leave
        else:
            self.transport.close()
        await asyncio.shield(self.lost)

    def _send_close(self, code: int, reason: str) -> bool:
        """Send a close frame if the connection is open and its transport alive; whether it
        was sent."""
        if self.protocol.state is not State.OPEN or self.is_dropped:
            return False
        self.protocol.send_close(code, reason)
        self._send_output()
        return True

    # --- flow control -----------------------------------------------------------------------

    @property
    def write_paused(self) -> bool:
        """Whether the transport is over its write limit (``write_limit``)."""
        return self._write_paused

    def _wake_writers(self) -> None:
        for waiter in self._drain_waiters:
            if not waiter.done():
                waiter.set_result(None)

    async def raise_if_closing(self) -> None:
        """Return at once if the connection is open; else wait until it is gone (the close
        handshake ends, or the close timeout cuts it) and raise ``ConnectionClosed``."""
        if self.protocol.state is State.OPEN and not self.is_dropped:
            return
        self._expect_close()
        await asyncio.shield(self.lost)
        raise self.closed_error()

    async def wait_writable(self, deadline: float | None) -> None:
        """Wait until the transport is under its write limit again, up to ``deadline`` (loop
        time): a timer of the loop's, made only when waiting.

        Raises:
            TimeoutError: the deadline passed.
            ConnectionClosed: the connection was lost meanwhile.
        """
        waiter: asyncio.Future[None] = self.loop.create_future()
        expired: list[bool] = []

        def expire() -> None:
            if not waiter.done():
                expired.append(True)
                waiter.set_result(None)

        timer = None if deadline is None else self.loop.call_at(deadline, expire)
        self._drain_waiters.append(waiter)
        try:
            await waiter
        finally:
            self._drain_waiters.remove(waiter)
            if timer is not None:
                timer.cancel()
        if self.lost.done():
            raise self.closed_error()
        if expired:
            raise TimeoutError("the client took no bytes before the send deadline")


def _plain_socket(transport: asyncio.BaseTransport) -> socket.socket | None:
    """A duplicate of the socket under a plain TCP transport (asyncio's documented ``socket``
    extra), for writes gathered into one ``sendmsg`` call; None under TLS. It shares the open
    file description (non-blocking, as asyncio set it); closing it leaves asyncio's open."""
    if transport.get_extra_info("sslcontext") is not None:
        return None
    shared = transport.get_extra_info("socket")
    if shared is None:
        return None
    sock = socket.socket(shared.family, shared.type, shared.proto, fileno=os.dup(shared.fileno()))
    sock.setblocking(False)
    return sock


def when_lost(connection: WebSocket, callback: Callable[[], object]) -> Callable[[], None]:
    """Call ``callback`` when ``connection`` is lost; returns the function that undoes it."""

    def fire(_: object) -> None:
        callback()

    connection.lost.add_done_callback(fire)

    def undo() -> None:
        connection.lost.remove_done_callback(fire)

    return undo


__all__ = ["CLOSE_TIMEOUT", "Upgrades", "WebSocket", "WebSocketSettings", "when_lost"]
