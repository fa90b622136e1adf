"""Everything the server takes from websockets and asyncio beyond their documented API.

The server's wire parses and writes data frames itself (``server/wire.py``,
``server/sending.py``) from a subclass of websockets' asyncio :class:`ServerConnection`, which
still does the HTTP upgrade, keepalive pings, the close handshake and every control frame. That
subclass leans on internals, and this module is the only place that names them:

=====================================  ===================================================
internal                               what the wire uses it for
=====================================  ===================================================
``ServerConnection.data_received``     handing websockets the upgrade request and whole
                                       control frames (the connection is asyncio's
                                       ``BufferedProtocol`` now, so asyncio never calls it)
``ServerConnection.send_data``         writing what websockets' protocol made (the close
                                       frame after a protocol error)
``ServerConnection.send_context``      waiting for the close handshake, then raising
                                       ``ConnectionClosed``, when a send finds it closing
``paused``, ``drain_waiters``          websockets' flow control: waiting until the
                                       transport is under its write limit
``connection_lost_waiter``             noticing a lost connection
``close_timeout``                      how long a close waits for the peer's close frame
                                       (a ``serve`` parameter; set per connection to drop a
                                       silent peer at once)
``loop``, ``transport``                the connection's event loop (timers) and asyncio
                                       transport (pausing reads, writing frames), which the
                                       wire's receive queue and sender use directly
``protocol.close_exc``                 the ``ConnectionClosed`` to raise
``protocol.max_message_size``          the message size limit (``max_size`` before 16)
``_SelectorSocketTransport._sock``     asyncio's socket, for gathered ``sendmsg`` calls
=====================================  ===================================================

(``protocol.state``, ``protocol.close_rcvd`` and ``protocol.fail`` are websockets' documented
sans-I/O API.) :func:`missing_internals` checks them all; the server refuses to start when a
class-level one is gone (:func:`require_internals`), and ``tests/test_websockets_internals.py``
checks a live connection, so a websockets release that drops one fails loudly, not mid-session.
``pyproject.toml`` pins websockets to the range the test suite runs on.
"""

from __future__ import annotations

import asyncio
import inspect
import socket
from collections.abc import Callable
from typing import Any

from websockets.asyncio.server import ServerConnection
from websockets.asyncio.server import serve as ws_serve
from websockets.exceptions import ConnectionClosed
from websockets.protocol import State
from websockets.version import version as websockets_version

SUPPORTED = ">=15.0,<18"  # as pyproject.toml says; CI runs the suite on the lowest and newest

_CLASS_INTERNALS = ("data_received", "send_data", "send_context", "connection_lost")
_INSTANCE_INTERNALS = (
    "paused", "drain_waiters", "connection_lost_waiter", "loop", "transport", "close_timeout",
)  # fmt: skip


class UnsupportedWebsocketsError(RuntimeError):
    """The installed websockets lacks an internal the server's wire relies on."""


def missing_internals(connection: ServerConnection | None = None) -> list[str]:
    """The internals that the installed websockets and asyncio lack: the class-level ones, and
    with a live ``connection``, its attributes and its transport's socket too."""
    missing = [
        f"ServerConnection.{n}" for n in _CLASS_INTERNALS if not hasattr(ServerConnection, n)
    ]
    if "create_connection" not in inspect.signature(ws_serve).parameters:
        missing.append("serve(create_connection=...)")
    if connection is None:
        return missing
    missing += [f"ServerConnection.{n}" for n in _INSTANCE_INTERNALS if not hasattr(connection, n)]
    protocol = connection.protocol
    if not hasattr(type(protocol), "close_exc"):  # a property that asserts CLOSED
        missing.append("ServerProtocol.close_exc")
    if not (hasattr(protocol, "max_message_size") or hasattr(protocol, "max_size")):
        missing.append("ServerProtocol.max_message_size")
    transport = getattr(connection, "transport", None)
    if transport is not None and not transport.get_extra_info("sslcontext"):
        if not isinstance(getattr(transport, "_sock", None), socket.socket):
            missing.append("asyncio transport._sock")
    return missing


def require_internals() -> None:
    """Raises :class:`UnsupportedWebsocketsError` (one line, naming what is missing and the
    supported range) when a class-level internal is gone. Call before binding."""
    missing = missing_internals()
    if missing:
        raise UnsupportedWebsocketsError(
            f"websockets {websockets_version} lacks {', '.join(missing)}, which the server "
            f"relies on; install websockets{SUPPORTED}"
        )


def _message_size_limit(protocol: Any) -> int | None:
    """The largest message the protocol accepts (``max_size``), or None for no limit."""
    if hasattr(protocol, "max_message_size"):  # websockets 16 and later
        limit: int | None = protocol.max_message_size
    else:  # websockets 15
        limit = protocol.max_size
    return limit


def _plain_socket(transport: asyncio.BaseTransport) -> socket.socket | None:
    """asyncio's own socket under a plain TCP transport, or None (TLS, or no such internal)."""
    if transport.get_extra_info("sslcontext") is not None:
        return None
    sock = getattr(transport, "_sock", None)
    return sock if isinstance(sock, socket.socket) else None


class AdaptedConnection(ServerConnection):
    """websockets' server connection, seen through the internals above, by what they are for.

    The protocol state is websockets': CONNECTING during the upgrade, OPEN, CLOSING once either
    side sent a close frame, CLOSED once the TCP connection is gone.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.raw_socket: socket.socket | None = None  # set once connected, plain TCP only
        self.message_size_limit = _message_size_limit(self.protocol)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self.raw_socket = _plain_socket(transport)

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
        """Whether the TCP connection is going or gone whatever websockets' state says: a write
        failed (the peer reset it) or it was aborted. Nothing more should be written: asyncio
        logs a warning for each write after the fifth to a dead transport."""
        return self.transport.is_closing()

    @property
    def taking_data(self) -> bool:
        """Whether data frames still count: not after the client's close frame (websockets
        discards them), but still after ours, as websockets delivers them."""
        state = self.protocol.state
        open_ = state is State.OPEN or state is State.CLOSING
        return open_ and self.protocol.close_rcvd is None

    def closed_error(self) -> ConnectionClosed:
        """The ``ConnectionClosed`` that says how the connection ended (once it has)."""
        return self.protocol.close_exc

    # --- handing bytes to websockets ---------------------------------------------------------

    def feed(self, data: bytes) -> None:
        """Give websockets' parser bytes it owns: the upgrade request, a whole control frame."""
        ServerConnection.data_received(self, data)

    def fail(self, code: int, reason: str) -> None:
        """A protocol violation: close as websockets would (the close frame is sent now)."""
        self.protocol.fail(code, reason)
        self.send_data()

    def abort(self) -> None:
        """Cut the TCP connection at once (a client that does not read cannot take a close)."""
        self.transport.abort()

    async def close_silent(self, code: int, reason: str) -> None:
        """Send a close frame, then cut the TCP connection without waiting for the peer's
        close frame: for a peer that sent nothing in time, whose close would otherwise hold
        its connection slot for websockets' close timeout (10 s). The frame is written before
        the cut, so a peer that reads still learns why."""
        self.close_timeout = 0
        await self.close(code, reason)

    # --- flow control and lifetime -----------------------------------------------------------

    @property
    def write_paused(self) -> bool:
        """Whether the transport is over its write limit (``write_limit``)."""
        paused: bool = self.paused
        return paused

    @property
    def lost(self) -> asyncio.Future[None]:
        """Resolved when the TCP connection is lost."""
        waiter: asyncio.Future[None] = self.connection_lost_waiter
        return waiter

    async def raise_if_closing(self) -> None:
        """Wait for the close handshake to end and raise ``ConnectionClosed``, if the
        connection is not open, or until it is lost if it is dropped (:attr:`is_dropped`);
        return at once if it is open."""
        if self.protocol.state is not State.OPEN:
            async with self.send_context():  # waits for the close, raises ConnectionClosed
                pass
        elif self.is_dropped:
            await asyncio.shield(self.connection_lost_waiter)
            raise self.closed_error()

    async def wait_writable(self, deadline: float | None) -> None:
        """Wait until the transport is under its write limit again (websockets' flow control
        wakes the waiter), up to ``deadline`` (loop time): a timer of the loop's, made only
        when waiting, instead of a cancel scope around every send.

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
        self.drain_waiters.append(waiter)
        try:
            await waiter
        except Exception:  # connection_lost passes its error on
            await asyncio.shield(self.connection_lost_waiter)
            raise self.closed_error() from None
        finally:
            self.drain_waiters.remove(waiter)
            if timer is not None:
                timer.cancel()
        if expired:
            raise TimeoutError("the client took no bytes before the send deadline")


def when_lost(connection: AdaptedConnection, callback: Callable[[], object]) -> Callable[[], None]:
    """Call ``callback`` when ``connection`` is lost; returns the function that undoes it."""

    def fire(_: object) -> None:
        callback()

    connection.lost.add_done_callback(fire)

    def undo() -> None:
        connection.lost.remove_done_callback(fire)

    return undo


__all__ = [
    "SUPPORTED",
    "AdaptedConnection",
    "UnsupportedWebsocketsError",
    "missing_internals",
    "require_internals",
    "when_lost",
]
