"""Sessions that lost their connection and wait, within their resume window, for their client
to take them up again: the limits on how many wait (in all, and per bearer token presented),
oldest ended first, and why recent sessions ended, so that a resumption that comes too late is
told which it was (expired, dropped) rather than only that the session is unknown.
"""

from __future__ import annotations

import collections
import hashlib
import hmac
import logging

from protocol import ErrorCode, ErrorInfo
from protocol.messages import Resume

from .live import Live
from .logs import fields

log = logging.getLogger("tensorwire.server")

ENDED_KEPT = 4096  # ended sessions remembered for the resumptions that come late


class Detached:
    """The detached sessions of one server, oldest first."""

    def __init__(self, max_total: int, max_per_client: int) -> None:
        self.max_total = max_total
        self.max_per_client = max_per_client
        self._waiting: collections.OrderedDict[str, Live] = collections.OrderedDict()
        # why each recent session ended, behind its secret's digest
        self._ended: collections.OrderedDict[str, tuple[bytes, ErrorInfo]] = (
            collections.OrderedDict()
        )

    def __len__(self) -> int:
        return len(self._waiting)

    def add(self, live: Live) -> None:
        """``live`` lost its connection: it waits now. Past a limit, the oldest waiting
        session (of its client, or of all) is ended, with a log line."""
        sid = live.session.session_id
        self._waiting[sid] = live
        mine = [w for w in self._waiting.values() if w.client == live.client]
        if len(mine) > self.max_per_client:
            self._drop(mine[0], f"--max-detached-per-token ({self.max_per_client})")
        if len(self._waiting) > self.max_total:
            self._drop(next(iter(self._waiting.values())), f"--max-detached ({self.max_total})")

    def remove(self, live: Live) -> None:
        """``live`` is attached again, or ended."""
        self._waiting.pop(live.session.session_id, None)

    def record_end(self, session_id: str, secret: str | None, error: ErrorInfo) -> None:
        """Remember why session ``session_id`` (resumed with ``secret``; None: it could not
        be) ended, for a resumption that comes later, with its secret."""
        if secret is None:
            return
        self._ended[session_id] = (_digest(secret), error)
        self._ended.move_to_end(session_id)
        while len(self._ended) > ENDED_KEPT:
            self._ended.popitem(last=False)

    def end_all(self, error: ErrorInfo) -> None:
        """End every waiting session (the server drains)."""
        for live in list(self._waiting.values()):
            live.end(error)
        self._waiting.clear()

    def refusal(self, resume: Resume, live: Live | None, client: str) -> ErrorInfo | None:
        """Why ``resume`` cannot take up ``live`` (the session of its id, if any) for the
        client ``client``, or None when it can. A wrong secret or another token reads as an
        unknown session: nothing tells a guesser that the id exists."""
        if live is not None and live.secret is not None:
            secret_ok = hmac.compare_digest(live.secret.encode(), resume.secret.encode())
            if secret_ok and hmac.compare_digest(live.client, client):
                return live.ended
        elif (ended := self._ended.get(resume.session_id)) is not None:
            digest, error = ended
            if hmac.compare_digest(digest, _digest(resume.secret)):
                return error
        return ErrorInfo(
            code=ErrorCode.SESSION_UNKNOWN,
            message=f"no session {resume.session_id} to resume on this server",
        )

    def _drop(self, live: Live, limit: str) -> None:
        sid = live.session.session_id
        del self._waiting[sid]
        live.end(
            ErrorInfo(
                code=ErrorCode.SESSION_DROPPED,
                message=f"ended while it waited to be resumed: too many detached sessions {limit}",
            )
        )
        log.info("detached session dropped", extra=fields(session=sid, limit=limit))


def _digest(secret: str) -> bytes:
    """What is kept of an ended session's secret: enough to check a claim, not to make one."""
    return hashlib.sha256(secret.encode()).digest()


__all__ = ["ENDED_KEPT", "Detached"]
