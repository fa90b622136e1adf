"""Sessions taken up again on a new connection: the claim a resuming hello makes checked, the
wait of a detached session for its client (within ``--resume-window`` and the limits on waiting
sessions, ``server/detached.py``), and the switch to the new connection, on which the numbered
messages the client missed are sent again first (``server/live.py``).
"""

from __future__ import annotations

import asyncio
import gc
import logging

from protocol import ErrorCode, ErrorInfo, Hello

from .detached import Detached
from .live import Attachment, Live
from .logs import fields
from .metrics import Metrics
from .replying import Replies
from .websocket import WebSocket
from .wire import WireConnection

log = logging.getLogger("tensorwire.server")

COLLECT_EVERY = 256  # connections let go of (some 2.4 kB each) before a full collection


class Resumptions:
    """The detached sessions of one server and their resumptions; ``window`` is
    ``--resume-window`` in seconds."""

    def __init__(
        self, detached: Detached, window: float, metrics: Metrics, replies: Replies
    ) -> None:
        self.detached = detached
        self.window = window
        self.lost = LostConnections()
        self._metrics = metrics
        self._replies = replies

    def claim(self, ws: WireConnection, hello: Hello, live: Live | None) -> ErrorInfo | None:
        """Why ``hello`` (with a resume claim, on ``ws``) cannot take up ``live``, the session
        of its id (None: no such session), or None when it can."""
        assert hello.resume is not None
        error = self.detached.refusal(hello.resume, live, ws.client)
        if error is None and live is not None and hello.device_index != live.session.device_index:
            error = ErrorInfo(code=ErrorCode.SESSION_UNKNOWN, message="another device's session")
        if error is None and live is None:
            error = ErrorInfo(code=ErrorCode.SESSION_UNKNOWN, message="no such session")
        if error is None and live is not None and not live.resumable:
            why = "it kept no replies to send again (too many were left unacknowledged)"
            error = ErrorInfo(code=ErrorCode.SESSION_DROPPED, message=f"it cannot resume: {why}")
        return error

    async def wait(self, live: Live) -> Attachment | None:
        """Wait, detached, for a connection that resumes ``live``; None when the resume
        window passed or the session was ended meanwhile (``live.ended`` says why)."""
        sid = live.session.session_id
        live.detached()
        self.detached.add(live)
        self._metrics.sessions_detached.inc()
        log.info("session detached", extra=fields(session=sid, window_s=self.window))
        try:
            attachment = await live.next_attachment(self.window)
        finally:
            self.detached.remove(live)
        if attachment is None and live.ended is not None:
            log.info("detached session ended", extra=fields(session=sid, reason=live.ended.code))
        return attachment

    async def switch(self, live: Live, attachment: Attachment, peer: str) -> None:
        """Serve ``attachment``'s connection from now on: first the numbered messages its
        client has not received, again. A client that claims to have received messages the
        session cannot account for ends it."""
        ws = attachment.ws
        await attachment.welcomed.wait()  # bounded: the welcome's send has --send-timeout
        live.attach(attachment)
        self.lost.let_go()
        kept = live.outbox.since(attachment.received)
        if kept is None:
            error = (
                f"the client says it received {attachment.received} messages; the server "
                f"sent {live.outbox.sent}"
            )
            live.end(ErrorInfo(code=ErrorCode.SESSION_DROPPED, message=error))
            await ws.close(1008, f"{ErrorCode.BAD_MESSAGE}: {error}")
            return
        for chunks in kept:
            await self._replies.write(live, chunks)
        self._metrics.sessions_resumed.inc()
        log.info(
            "session resumed",
            extra=fields(session=live.session.session_id, peer=peer, sent_again=len(kept)),
        )


class LostConnections:
    """Collects the connections sessions let go of after outliving them: in a full collection
    once :data:`COLLECT_EVERY` have piled up. A lost connection's objects that are reference
    cycles (websockets' protocol object and its parser) stay referenced by a session that
    outlives it, long enough for the server's rare collections to move them to the oldest
    generation; a full collection walks every object of the server, so it is not made for
    each one (bench/REASONS.md, 'Collecting connections a session outlived')."""

    def __init__(self) -> None:
        self._pending = 0

    def let_go(self, count: int = 1) -> None:
        """A session let go of ``count`` lost connections."""
        self._pending += count
        if self._pending >= COLLECT_EVERY:
            self._pending = 0
            asyncio.get_running_loop().call_soon(gc.collect)


def closed_reason(ws: WebSocket) -> ErrorInfo:
    """Why a session whose task ended on its own ended, for a resumption that comes later."""
    how = "its client closed it" if ws.close_received is not None else "its connection ended"
    return ErrorInfo(code=ErrorCode.SESSION_DROPPED, message=f"the session ended: {how}")


__all__ = ["COLLECT_EVERY", "LostConnections", "Resumptions", "closed_reason"]
