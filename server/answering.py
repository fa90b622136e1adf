"""Answering a message in the callback that received it, while its session's task is idle.

The connection loop (``server/connection.py``) answers messages one by one in its session's
task, which waits in :meth:`~server.receiving.ReceivingConnection.receive`. Waking that task
costs a turn of the event loop per message: about 13-20 us of the server's CPU on a one-element
read, of some 75 (``bench/README.md``, "The cost of one message"). So when a message arrives
while the task waits with nothing queued (nothing received is unanswered, nothing is being
sent), the wire's callback answers it here at once, exactly as the task would have: the batch
runs as far as it runs on the loop, its replies are sent, the same metrics are counted.

Whatever needs more than that goes to the task, as before: a batch with an op too costly for
the loop (its job, started here, is handed over with the message and the task runs the rest in
a worker thread), a refused batch, a message that is not a batch, more than
:data:`MOST_REPLIES` replies or replies of more than :data:`MOST_REPLY_BYTES` tensor bytes (the
task sends them under the send timeout and flow control), and every message while the server
drains or the connection is not open. Replies sent here that leave the transport over its write
limit (a client that does not read) are handed to the task too, which waits for the client to
take them under the send timeout, as it waits for its own. An exception raised here is handed
to the task and raised there, so the connection ends as it would have (closed with 1011).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial

from protocol import Batch, Read, encode

from .incoming import Received
from .metrics import Metrics
from .session import Session
from .wire import WireConnection

MOST_REPLY_BYTES = 1 << 16  # tensor bytes of the replies to a batch answered here, at most
MOST_REPLIES = 64  # replies to a batch answered here, at most (each some 100-300 bytes)


class Answering:
    """Answers a session's messages in the wire's callback where the task would only have
    taken a loop turn to do the same (see the module docstring)."""

    def __init__(self, metrics: Metrics, draining: Callable[[], bool]) -> None:
        self._metrics = metrics
        self._draining = draining

    def attach(self, session: Session, ws: WireConnection) -> None:
        """Answer ``session``'s messages on ``ws`` here from now on, where they can be."""
        ws.answer_now = partial(self._answer, session, ws)

    @staticmethod
    def detach(ws: WireConnection) -> None:
        ws.answer_now = None

    def _answer(self, session: Session, ws: WireConnection, item: Received) -> bool:
        """Answer ``item`` now; False leaves it to the task (see :class:`Received`'s fields)."""
        batch = item.message
        if (
            not isinstance(batch, Batch)
            or item.error is not None
            or len(batch.requests) > MOST_REPLIES
            or self._draining()
            or not ws.can_send_now()
        ):
            return False
        try:
            self._run(session, ws, item, batch)
        except Exception as exc:  # noqa: BLE001 - the task raises it (see the module docstring)
            item.failure = exc
            return False
        return item.job is None and not item.answered

    def _run(self, session: Session, ws: WireConnection, item: Received, batch: Batch) -> None:
        """Run and answer ``batch``, or stop where the task must go on (``item.job``); mark
        ``item.answered`` when the replies sent leave the transport over its write limit."""
        job = session.start(batch, item.buffers)
        if (
            not session.step(job, inline=True)
            or session.closed
            or len(batch.requests) + len(job.errors) > MOST_REPLIES
            or session.reply_bytes(batch) > MOST_REPLY_BYTES
        ):
            item.job = job  # the task goes on from where this stopped
            return
        metrics = self._metrics
        metrics.answered_on_arrival.inc()
        metrics.received_bytes.inc(item.nbytes)
        sent = 0
        for reply, buffers in session.finish(job):
            sent += ws.send_message_now(encode(reply, tuple(buffers)))
        metrics.sent_bytes.inc(sent)
        reads = sum(isinstance(r, Read) for r in batch.requests)
        metrics.read_done(reads, time.perf_counter() - item.at)
        item.answered = ws.write_paused
