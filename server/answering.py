"""Running one received message: as far as it goes on the event loop at once; the rest is its
session's task's.

Every message starts here, once (:meth:`Answering.start`): a batch's job is started and its ops
run on the loop (``Session.step`` inline) until one is too costly for the loop or a slice of
loop time ends. If that finishes the batch, its replies are few and small (at most
:data:`MOST_REPLIES` replies and :data:`MOST_REPLY_BYTES` tensor bytes) and the connection can
send now, the replies are sent at once. Whatever is left is the session's task's
(``server/connection.py``), which goes on from where this stopped: steps in a worker thread,
replies sent under flow control and the send timeout, the answer to a message that is not a
batch, and every reply while the server drains.

Where it starts: in the wire's callback that delivers the message, while the session's task
waits with nothing queued, which saves the task a turn of the event loop (bench/REASONS.md,
'Answering on arrival'); else in the task, when it takes the message. An exception raised here
is kept with the message and raised by the task, so the connection ends the same way wherever
the message started (closed with 1011).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial

from protocol import Ack, Batch, Read, encode

from .incoming import Received
from .live import Live
from .metrics import Metrics
from .wire import WireConnection

MOST_REPLY_BYTES = 1 << 16  # tensor bytes of the replies sent at once, at most
MOST_REPLIES = 64  # replies sent at once, at most (each some 100-300 bytes)


class Answering:
    """Starts each message of a session (see the module docstring)."""

    def __init__(self, metrics: Metrics, draining: Callable[[], bool]) -> None:
        self._metrics = metrics
        self._draining = draining

    def attach(self, live: Live) -> None:
        """Start ``live``'s messages on its connection as they arrive, while its task waits."""
        live.ws.answer_now = partial(self._on_arrival, live)

    @staticmethod
    def detach(ws: WireConnection) -> None:
        ws.answer_now = None

    def _on_arrival(self, live: Live, item: Received) -> bool:
        """Start ``item`` in the callback that delivered it; True when nothing of it is left
        for the task (it need not even see it)."""
        ws = live.ws
        if self._draining() or not ws.can_send_now():
            return False  # the task starts it, in order after what it is sending
        self.start(live, item)
        done = item.answered and not ws.write_paused  # else the task waits until it is taken
        if done:
            self._metrics.messages.answered_on_arrival += 1
            item.header_hold = None  # its charge given back
        return done

    def start(self, live: Live, item: Received) -> None:
        """Run ``item`` as far as it goes now: ``item.job`` is left for the task to go on
        with, or ``item.answered`` is set (its replies are sent); an exception becomes
        ``item.failure``."""
        item.started = True
        self._metrics.messages.received_bytes += item.nbytes
        batch = item.message
        if not isinstance(batch, Batch):
            return  # the task answers it: nothing of it runs
        live.outbox.forget(batch.ack)
        item.ack_due = live.took(item.nbytes, len(batch.requests))
        try:
            self._run(live, item, batch)
        except Exception as exc:  # noqa: BLE001 - the task raises it (see the module docstring)
            item.failure = exc

    def _run(self, live: Live, item: Received, batch: Batch) -> None:
        session, ws = live.session, live.ws
        job = item.job = session.start(batch, item.buffers, rejected=item.error)
        if (
            not session.step(job, inline=True, contended=ws.contended(), alone=ws.alone())
            or session.closed
            or len(batch.requests) + len(job.errors) > MOST_REPLIES
            or session.reply_bytes(batch) > MOST_REPLY_BYTES
            or self._draining()
            or not ws.can_send_now()
        ):
            return
        sent = 0
        for reply, buffers in session.finish(job):
            chunks = encode(reply, tuple(buffers))
            live.outbox.add(chunks)
            sent += ws.send_message_now(chunks)
        if item.ack_due:
            sent += ws.send_message_now(encode(Ack(received=ws.delivered)))
            item.ack_due = False
        self._metrics.messages.sent_bytes += sent
        self.answered(item, batch)
        item.job, item.answered = None, True

    def answered(self, item: Received, batch: Batch) -> None:
        """Count the read requests of ``item`` (``batch``), whose replies are all sent."""
        reads = sum(isinstance(r, Read) for r in batch.requests)
        self._metrics.messages.read_done(reads, time.perf_counter() - item.at)


__all__ = ["MOST_REPLIES", "MOST_REPLY_BYTES", "Answering"]
