"""One client session: its tensor store and the rules for running a batch. No I/O here.

The transport (``server/connection.py``) drives it; it runs the ops of training steps through
its fast path (``server/fastpath.py``: element-wise ops, and the others by their key,
``server/fastkeys.py``), the rest through :meth:`Session._general`, and ``run_graph`` through
its registered graphs (``server/graphs.py``: a batch's graphs are registered by its first
steps, before its ops, and its dropped graphs dropped after its frees), and all settle each
op's outcome through ``server/outcome.py``.

Theory of operation: the transport hands each decoded :class:`~protocol.Batch` to
:meth:`Session.start`, then calls :meth:`Session.step` until it returns True — on the event loop
with ``inline=True`` (cheap ops at once; it stops before the first heavy op, or pauses so that
other sessions have the loop), then in a worker thread with ``inline=False`` for the rest; then
:meth:`Session.finish` answers. Ops run strictly in submission order (ARCHITECTURE.md, invariant 6).
A failed op stores a :class:`Failure` under its output id; ops that read a failed tensor
inherit the failure unchanged, so a read names the op that really failed (ARCHITECTURE.md,
invariant 5).

Limits (ARCHITECTURE.md, invariant 8): :meth:`Session._check` refuses an op whose inferred
outputs exceed the ndim cap or the per-op byte cap (``limit_exceeded``, on the sum of an op's
outputs and of the scratch numpy allocates beside them, ``executor.scratch``) before numpy
runs; :meth:`_execute` reserves those bytes in the store (``quota_exceeded``,
``server_memory_exhausted``) before numpy allocates them, and the scratch is given back when
the results are stored. An output of
data-dependent length (an ``UNKNOWN`` dim) is charged after numpy ran and before it is stored,
with the same codes (:meth:`Outcomes.keep`). A refused op fails like any other: its outputs
are marked failed and the session goes on. A result that is a view of a tensor the session
holds is stored as it is (counted once, see ``server/store.py``); a view of anything else is
copied first. An in-place op (``setitem``) writes into its target's memory, so the views that
share it see the write, as in numpy; the store first moves memory that a read reply still
sends from, and only a read-only view is written into a counted copy
(:meth:`TensorStore.prepare_write`).
Work (:meth:`_over_cost`): an op whose estimated work (:func:`executor.cost`, and for an
in-place op the move of a root that is still sent, :meth:`TensorStore.move_cost`) is over
``Limits.max_op_cost`` fails (``limit_exceeded``); one over :data:`INLINE_COST` runs in a thread,
as does one whose check alone would cost the loop more (``server/check_costs.py``: a ``stack``
of a million inputs), a registration whose check and plan would, and a costly expose, the
batch's last step (``Requests.expose``).
Deadline: :attr:`Job.op_started` is the monotonic time the running op began; the transport
watches it and, past the deadline, closes the session (:meth:`close`): the op itself cannot be
interrupted, so its result is discarded when numpy returns, which the work cap bounds.
"""

from __future__ import annotations

import math
import time
import weakref
from collections import Counter
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from protocol import (
    Batch,
    ErrorCode,
    ErrorInfo,
    GraphRefused,
    InvalidOpError,
    MessageLimitError,
    SessionError,
    TensorMeta,
)
from protocol.codec import Buffer
from protocol.ops import AnyOp, FromBuffer, Pull, RunGraph, RunSegment

from . import executor, frees
from .check_costs import op_check_cost
from .errors import StoreError
from .fastpath import FAST_OPS, FastPath
from .graphs import Graphs
from .limits import Limits as Limits
from .limits import check_cost, output_bytes
from .outcome import Job, Outcomes
from .pulls import Pulls, Transfers
from .requests import Reply as Reply
from .requests import Requests
from .segments import Segments
from .store import Failure, TensorStore

# How ops share the event loop (bench/REASONS.md, 'Inline slices of the event loop'):
INLINE_COST = 1 << 16  # executor.cost (about 1 ns each) that may run on the loop
INLINE_SLICE = 0.002  # seconds step(inline=True) runs before it pauses
FIRST_SLICE = 0.02  # a batch's first, uncontended: a client's flush of 2048 ops runs whole
# A graph or segment (a training step) of at most this cost runs on the loop in a batch's first
# slice when its connection is the loop's only one: a worker thread's hop and its turns for
# the GIL cost a small step more than they spare a loop that nobody else uses (bench/REASONS.md,
# 'Small graphs inline'). About INLINE_SLICE of the cost model (which errs high), the longest
# a connection that just opened waits behind it.
INLINE_GRAPH_COST = 1 << 21


class Session:
    """A session's tensors and how batches change them."""

    def __init__(
        self,
        session_id: str,
        device_index: int,
        store: TensorStore | None = None,
        limits: Limits | None = None,
        transfers: Transfers | None = None,
    ) -> None:
        self.session_id = session_id
        self.device_index = device_index
        self.store = store if store is not None else TensorStore()
        self.limits = limits if limits is not None else Limits()
        self.outcomes = Outcomes(session_id, self.store, self.limits)
        self.store.budget.sessions += 1
        self.closed = False  # set by close(); the ops loop stops at the next op
        self._in_thread = False  # a worker thread runs this session's ops now
        self._fast = FastPath(self.outcomes, INLINE_COST)  # the ops of training steps
        # registered graphs, run_graph; a replay stops at its next step once the session closed.
        # They call back through a weak proxy: a session is then no reference cycle, and an
        # ended one goes with its last reference, without waiting for the garbage collector
        # (which the server runs rarely: server/__main__.py).
        me = weakref.proxy(self)

        def stopped() -> bool:
            return bool(me.closed)

        self.graphs = Graphs(self.outcomes, INLINE_COST, stopped)
        self._segments = Segments(
            self.graphs, self.outcomes, lambda op, job: me.run_one(op, job), stopped
        )
        self.requests = Requests(self.store, None if transfers is None else transfers.exposures)
        self._pulls = Pulls(self.outcomes, transfers)  # direct transfers

    @property
    def ops_run(self) -> int:
        """Ops that stored their results."""
        return self.outcomes.ops_run

    @property
    def op_counts(self) -> Counter[str]:
        """Ops that stored their results, by op name (read by ``server.metrics``)."""
        return self.outcomes.op_counts

    @property
    def error_counts(self) -> Counter[str]:
        """Failed ops, by error code (read by ``server.metrics``)."""
        return self.outcomes.error_counts

    def enter_thread(self) -> None:
        """The transport is about to run :meth:`step` in a worker thread (call on the loop)."""
        self._in_thread = True

    def leave_thread(self) -> None:
        """The worker thread returned (call on the loop); a deferred :meth:`close` happens."""
        self._in_thread = False
        if self.closed:
            self.graphs.close()
            self.store.close()

    def start(
        self, batch: Batch, buffers: Sequence[Buffer], rejected: ErrorInfo | None = None
    ) -> Job:
        """A job for ``batch``; with ``rejected``, every op of it fails with that error.

        Its graphs are registered by :meth:`step`, before its ops. Its frees are planned and
        applied by :meth:`step` (``server/frees.py``: those of tensors no op uses before the
        first op, the others right after their last use, and all of them again once the ops
        ran), a part at a time.
        """
        job = Job(batch, executor.uploads_kept_apart(batch.ops, buffers), rejected)
        if batch.frees:
            job.chores = frees.planned(self.store, job)
            job.ending = frees.freed_again(self.store, batch.frees)
        return job

    def check_upload(self, batch: Batch) -> None:
        """Refuse a batch whose declared buffers cannot fit, before they are allocated.

        Raises:
            MessageLimitError: ``quota_exceeded`` or ``server_memory_exhausted``.
        """
        total = sum(batch.buffers)
        if total > self.store.free_quota():
            raise MessageLimitError(
                f"the batch uploads {total} bytes; the session's quota has "
                f"{self.store.free_quota()} left",
                ErrorCode.QUOTA_EXCEEDED,
            )
        room = self.store.budget.free_bytes(self.store.in_use(), total)
        if total and total > room:
            raise MessageLimitError(
                f"the batch uploads {total} bytes; the server's memory budget has {room} left",
                ErrorCode.SERVER_MEMORY_EXHAUSTED,
            )

    def step(self, job: Job, inline: bool, contended: bool = False, alone: bool = False) -> bool:
        """Register the batch's graphs, then run ops from ``job.next``. With ``inline``, stop
        before the first registration or op whose check (``server/check_costs.py``) or cost
        exceeds :data:`INLINE_COST` (a graph or segment: :data:`INLINE_GRAPH_COST` in the
        uncontended first slice of a connection ``alone`` on the loop), or pause
        (``job.paused``: go on inline on a later turn of the loop) once it ran for
        :data:`INLINE_SLICE` seconds (:data:`FIRST_SLICE` from a batch's first op, so that a
        client's batch rarely pauses, unless other connections' messages wait for the loop:
        ``contended``, ``server/receiving.py``). Without ``inline``, a pull runs alone, as the
        step's first op (a pull thread runs it: ``server.workers``). Returns True when every
        op has run, the batch's frees are applied and its exposes made (``Requests.expose``).
        """
        ops = job.batch.ops
        first, job.paused = job.next, False
        slice_ = INLINE_SLICE if first or contended else FIRST_SLICE
        graph_cost = INLINE_GRAPH_COST if alone and not (first or contended) else INLINE_COST
        pause_at = time.monotonic() + slice_ if inline else math.inf
        if job.chores is not None and not frees.run_chores(job, pause_at):
            return False
        if job.registered < len(job.batch.graphs) and not self.graphs.register_all(
            job, inline, pause_at
        ):  # before the ops, which may run them
            return False
        with np.errstate(all="ignore"):  # once per step, for the fast path's numpy calls
            while job.next < len(ops) and not self.closed:
                op = ops[job.next]
                job.op_started = now = time.monotonic()
                if now > pause_at and job.next > first:
                    job.paused = True
                    return False
                if type(op) in FAST_OPS:
                    done = self._fast.run(op, job, inline)
                elif inline and op_check_cost(op) > INLINE_COST:
                    return False  # checking it alone is too costly for the loop
                elif isinstance(op, RunGraph):
                    done = self.graphs.run(op, job, inline, graph_cost)
                elif isinstance(op, RunSegment):
                    done = self._segments.run(op, job, inline, graph_cost)
                elif isinstance(op, Pull):
                    done = (inline or job.next == first) and self._pulls.run(op, job, inline)
                else:
                    done = self._fast.run_keyed(op, job, inline)
                if done is None:
                    done = self._general(op, job, inline)
                if not done:
                    return False
                if job.frees_after:
                    for tensor_id in job.frees_after.pop(job.next, ()):
                        self.store.free(tensor_id)  # its last use has run
                job.next += 1
                if isinstance(op, Pull) and not inline:
                    return False  # the ops after it run in a step of their own
        if job.ending is not None and not self.closed:
            job.chores, job.ending = job.ending, None
            if not frees.run_chores(job, pause_at):
                return False
        return self.closed or self.requests.expose(job, INLINE_COST if inline else None, pause_at)

    def run_one(self, op: AnyOp, job: Job) -> None:
        """Run ``op``, one of a segment's (no upload, pull or graph), as if it came alone in
        a worker thread (``server/segments.py``)."""
        job.op_started = time.monotonic()
        if type(op) not in FAST_OPS or self._fast.run(op, job, False) is None:
            self._general(op, job, False)

    def _general(self, op: AnyOp, job: Job, inline: bool) -> bool:
        """Check and run ``op`` (any op). False: it is too costly to run ``inline``."""
        checked = self._check(op, job)
        if checked is not None:
            args, metas, known = checked
            nbytes: int | None = known
            settled = self._over_cost(op, metas, args, job, inline)
            if settled is not None:
                return settled
            resolved = executor.resolve(op, args, metas)  # O(inputs): costed just above
            if resolved is not metas:
                settled = self._over_cost(op, resolved, args, job, inline, resized=True)
                if settled is not None:
                    return settled
                nbytes = None  # sized again from the resolved lengths
            self._execute(op, args, resolved, nbytes, job)
        return True

    def _over_cost(
        self,
        op: AnyOp,
        metas: tuple[TensorMeta, ...],
        args: list[np.ndarray[Any, Any]],
        job: Job,
        inline: bool,
        resized: bool = False,
    ) -> bool | None:
        """By its estimated work (:func:`executor.cost`): None, ``op`` may run now; True, it
        failed, over the per-op cap (``limit_exceeded``: refused at once, even on the loop);
        False, it is over :data:`INLINE_COST` and ``inline`` (a worker thread runs it).
        ``resized``: lengths were resolved; the byte cap, whose message says more, goes first."""
        work = executor.cost(op, metas[0], args)
        if op.inplace:  # a root that a reply or an exposure still sends is moved first
            work += self.store.move_cost(op.out)
        try:
            if resized:
                output_bytes(metas, self.limits)
            check_cost(work, self.limits)
        except StoreError as exc:
            self.outcomes.fail(op, exc.code, str(exc), job)
            return True
        return False if inline and work > INLINE_COST else None

    def _check(
        self, op: AnyOp, job: Job
    ) -> tuple[list[np.ndarray[Any, Any]], tuple[TensorMeta, ...], int] | None:
        """Inputs, inferred outputs and the bytes to reserve for them and the op's scratch
        (:func:`output_bytes`) of ``op``, or None when its outputs are already settled (failed,
        refused, or inherited a failure)."""
        try:
            for out in () if op.inplace else op.outputs():
                if out in self.store:
                    raise StoreError(ErrorCode.DUPLICATE_TENSOR, f"tensor id #{out} is in use")
            if job.rejected is not None:
                raise StoreError(job.rejected.code, job.rejected.message)
            args: list[np.ndarray[Any, Any]] = []
            metas: list[TensorMeta] = []
            for tensor_id in op.inputs():
                value = self.store.get(tensor_id)
                if isinstance(value, Failure):
                    self.outcomes.mark(op, value)  # inherit the original failure
                    return None
                args.append(value.array)
                metas.append(value.meta)
            out_metas = op.infer_all(*metas)
            scratch = executor.scratch(op, out_metas[0], args)
            return args, out_metas, output_bytes(out_metas, self.limits, scratch)
        except StoreError as exc:
            self.outcomes.fail(op, exc.code, str(exc), job)
        except InvalidOpError as exc:
            self.outcomes.fail(op, ErrorCode.INVALID_OP, str(exc), job)
        return None

    def _execute(
        self,
        op: AnyOp,
        args: list[np.ndarray[Any, Any]],
        metas: tuple[TensorMeta, ...],
        nbytes: int | None,
        job: Job,
    ) -> None:
        """Reserve ``nbytes`` (None: :func:`output_bytes` of ``metas``), run ``op``, settle
        the reservation on what the results really hold and store them (:meth:`Outcomes.keep`). An
        in-place op writes into its target's memory and reserves only its scratch (given back
        when it ran), unless the store says it cannot (:meth:`TensorStore.prepare_write`: a
        read-only view); it then runs on a copy, which is counted."""
        try:
            target = self.store.prepare_write(op.out) if op.inplace else None
            in_place = target is not None
            if target is not None:
                args[0] = target  # its memory may have moved (a read reply sends the old)
            if nbytes is None:
                nbytes = output_bytes(metas, self.limits)
            reserved = executor.scratch(op, metas[0], args) if in_place else nbytes
            if not isinstance(op, FromBuffer) or not self.store.take_upload(
                job.buffers, op.buffer, reserved
            ):  # an upload's buffer is counted since it was allocated: its op takes that over
                self.store.reserve(reserved)
        except StoreError as exc:
            self.outcomes.fail(op, exc.code, str(exc), job)
            return
        try:
            raw = executor.run(op, args, job.buffers, metas, in_place=in_place)
        except Exception as exc:
            self.outcomes.run_failed(op, exc, reserved, job)
            return
        self.outcomes.keep(op, raw, metas, reserved, job, verified=True)

    def finish(self, job: Job) -> list[Reply]:
        """Drop the batch's dropped graphs, then answer its requests in order (its frees were
        applied by :meth:`step`); :meth:`replies` makes the same replies one at a time."""
        return list(self.replies(job))

    def replies(self, job: Job) -> Iterator[Reply]:
        """:meth:`finish`'s replies, each made as it is taken (the caller may give the loop turns
        between them: a batch may hold 100k reads), all taken before the session runs on."""
        for graph_id in job.batch.drop_graphs:
            self.graphs.drop(graph_id)
        yield from ((GraphRefused(graph_id=g, error=e), ()) for g, e in job.refused)
        errors = [*job.errors, *self.store.take_unrecorded()]  # failures kept nowhere
        yield from ((SessionError(error=e), ()) for e in errors)
        exposed = job.exposed
        yield from (
            self.requests.answer(r, exposed.get(i)) for i, r in enumerate(job.batch.requests)
        )

    def reply_bytes(self, batch: Batch) -> int:
        """The tensor bytes the replies to ``batch``'s reads will carry (as stored now)."""
        return self.requests.reply_bytes(batch)

    def close(self) -> None:
        """Drop every tensor and stop running ops. Idempotent. While a worker thread runs this
        session's ops the store is left to it until :meth:`leave_thread` (so the store is never
        changed by two threads at once); its current op's result is then discarded."""
        if not self.closed:
            self.closed = True
            self.store.budget.sessions -= 1
            if self.requests.exposures is not None:
                self.requests.exposures.withdraw(self.store)
        if not self._in_thread:
            self.graphs.close()
            self.store.close()
