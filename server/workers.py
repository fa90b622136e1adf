"""Worker threads for heavy ops, watched against the per-op deadline. It runs sessions and
knows nothing of sockets: the connection loop (``server/connection.py``) calls it.

A numpy call cannot be interrupted, so the per-op deadline means: when one op has run for
``deadline`` seconds, :meth:`Workers.run` closes the session and raises :class:`Drop`; the
connection loop then closes the connection. The worker thread runs on to the end of its numpy
call in the server's task group (so neither the session nor the event loop waits for it), the
session stops before its next op, and the result is discarded with its reserved bytes given
back (``Session.leave_thread``). The thread keeps its worker slot until numpy returns, so at
most ``worker_threads`` such ops run at once; cheap ops, reads and pings never wait for them.
How long numpy may take is bounded before it starts: an op whose estimated work is over
``--max-op-cost`` is refused (``Session._over_cost``), so a slot is held for roughly the cap /
numpy's rate at most (bench/REASONS.md, 'Default --max-op-cost').

A ``pull`` (a direct transfer) waits for its peer, at most ``server.peers.PULL_TIMEOUT``
(120 s: a silent or slow peer), doing no work meanwhile: it runs in a step of its own
(``Session.step``) in one of :data:`PULL_THREADS` threads apart from the op workers, so that
pulls wait only for each other, and a heavy op never waits for a peer.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import anyio
import anyio.abc

from protocol import ErrorCode
from protocol.ops import Pull

from .errors import Drop
from .logs import fields
from .outcome import Job
from .session import Session

log = logging.getLogger("tensorwire.server")

PULL_THREADS = 8  # pulls waiting for their peers at once, server-wide


@dataclass
class _Run:
    """One worker-thread step of a job, as its session watches it."""

    started: anyio.Event = field(default_factory=anyio.Event)
    done: anyio.Event = field(default_factory=anyio.Event)
    returned: bool = False  # False when cancelled (server shutdown): the thread was abandoned


class Workers:
    """Runs the heavy part of jobs in at most ``threads`` worker threads at once, and their
    pulls in at most ``pull_threads`` others.

    Call :meth:`serve_in` with the server's task group before :meth:`run`.
    """

    def __init__(self, threads: int, deadline: float, pull_threads: int = PULL_THREADS) -> None:
        self.deadline = deadline
        self._limiter = anyio.CapacityLimiter(threads)
        self._pulls = anyio.CapacityLimiter(pull_threads)
        self._tasks: anyio.abc.TaskGroup | None = None

    def serve_in(self, tasks: anyio.abc.TaskGroup) -> None:
        """Worker steps run as tasks of ``tasks``, which outlives every session."""
        self._tasks = tasks

    async def run(self, session: Session, job: Job) -> None:
        """Run the rest of ``job`` in a worker thread, watching the per-op deadline. A job that
        paused between cheap ops on the loop (``job.paused``) only waits a turn of the loop,
        so that other sessions are served meanwhile, and then goes on inline.

        Raises:
            Drop: ``deadline_exceeded`` when one op ran past the deadline; ``shutting_down``
                (close code 1001) when the shutdown grace ran out and the server abandoned the
                thread (nothing went wrong: ``internal`` would say a bug). The session is closed.
        """
        if job.paused:
            await anyio.lowlevel.checkpoint()
            return
        assert self._tasks is not None, "call serve_in() first"
        run = _Run()
        self._tasks.start_soon(self._runner, session, job, run)
        await run.started.wait()
        while not run.done.is_set():
            op_started = job.op_started or time.monotonic()
            with anyio.move_on_after(op_started + self.deadline - time.monotonic()):
                await run.done.wait()
            if not run.done.is_set() and job.op_started == op_started:
                session.close()
                raise Drop(
                    ErrorCode.DEADLINE_EXCEEDED,
                    f"{job.running()} ran past the {self.deadline} s per-op deadline",
                )
        if not run.returned:
            session.close()
            raise Drop(
                ErrorCode.SHUTTING_DOWN,
                "the server is shutting down; past its grace, the running op was abandoned",
                close_code=1001,
            )

    async def _runner(self, session: Session, job: Job, run: _Run) -> None:
        # a pull thread only for a step that is the pull itself: the batch's graphs registered
        pull = (
            job.registered == len(job.batch.graphs)
            and job.next < len(job.batch.ops)
            and isinstance(job.batch.ops[job.next], Pull)
        )
        try:
            async with self._pulls if pull else self._limiter:
                job.op_started = time.monotonic()
                run.started.set()
                session.enter_thread()
                try:
                    await anyio.to_thread.run_sync(session.step, job, False, abandon_on_cancel=True)
                    run.returned = True
                finally:
                    session.leave_thread()  # abandoned at shutdown: the process is ending
        except Exception:
            log.exception("worker step failed", extra=fields(session=session.session_id))
            session.close()
            run.returned = True
        finally:
            run.started.set()
            run.done.set()
