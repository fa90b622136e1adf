"""One websocket connection of the server, from its hello to its session's end.

With ``server.app``, the listener, the wire (``wire``, ``receiving``, ``sending``,
``websocket``) and ``server.peers`` (pulls from peer servers), the only server modules that
touch sockets.

Per connection: the handshake (the client's :class:`~protocol.Hello`, answered with
:class:`~protocol.Welcome` or :class:`~protocol.Refused`) makes a :class:`Session`; then the
wire decodes messages as their bytes arrive and stops reading the socket while ``max_queued``
of them wait (so TCP pushes back on a client that sends faster than the server runs); one task
takes them in order, runs each (cheap ops on the loop, heavy ones in a bounded worker-thread
pool, given up if the connection is lost meanwhile) and sends its replies before it takes the
next: one task, not a receiving task handing batches to a working one, whose hand-over would
cost a turn of the event loop on every message. Each message is started by
``server/answering.py``: in the wire's callback that delivers it while the task waits with
nothing queued, else by the task; what cannot be finished there goes on in the task, in order.

Each live session is one :class:`Live` record: its session, its connection and its count of
messages not yet answered, read by the drain (``Server.drain``) to close it (1001) at once.

Guards (docs/security.md): the Origin, the token and the connection count were checked on
the HTTP upgrade (``server.guard``), before a session exists. Each decoder refuses declared
buffers over the message size or the session's quota before allocating them. A batch that
leaves the event loop is watched against the per-op deadline (``server.workers``); past it the
session is closed (close code 1008, reason ``deadline_exceeded: ...``). A reply the client does
not take within the send timeout drops the connection; so does a client that sends nothing for
the idle timeout while owed nothing. Close reasons start with the :class:`~protocol.ErrorCode`.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import anyio
from websockets.exceptions import ConnectionClosed

from protocol import (
    CLIENT_ADAPTER,
    PROTOCOL_VERSION,
    Batch,
    Dropped,
    ErrorCode,
    ErrorInfo,
    Hello,
    MessageDecoder,
    Refused,
    Welcome,
    encode,
)
from protocol.messages import Message

from .answering import Answering
from .budget import MemoryBudget
from .config import ServerConfig
from .errors import GOING_AWAY, Drop
from .limits import Limits
from .logs import fields
from .metrics import REFUSAL_LIMIT, Metrics
from .outcome import Job
from .pulls import Transfers
from .receiving import STEPWISE_HEADER
from .session import Session
from .store import TensorStore
from .websocket import WebSocket, when_lost
from .wire import WireConnection
from .workers import Workers

if TYPE_CHECKING:
    from .incoming import Received  # what the wire hands over; annotations only

log = logging.getLogger("tensorwire.server")

REPLIES_PER_TURN = 64  # replies sent before other connections have a turn
_DROP_LIMIT = {  # refusals_total label of each reason a session is dropped
    ErrorCode.IDLE_TIMEOUT: "idle",
    ErrorCode.SEND_TIMEOUT: "send_timeout",
    ErrorCode.DEADLINE_EXCEEDED: "deadline",
    ErrorCode.SHUTTING_DOWN: "shutdown",
}


@dataclass(eq=False)
class Live:
    """One live session: its :class:`Session`, its connection, and how many messages it sent
    that are received but not answered yet."""

    session: Session
    ws: WireConnection
    in_flight: int = 0

    def idle(self) -> bool:
        """Whether the session owes nothing: no message being answered, none waiting whole."""
        return self.in_flight == 0 and not self.ws.waiting


class Connections:
    """Runs every upgraded connection of one server; :attr:`live` holds its sessions.

    ``draining`` returns True once the server drains: a session is then closed (1001) as soon
    as it owes nothing.
    """

    def __init__(
        self,
        config: ServerConfig,
        device_count: int,
        transfers: Transfers,
        budget: MemoryBudget,
        workers: Workers,
        metrics: Metrics,
        draining: Callable[[], bool],
    ) -> None:
        self.live: dict[str, Live] = {}  # by session id
        self.open = 0  # upgraded connections being handled
        self._config = config
        self._device_count = device_count
        self._transfers = transfers  # its server_id is the server's
        self._budget = budget
        self._workers = workers
        self._metrics = metrics
        self._draining = draining
        self._answering = Answering(metrics, draining)
        self._limits = Limits(
            max_op_bytes=config.max_op_bytes,
            max_ndim=config.max_ndim,
            max_graphs=config.max_graphs,
            max_graph_bytes=config.max_graph_bytes,
            max_op_cost=config.max_op_cost,
        )
        self._all_closed: anyio.Event | None = None  # set when the last session leaves

    async def all_closed(self) -> None:
        """Return once no session is left (while draining, no new one comes)."""
        if self.live:
            self._all_closed = anyio.Event()
            await self._all_closed.wait()

    def refused(self, limit: str, ws: WebSocket, reason: str) -> None:
        """Count and log a connection, or work, refused because of ``limit``."""
        self._metrics.refused(limit)
        log.info("refused", extra=fields(limit=limit, peer=peer(ws), reason=reason))

    async def handle(self, ws: WebSocket) -> None:
        """The handler of one upgraded connection: serve it until it ends."""
        assert isinstance(ws, WireConnection)  # the listener makes them
        self.open += 1
        try:
            await self._handle_open(ws)
        finally:
            self.open -= 1

    async def _handle_open(self, ws: WireConnection) -> None:
        timeout = self._config.handshake_timeout
        try:
            with anyio.fail_after(timeout):
                session = await self._handshake(ws)
        except TimeoutError:
            self.refused("handshake_timeout", ws, "no hello in time")
            await ws.close_silent(1008, f"{ErrorCode.IDLE_TIMEOUT}: no hello within {timeout} s")
            return
        except ConnectionClosed:
            return  # the peer left before its hello
        if session is None:
            return
        sid = session.session_id
        live = self.live[sid] = Live(session, ws)
        self._metrics.sessions_opened.inc()
        address = peer(ws)
        log.info(
            "session opened", extra=fields(session=sid, peer=address, device=session.device_index)
        )
        try:
            if self._draining():
                await ws.close(1001, GOING_AWAY)
            await self._run(live)
        except ConnectionClosed:
            pass  # the peer went away, or was cut off, while a reply was being sent
        finally:
            del self.live[sid]
            self._metrics.retire(session)
            session.close()
            log.info(
                "session closed",
                extra=fields(session=sid, peer=address, ops=session.ops_run, code=ws.close_code),
            )
            if self._all_closed is not None and not self.live:
                self._all_closed.set()

    async def _handshake(self, ws: WireConnection) -> Session | None:
        max_header = self._config.max_header_size
        ws.decode_one(lambda: MessageDecoder(CLIENT_ADAPTER, max_header, max_buffer_bytes=0))
        ws.max_header = max_header
        received = await ws.receive()
        assert received is not None  # no timeout given
        hello = received.message
        error: ErrorInfo | None = received.error
        if error is None and not isinstance(hello, Hello):
            error = ErrorInfo(code=ErrorCode.BAD_MESSAGE, message="the first message must be hello")
        elif isinstance(hello, Hello):
            error = self._check_hello(hello)
        if error is not None or not isinstance(hello, Hello):
            assert error is not None
            self.refused(REFUSAL_LIMIT.get(error.code, error.code.value), ws, error.message)
            await self._send(ws, Refused(protocol=PROTOCOL_VERSION, error=error))
            await ws.close(1000, "handshake refused")
            return None
        store = TensorStore(self._config.effective_session_quota, self._budget)
        session = Session(
            secrets.token_hex(8), hello.device_index, store, self._limits, self._transfers
        )
        self._decode_for(ws, session)  # before the welcome: the client may send at once
        await self._send(
            ws,
            Welcome(
                protocol=PROTOCOL_VERSION,
                device_index=hello.device_index,
                device_count=self._device_count,
                server_id=self._transfers.server_id,
                session_id=session.session_id,
            ),
        )
        return session

    def _decode_for(self, ws: WireConnection, session: Session) -> None:
        """Decode what ``ws`` receives from now on as ``session``'s batches: limits checked,
        uploads refused by its quota before they are allocated."""
        config = self._config
        ws.max_waiting = config.max_queued  # first: setting decoders parses what waited
        ws.decoders = lambda: MessageDecoder(
            CLIENT_ADAPTER,
            config.max_header_size,
            max_buffer_bytes=config.max_message_size,
            check=lambda m: session.check_upload(m) if isinstance(m, Batch) else None,
            max_buffers=config.max_buffers,
            allocate=session.store.hold_upload,  # counted from allocation (server/budget.py)
            stepwise_over=STEPWISE_HEADER,  # a longer header: validated in slices of the loop
        )

    def _check_hello(self, hello: Hello) -> ErrorInfo | None:
        count = self._device_count
        if hello.protocol != PROTOCOL_VERSION:
            return ErrorInfo(
                code=ErrorCode.VERSION_MISMATCH,
                message=(
                    f"client speaks protocol v{hello.protocol}, this server speaks "
                    f"v{PROTOCOL_VERSION}; upgrade the older side"
                ),
            )
        if hello.device_index >= count:
            return ErrorInfo(
                code=ErrorCode.BAD_DEVICE_INDEX,
                message=(
                    f"device index {hello.device_index} does not exist: this server hosts "
                    f"{count} device(s), indices 0..{count - 1}"
                ),
            )
        return None  # the token was checked on the upgrade request (server.guard)

    async def _send(
        self, ws: WireConnection, message: Message, buffers: tuple[memoryview, ...] = ()
    ) -> None:
        """Send one message and count its bytes.

        Raises:
            Drop: ``send_timeout``, the client did not take it within ``send_timeout``.
        """
        try:
            sent = await ws.send_message(encode(message, buffers), self._config.send_timeout)
            self._metrics.messages.sent_bytes += sent
        except TimeoutError:
            raise self._not_taken() from None

    async def _run(self, live: Live) -> None:
        """Answer the session's messages one by one, in order, until it ends (those that
        arrive while this waits, where they can be, in the wire's callback: ``answering``)."""
        ws = live.ws
        self._answering.attach(live.session, ws)
        try:
            while True:
                try:
                    item = await self._receive_idle(ws)
                except ConnectionClosed:
                    return
                live.in_flight += 1
                await self._answer(live, item)
                await self._settled(live)
        except Drop as drop:
            self.refused(_DROP_LIMIT.get(drop.code, drop.code.value), ws, drop.reason)
            if drop.code is ErrorCode.SEND_TIMEOUT or ws.write_paused:
                ws.abort()  # the client does not read: a close frame would not pass
            else:
                await ws.close(drop.close_code, drop.reason)
        finally:
            self._answering.detach(ws)

    async def _receive_idle(self, ws: WireConnection) -> Received:
        """The next message. Raises :class:`Drop` after the idle timeout (it runs only while
        the server owes nothing: messages are answered before the next is taken)."""
        idle = self._config.idle_timeout
        item = await ws.receive(idle)
        if item is None:
            raise Drop(ErrorCode.IDLE_TIMEOUT, f"nothing received for {idle} s")
        return item

    async def _answer(self, live: Live, item: Received) -> None:
        """Run one received message and send its replies: start it, unless it was started
        where it arrived (``server/answering.py``), and go on with what that left.

        Raises:
            Drop: the op deadline passed, a worker step failed, or a reply was not taken.
        """
        ws, session = live.ws, live.session
        if not item.started:
            self._answering.start(session, ws, item)
        if item.failure is not None:
            raise item.failure
        if item.answered:  # its replies were sent: wait until they are taken
            await self._taken(ws)
            return
        if not isinstance(item.message, Batch):
            error = item.error or ErrorInfo(
                code=ErrorCode.BAD_MESSAGE, message="hello is only valid as the first message"
            )
            log.warning(
                "bad message", extra=fields(session=session.session_id, error=error.message)
            )
            await self._send(ws, Dropped(message=item.number, error=error))  # none of it ran
            return
        job = item.job
        assert job is not None  # a batch's job is started with it
        while not session.step(job, inline=True):
            await self._off_loop(live, job)
        if session.closed:
            raise Drop(ErrorCode.INTERNAL, "a worker step failed; see the server log")
        for n, (reply, buffers) in enumerate(session.replies(job), 1):
            await self._send(ws, reply, tuple(buffers))
            if not n % REPLIES_PER_TURN:  # a turn of the loop for the other sessions
                await anyio.lowlevel.checkpoint()
        self._answering.answered(item, item.message)

    async def _taken(self, ws: WireConnection) -> None:
        """Wait until the transport is under its write limit again, as a send does.

        Raises:
            Drop: ``send_timeout``, the client did not take the replies in time.
        """
        if not ws.write_paused:
            return
        try:
            await ws.wait_writable(ws.loop.time() + self._config.send_timeout)
        except TimeoutError:
            raise self._not_taken() from None

    def _not_taken(self) -> Drop:
        timeout = self._config.send_timeout
        return Drop(ErrorCode.SEND_TIMEOUT, f"the client took no reply for {timeout} s")

    async def _off_loop(self, live: Live, job: Job) -> None:
        """Run the rest of ``job`` in a worker thread (:meth:`Workers.run`); stop waiting for
        it if the connection is lost meanwhile (the session ends; the thread finishes alone).

        Raises:
            ConnectionClosed: the connection was lost.
            Drop: from :meth:`Workers.run`.
        """
        with anyio.CancelScope() as scope:
            forget = when_lost(live.ws, scope.cancel)
            try:
                await self._workers.run(live.session, job)
            finally:
                forget()
        if scope.cancelled_caught:
            raise live.ws.closed_error()

    async def _settled(self, live: Live) -> None:
        """One received message is answered; while draining, close the session once nothing
        it sent waits."""
        live.in_flight -= 1
        if self._draining() and live.idle():
            await live.ws.close(1001, GOING_AWAY)


def peer(ws: WebSocket) -> str:
    """The client's address as ``host:port`` (``[host]:port`` for IPv6), for the log."""
    address = ws.remote_address
    if isinstance(address, tuple) and len(address) >= 2:
        host = address[0]
        return f"[{host}]:{address[1]}" if ":" in str(host) else f"{host}:{address[1]}"
    return str(address)
