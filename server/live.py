"""A session's life across connections: its live record, the server messages it keeps until
the client has them, and the connections that take it up again after one was lost.

Protocol v2 numbers the messages each side sends after the handshake, from 1, across every
connection of the session (protocol/README.md, "Resuming a session"). The server keeps each
numbered message it sends (a reply, a ``SessionError``, a ``Dropped``) in the session's
:class:`Outbox` until the client's ``Batch.ack`` says it arrived, so that a client that lost
its connection gets the ones it missed again, in order, on the next: a request is answered
exactly once however often the connection drops. A read reply kept here holds the memory it
sends from, as a reply being sent does: an in-place write moves that memory first
(``TensorStore.share``), so the reply sent again has the values of the first.

The session's task (``server/connection.py``) serves one connection at a time: each resuming
connection is queued as an :class:`Attachment` and taken once the task has run every message
that arrived whole on the one before (those count as received: the client never sends them
again).
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
from dataclasses import dataclass, field

import anyio

from protocol import ErrorCode, ErrorInfo

from .session import Session
from .wire import WireConnection

Chunks = Sequence[bytes | memoryview]  # one encoded message (protocol.encode)
ACK_EVERY = 8  # client messages taken without a reply before the server acknowledges them
ACK_BYTES = 1 << 20  # bytes of them, likewise (the client's COPY_BELOW: it waits for this ack)
KEPT_MOST = 4096  # numbered messages a session keeps unacknowledged before it cannot resume


@dataclass(eq=False)
class Outbox:
    """The numbered messages sent to the client and not yet acknowledged (only while
    ``keep``: a session that cannot resume keeps nothing). A client that leaves more than
    :data:`KEPT_MOST` messages or ``most_bytes`` unacknowledged (this client acknowledges
    with every message it sends) makes its session one that cannot resume: what is kept is
    let go, so that it cannot hold the server's memory outside its quota."""

    keep: bool
    most_bytes: int = 1 << 62
    sent: int = 0  # numbered messages so far: the last one's number
    kept_bytes: int = 0
    _kept: collections.deque[tuple[int, Chunks]] = field(default_factory=collections.deque)

    def add(self, chunks: Chunks) -> None:
        """Number the message ``chunks`` and keep it until it is acknowledged."""
        self.sent += 1
        if self.keep:
            self._kept.append((self.sent, chunks))
            self.kept_bytes += _size(chunks)
            if len(self._kept) > KEPT_MOST or self.kept_bytes > self.most_bytes:
                self.keep = False
                self._kept.clear()
                self.kept_bytes = 0

    def forget(self, received: int) -> None:
        """The client has received messages 1..``received``: drop them."""
        kept = self._kept
        while kept and kept[0][0] <= received:
            self.kept_bytes -= _size(kept.popleft()[1])

    def since(self, received: int) -> list[Chunks] | None:
        """The messages after number ``received``, to send again; None when that is not a
        number this outbox can resume from (past what was sent, or before what it keeps)."""
        self.forget(received)
        first = self._kept[0][0] if self._kept else self.sent + 1
        if not self.keep or received > self.sent or received < first - 1:
            return None
        return [chunks for _, chunks in self._kept]


@dataclass(eq=False)
class Attachment:
    """A connection that resumed a session: the session takes it up once done with the one
    before and once its welcome was sent (``welcomed``); ``received`` is how many numbered
    messages the client had then. ``released`` is set when the session is done with it (lost,
    or the session ended)."""

    ws: WireConnection
    received: int
    released: anyio.Event = field(default_factory=anyio.Event)
    welcomed: anyio.Event = field(default_factory=anyio.Event)  # its welcome went out (or not)


@dataclass(eq=False)
class Live:
    """One session, live or detached: its :class:`Session`, the connection it serves now
    (``ws``), the last connection given to it (``latest``: its message numbers are the
    newest), what it kept for a resumption and who may resume it.

    ``secret`` (None: the session ends with its connection) is the resume secret its welcome
    gave; ``client`` groups sessions by the bearer token presented (the detached limits).
    ``in_flight`` counts messages received but not answered yet.
    """

    session: Session
    ws: WireConnection
    secret: str | None = field(default=None, repr=False)
    client: str = ""
    kept_most: int = 1 << 62  # bytes the outbox may keep (the session's quota)
    in_flight: int = 0
    outbox: Outbox = field(init=False)
    latest: WireConnection = field(init=False)
    unacked: int = 0  # client messages taken since the client last learned of one
    unacked_bytes: int = 0
    connections_lost: int = 0
    ended: ErrorInfo | None = None  # why it was ended while it waited to be resumed
    _queued: collections.deque[Attachment] = field(default_factory=collections.deque)
    _serving: Attachment | None = None
    _changed: anyio.Event = field(default_factory=anyio.Event)
    _closed: bool = False  # ended and let go: nothing more is queued

    def __post_init__(self) -> None:
        self.outbox = Outbox(keep=self.secret is not None, most_bytes=self.kept_most)
        self.latest = self.ws

    @property
    def resumable(self) -> bool:
        return self.secret is not None and self.ended is None and self.outbox.keep

    def idle(self) -> bool:
        """Whether the session owes nothing: no message being answered, none waiting whole."""
        return self.in_flight == 0 and not self.ws.waiting

    # --- resuming ------------------------------------------------------------------------------

    def take_over(self, ws: WireConnection, received: int) -> tuple[Attachment, int]:
        """Queue ``ws``, a resuming connection whose client has ``received`` numbered
        messages: cut the connection given before it (the client has left it; nothing more is
        taken from it), and give ``ws`` the numbers after its messages. Returns the
        attachment, to be served in order once its welcome is sent, and how many client
        messages the session has received whole (the welcome's ``received``)."""
        self.latest.seal()
        self.latest.abort()
        client_messages = self.latest.delivered
        ws.number_from(client_messages + 1)
        self.latest = ws
        attachment = Attachment(ws, received)
        if self._closed:
            attachment.released.set()
        else:
            self._queued.append(attachment)
            self._wake()
        return attachment, client_messages

    def detached(self) -> None:
        """The connection served was lost."""
        self.connections_lost += 1
        if self._serving is not None:
            self._serving.released.set()
            self._serving = None

    def attach(self, attachment: Attachment) -> None:
        """Serve ``attachment``'s connection from now on."""
        self.ws = attachment.ws
        self._serving = attachment

    def end(self, error: ErrorInfo) -> None:
        """End the session while it waits to be resumed (its task finishes it)."""
        if self.ended is None:
            self.ended = error
            self._wake()

    async def next_attachment(self, within: float) -> Attachment | None:
        """The next connection to serve, waiting up to ``within`` seconds for one; None when
        none came in time (``ended`` then says why) or the session was ended meanwhile."""
        with anyio.move_on_after(within):
            while not self._queued and self.ended is None:
                await self._changed.wait()
                self._changed = anyio.Event()
        if self.ended is None and not self._queued:
            self.ended = ErrorInfo(
                code=ErrorCode.SESSION_EXPIRED,
                message=f"no client resumed it within the resume window ({within:g} s)",
            )
        if self.ended is not None:
            return None
        return self._queued.popleft()

    def release_all(self) -> None:
        """The session ended: let every queued connection go (their handlers close them)."""
        self._closed = True
        if self._serving is not None:
            self._serving.released.set()
        while self._queued:
            self._queued.popleft().released.set()

    def took(self, nbytes: int, requests: int) -> bool:
        """A client message of ``nbytes`` with ``requests`` requests was taken: whether to
        acknowledge it with an :class:`~protocol.Ack` once it ran. A reply acknowledges its
        message (and every one before); else every :data:`ACK_EVERY` messages or
        :data:`ACK_BYTES` bytes, and at once after a message of :data:`ACK_BYTES` or more, for
        which the client waits (it keeps the caller's memory only until then). Also once the
        outbox gave up keeping: the client keeps its messages and waits all the same."""
        if self.secret is None:
            return False
        if requests:
            self.unacked = self.unacked_bytes = 0
            return False
        self.unacked += 1
        self.unacked_bytes += nbytes
        if self.unacked >= ACK_EVERY or self.unacked_bytes >= ACK_BYTES:
            self.unacked = self.unacked_bytes = 0
            return True
        return False

    def _wake(self) -> None:
        self._changed.set()


def _size(chunks: Chunks) -> int:
    return sum(memoryview(c).nbytes for c in chunks)


__all__ = ["Attachment", "Chunks", "Live", "Outbox"]
