"""The server's connections, from each one's hello to its session's end, which may come several
connections later: a session outlives a lost connection (``server/resuming.py``).

With ``server.app``, the listener, the wire (``wire``, ``receiving``, ``sending``,
``websocket``) and ``server.peers`` (pulls from peer servers), the only server modules that
touch sockets.

Per connection: the handshake (the client's :class:`~protocol.Hello`, answered with
:class:`~protocol.Welcome` or :class:`~protocol.Refused`) makes a :class:`Session`; then the
wire decodes messages as their bytes arrive and stops reading the socket while ``max_queued``
of them wait (so TCP pushes back on a client that sends faster than the server runs); one task
takes them in order, runs each (cheap ops on the loop, heavy ones in a bounded worker-thread
pool) and sends its replies (``server/replying.py``) before it takes the next: one task, not a
receiving task handing batches to a working one, whose hand-over would cost a turn of the
event loop on every message. Each message is started by
``server/answering.py``: in the wire's callback that delivers it while the task waits with
nothing queued, else by the task; what cannot be finished there goes on in the task, in order.

Each session is one :class:`Live` record (``server/live.py``): its session, the connection it
serves, its count of messages not yet answered (read by the drain, ``Server.drain``, to close
it with 1001 at once) and, for a session that can resume, the numbered messages it keeps. When
its connection is lost without a close frame, its task answers every message that arrived
whole, then waits, detached, for its client to resume it on another connection (the client's
hello names it and proves it with the secret its welcome gave), and serves that one; the
session ends when its resume window passes, when it is ended for a limit or a drain, or with
its connection if it cannot resume (then a batch in a worker thread is given up on when the
connection is lost).

Guards (docs/security.md): the Origin, the token and the connection count were checked on
the HTTP upgrade (``server.guard``), before a session exists. Each decoder refuses declared
buffers over the message size or the session's quota before allocating them. A batch that
leaves the event loop is watched against the per-op deadline (``server.workers``); past it the
session is closed (close code 1008, reason ``deadline_exceeded: ...``). A reply the client does
not take within the send timeout drops the connection (a resumable session waits for the
client's next); a client that sends nothing for the idle timeout while owed nothing ends it.
Close reasons start with the :class:`~protocol.ErrorCode`.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable
from typing import TYPE_CHECKING

import anyio
from websockets.exceptions import ConnectionClosed

from protocol import (
    FEATURE_RESUME,
    FEATURE_SEGMENTS,
    PROTOCOL_VERSION,
    Batch,
    Dropped,
    ErrorCode,
    ErrorInfo,
    Hello,
    Refused,
    Welcome,
)

from .answering import Answering
from .budget import MemoryBudget
from .config import ServerConfig
from .detached import Detached
from .errors import GOING_AWAY, Drop
from .handshake import check_hello, decode_for, read_hello, welcome
from .limits import Limits
from .live import Attachment, Live
from .logs import fields
from .metrics import REFUSAL_LIMIT, Metrics
from .outcome import Job
from .pulls import Transfers
from .replying import Replies
from .resuming import Resumptions, closed_reason
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


class Connections:
    """Runs every upgraded connection of one server; :attr:`live` holds its sessions (live or
    waiting to be resumed), :attr:`detached` those waiting.

    ``draining`` returns True once the server drains: a session is then closed (1001) as soon
    as it owes nothing, and a detached one ends.
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
        self.detached = Detached(config.max_detached, config.max_detached_per_token)
        self.open = 0  # upgraded connections being handled
        self._config = config
        self._device_count = device_count
        self._transfers = transfers  # its server_id is the server's
        self._budget = budget
        self._workers = workers
        self._metrics = metrics
        metrics.detached_now = self.detached.__len__
        self._draining = draining
        self._answering = Answering(metrics, draining)
        self._out = Replies(config.send_timeout, metrics)
        self._resumptions = Resumptions(self.detached, config.resume_window, metrics, self._out)
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
        self.detached.end_all(ErrorInfo(code=ErrorCode.SESSION_DROPPED, message=GOING_AWAY))
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
                opened = await self._handshake(ws)
        except TimeoutError:
            self.refused("handshake_timeout", ws, "no hello in time")
            await ws.close_silent(1008, f"{ErrorCode.IDLE_TIMEOUT}: no hello within {timeout} s")
            return
        except ConnectionClosed:
            return  # the peer left before its hello
        if isinstance(opened, Live):
            await self._serve(opened)
        elif isinstance(opened, Attachment):
            await opened.released.wait()  # the session's task serves it meanwhile

    async def _handshake(self, ws: WireConnection) -> Live | Attachment | None:
        """Read the hello; open a session (its :class:`Live`), or queue ``ws`` on the session
        it resumes (an :class:`Attachment`), after the welcome; None when refused."""
        hello, error = await read_hello(ws, self._config.max_header_size)
        if hello is not None:
            error = check_hello(hello, self._device_count)
        if hello is not None and error is None and hello.resume is not None:
            return await self._take_up(ws, hello)
        if hello is None or error is not None:
            assert error is not None
            await self._refuse(ws, error)
            return None
        window = self._config.resume_window
        resumable = window > 0 and FEATURE_RESUME in hello.features
        secret = secrets.token_urlsafe(32) if resumable else None
        session = Session(
            secrets.token_hex(8),
            hello.device_index,
            TensorStore(self._config.effective_session_quota, self._budget),
            self._limits,
            self._transfers,
        )
        session.graphs.tell_refusals = FEATURE_SEGMENTS in hello.features
        decode_for(ws, session, self._config)  # before the welcome: the client may send at once
        await self._out.unnumbered(ws, self._welcome(hello, session.session_id, secret))
        return Live(session, ws, secret, ws.client, self._config.effective_session_quota)

    async def _take_up(self, ws: WireConnection, hello: Hello) -> Attachment | None:
        """Resume the session ``hello`` names on ``ws``, if the client proves it owns it."""
        resume = hello.resume
        assert resume is not None
        live = self.live.get(resume.session_id)
        error = self._resumptions.claim(ws, hello, live)
        if error is not None:
            await self._refuse(ws, error)
            return None
        assert live is not None  # claim refuses an unknown session
        decode_for(ws, live.session, self._config)  # before the welcome, as for a new one
        attachment, received = live.take_over(ws, resume.received)
        try:
            welcome = self._welcome(hello, live.session.session_id, live.secret, received)
            await self._out.unnumbered(ws, welcome)
        finally:
            attachment.welcomed.set()  # served from now on, in order, whatever happened
        return attachment

    def _welcome(self, hello: Hello, sid: str, secret: str | None, received: int = 0) -> Welcome:
        return welcome(
            hello,
            device_count=self._device_count,
            server_id=self._transfers.server_id,
            session_id=sid,
            secret=secret,
            window=self._config.resume_window,
            received=received,
            max_message_size=self._config.max_message_size,
        )

    async def _refuse(self, ws: WireConnection, error: ErrorInfo) -> None:
        self.refused(REFUSAL_LIMIT.get(error.code, error.code.value), ws, error.message)
        server_id = self._transfers.server_id
        await self._out.unnumbered(
            ws, Refused(protocol=PROTOCOL_VERSION, error=error, server_id=server_id)
        )
        await ws.close(1000, "handshake refused")

    async def _serve(self, live: Live) -> None:
        """Serve ``live``'s session, on one connection after another while it resumes, until
        it ends; then free it."""
        session = live.session
        sid = session.session_id
        self.live[sid] = live
        self._metrics.sessions_opened.inc()
        address = peer(live.ws)
        log.info(
            "session opened", extra=fields(session=sid, peer=address, device=session.device_index)
        )
        try:
            if self._draining():
                await live.ws.close(1001, GOING_AWAY)
            while await self._run(live) and live.resumable and not self._draining():
                attachment = await self._resumptions.wait(live)
                if attachment is None:
                    break
                await self._resumptions.switch(live, attachment, peer(attachment.ws))
        finally:
            live.release_all()
            del self.live[sid]
            self.detached.record_end(sid, live.secret, live.ended or closed_reason(live.ws))
            self._metrics.retire(session)
            session.close()
            if live.connections_lost:  # the last one, unless it was resumed on another
                self._resumptions.lost.let_go()
            log.info(
                "session closed",
                extra=fields(
                    session=sid, peer=address, ops=session.ops_run, code=live.ws.close_code
                ),
            )
            if self._all_closed is not None and not self.live:
                self._all_closed.set()

    async def _run(self, live: Live) -> bool:
        """Answer the session's messages on its connection one by one, in order, until it
        ends (those that arrive while this waits, where they can be, in the wire's callback:
        ``answering``). True when the connection was lost (no close frame from the client)
        and every message it delivered was answered: the session may be resumed."""
        ws = live.ws
        self._answering.attach(live)
        try:
            while True:
                try:
                    item = await self._receive_idle(ws)
                except ConnectionClosed:
                    return ws.close_received is None
                live.in_flight += 1
                try:
                    await self._answer(live, item)
                except ConnectionClosed:
                    return False  # a session that cannot resume: it ends with its connection
                finally:
                    item.header_hold = None  # its charge given back
                await self._settled(live)
        except Drop as drop:
            self.refused(_DROP_LIMIT.get(drop.code, drop.code.value), ws, drop.reason)
            live.end(ErrorInfo(code=ErrorCode.SESSION_DROPPED, message=drop.reason))
            if drop.code is ErrorCode.SEND_TIMEOUT or ws.write_paused:
                ws.abort()  # the client does not read: a close frame would not pass
            else:
                await ws.close(drop.close_code, drop.reason)
            return False
        finally:
            self._answering.detach(ws)

    async def _receive_idle(self, ws: WireConnection) -> Received:
        """The next message. Raises :class:`Drop` after the idle timeout (it runs only while
        the server owes nothing: messages are answered before the next is taken)."""
        idle = self._config.idle_timeout
        item = await ws.receive(None if ws.is_closed else idle)
        if item is None:
            raise Drop(ErrorCode.IDLE_TIMEOUT, f"nothing received for {idle} s")
        return item

    async def _answer(self, live: Live, item: Received) -> None:
        """Run one received message and send its replies: start it, unless it was started
        where it arrived (``server/answering.py``), and go on with what that left.

        Raises:
            Drop: the op deadline passed, a worker step failed, or a reply was not taken.
        """
        session = live.session
        if not item.started:
            self._answering.start(live, item)
        if item.failure is not None:
            raise item.failure
        if item.answered:  # its replies were sent: wait until they are taken
            await self._out.taken(live)
            return
        if not isinstance(item.message, Batch):
            error = item.error or ErrorInfo(
                code=ErrorCode.BAD_MESSAGE, message="hello is only valid as the first message"
            )
            # the client's fault, answered with a typed error: not a warning of the server's
            log.info("bad message", extra=fields(session=session.session_id, error=error.message))
            await self._out.send(live, Dropped(message=item.number, error=error))  # none of it ran
            return
        job = item.job
        assert job is not None  # a batch's job is started with it
        ws = live.ws
        while not session.step(job, inline=True, contended=ws.contended(), alone=ws.alone()):
            await self._off_loop(live, job)
        if session.closed:
            raise Drop(ErrorCode.INTERNAL, "a worker step failed; see the server log")
        for n, (reply, buffers) in enumerate(session.replies(job), 1):
            await self._out.send(live, reply, tuple(buffers))
            if not n % REPLIES_PER_TURN:  # a turn of the loop for the other sessions
                await anyio.lowlevel.checkpoint()
        if item.ack_due:
            await self._out.acknowledge(live)
        self._answering.answered(item, item.message)

    async def _off_loop(self, live: Live, job: Job) -> None:
        """Run the rest of ``job`` in a worker thread (:meth:`Workers.run`); stop waiting for
        it if the connection is lost meanwhile, unless the session can be resumed (the session
        ends; the thread finishes alone).

        Raises:
            ConnectionClosed: the connection was lost.
            Drop: from :meth:`Workers.run`.
        """
        if live.resumable:
            await self._workers.run(live.session, job)
            return
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
