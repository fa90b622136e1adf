"""The graphs a session registered (``protocol.graphs``), and ``run_graph``, which replays one.

Registration (:meth:`Graphs.register_all`, from ``Session.step``, before the batch's ops; on
the event loop only within the inline cost, ``server/check_costs.py``, else in a worker
thread): the graph is held against the session's bounds (``Limits.max_graphs`` graphs,
``Limits.max_graph_bytes`` of constants and of what its plan holds beside them,
``server/registration.py``: ``limit_exceeded``), and those bytes are reserved in the store
(``quota_exceeded``, ``server_memory_exhausted``) until it is dropped or the session closes;
then it is checked once, as its ops would be (:func:`~protocol.graphs.check_graph`:
``invalid_op``; the per-op caps on its inputs and constants, which no op or upload could
have made otherwise, on each op's outputs and scratch, on the graph's outputs together, and on
each op's work (``--max-op-cost``): ``limit_exceeded``), and its constants are copied out of
the message into read-only arrays. A registration that fails is remembered with its error (the
:data:`FAILURES_KEPT` newest, each text bounded, charged as a failure record of the store's),
and every ``run_graph`` of it fails with that error, as an op fails. A graph id in use refuses
the new registration and leaves the graph alone (the error is answered on its own, as for a
taken tensor id).

What passes becomes a :class:`~server.plans.Plan`, which makes a replay cheap per op
(``server/plans.py``).

Replay (:meth:`Graphs.run`): ``run_graph`` is checked as any op (output ids free, inputs stored
and not failed: a failure is inherited; the signature: ``invalid_op`` naming the input; a graph
not registered: ``unknown_graph``), runs on the event loop only within the inline cost (each
op's ``executor.cost``, summed), reserves its scratch bytes once (the graph's peak of live
bytes less its inputs and constants, plus the most scratch one op needs beside its results)
and stores its outputs as any op's results (``Outcomes.keep``, which gives back the
reservation's rest). An in-place op on a graph input
writes into the stored tensor, so a step's updates persist across replays: a graph that writes
in place first makes every input safe to write (``TensorStore.prepare_write``; an input written
in place that is a read-only view is replaced by a counted copy first, as an in-place op
writes into a copy). A failure at graph op k fails every output (``execution_failed``, or
``internal`` for a result that is not the inferred one), names the op, and gives the
reservation back; what ops before k wrote into inputs stays, as with the ops sent one by one.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

import numpy as np

from protocol import ErrorCode, ErrorInfo, InvalidOpError, TensorMeta
from protocol.codec import Buffer
from protocol.graphs import RegisterGraph, check_graph
from protocol.ops import RunGraph, RunSegment

from .check_costs import registration_cost
from .errors import StoreError
from .executor.base import Array
from .limits import check_cost
from .logs import fields
from .outcome import Job, Outcomes
from .plans import Plan, ReplayError, build_plan, constant_array, replay
from .registration import bounded, check_caps, constant_buffers, structure_bytes
from .store import Failure, Stored, entry_bytes

log = logging.getLogger("tensorwire.session")

FAILURES_KEPT = 256  # failed registrations a session remembers (each an ErrorInfo)
# The most steps of a graph run on the loop beyond the inline cost (fits_inline): their own
# time, a microsecond or two each, then stays within about INLINE_SLICE
INLINE_STEPS = 256


class Graphs:
    """One session's registered graphs (by the client's graph id), its failed registrations,
    and the constants' bytes they hold (``nbytes``, reserved in the session's store)."""

    def __init__(self, outcomes: Outcomes, inline_cost: int, stopped: Callable[[], bool]) -> None:
        self._outcomes = outcomes
        self._stopped = stopped  # the session closed: a replay ends at its next step
        self._store = outcomes.store
        self._limits = outcomes.limits
        self._inline_cost = inline_cost
        self._plans: dict[int, Plan] = {}
        self._failed: dict[int, ErrorInfo] = {}
        self.nbytes = 0
        self.closed = False
        self.tell_refusals = False  # the client speaks segments: a failed registration is told

    def plan(self, graph_id: int) -> Plan | None:
        """The plan registered under ``graph_id``; None if none is (never, refused, dropped)."""
        return self._plans.get(graph_id)

    def __len__(self) -> int:
        return len(self._plans)

    def register_all(self, job: Job, inline: bool, pause_at: float) -> bool:
        """Register ``job``'s graphs from ``job.registered`` on (:meth:`register`); True once
        every one is. With ``inline``, stop before one whose check and plan would cost the
        loop more than the inline cost (``server/check_costs.py``: a worker thread goes on),
        or pause (``job.paused``) once one was registered and ``time.monotonic()`` passed
        ``pause_at``."""
        requests, first = job.batch.graphs, job.registered
        while job.registered < len(requests) and not self._stopped():
            request = requests[job.registered]
            if inline:
                if job.registered > first and time.monotonic() > pause_at:
                    job.paused = True
                    return False
                if registration_cost(request.graph, self._inline_cost) > self._inline_cost:
                    return False
            job.op_started = time.monotonic()
            self.register(request, job.buffers, job)
            job.registered += 1
        return True

    def register(self, request: RegisterGraph, buffers: Sequence[Buffer], job: Job) -> None:
        """Register ``request.graph`` (its constants are ``buffers`` from
        ``request.first_buffer`` on), or remember why not. A graph id in use: the error goes to
        ``job.errors`` and nothing changes."""
        graph_id = request.graph_id
        if graph_id in self._plans or graph_id in self._failed:
            job.errors.append(
                ErrorInfo(
                    code=ErrorCode.INVALID_OP,
                    message=f"graph id #{graph_id} is in use in this session; the new "
                    "registration is refused (drop the graph first, or use another id)",
                )
            )
            return
        if self.closed:
            return
        try:
            if job.rejected is not None:  # the batch was refused: so is every graph it carries
                raise StoreError(job.rejected.code, job.rejected.message)
            self._plans[graph_id] = self._plan(request, buffers)
            return
        except StoreError as exc:
            error = ErrorInfo(code=exc.code, message=str(exc))
        except InvalidOpError as exc:
            error = ErrorInfo(code=ErrorCode.INVALID_OP, message=str(exc))
        except Exception as exc:  # a bug in a check: the session goes on, the log says what
            log.exception(
                "graph registration failed",
                extra=fields(session=self._outcomes.session_id, graph=graph_id),
            )
            error = ErrorInfo(code=ErrorCode.INTERNAL, message=f"{type(exc).__name__}: {exc}")
        self._remember(graph_id, error, job)

    def _remember(self, graph_id: int, error: ErrorInfo, job: Job) -> None:
        """Keep ``error``, its text bounded (:func:`bounded`), for the runs of ``graph_id``,
        charged as a failure record (``TensorStore.keep_record``); past
        :data:`FAILURES_KEPT` the oldest goes. Without room for its record, the error is
        answered on its own (``job.errors``) and not kept."""
        error = ErrorInfo(code=error.code, message=bounded(error.message))
        if self.tell_refusals:
            job.refused.append((graph_id, error))
        if len(self._failed) >= FAILURES_KEPT:
            self._forget_failure(next(iter(self._failed)))  # the oldest
        if not self._store.keep_record(entry_bytes(Failure(error))):
            job.errors.append(
                ErrorInfo(
                    code=error.code,
                    message=f"graph #{graph_id} failed to register, and the session has no room "
                    f"left to remember why (free tensors): {error.message}",
                )
            )
            return
        self._failed[graph_id] = error

    def _forget_failure(self, graph_id: int) -> None:
        error = self._failed.pop(graph_id, None)
        if error is not None:
            self._store.records.remove(entry_bytes(Failure(error)))

    def _plan(self, request: RegisterGraph, buffers: Sequence[Buffer]) -> Plan:
        """Check ``request`` and hold its constants.

        Raises:
            InvalidOpError: the graph does not hold together.
            StoreError: a cap, a bound on graphs, the quota or budget refused it, or its
                buffers are not its constants' (``bad_message``).
        """
        graph, limits = request.graph, self._limits
        if len(self._plans) >= limits.max_graphs:
            raise StoreError(
                ErrorCode.LIMIT_EXCEEDED,
                f"the session holds {len(self._plans)} graphs; the limit is {limits.max_graphs} "
                "(--max-graphs): drop one first",
            )
        constant_bytes = sum(c.nbytes for c in graph.constants)
        structure = structure_bytes(graph)
        nbytes = constant_bytes + structure
        if self.nbytes + nbytes > limits.max_graph_bytes:
            raise StoreError(
                ErrorCode.LIMIT_EXCEEDED,
                f"the graph needs {nbytes} bytes ({constant_bytes} of constants, {structure} "
                f"for what its {len(graph.ops)} ops and {len(graph.inputs)} inputs hold in the "
                f"server); the session's graphs hold {self.nbytes} of {limits.max_graph_bytes} "
                "(--max-graph-bytes)",
            )
        self._store.reserve(nbytes)  # before the checks, whose own objects are as many
        try:
            check = check_graph(graph)
            data = constant_buffers(graph, buffers, request.first_buffer)
            check_caps(graph, check, limits)
            constants = [
                constant_array(c.shape, c.dtype, b)
                for c, b in zip(graph.constants, data, strict=True)
            ]
            plan = build_plan(graph, check, constants, constant_bytes, nbytes)
            check_cost(plan.largest_step, limits)  # each op, as if it came alone
        except BaseException:
            self._store.cancel(nbytes)
            raise
        self.nbytes += nbytes
        return plan

    def drop(self, graph_id: int) -> None:
        """Forget ``graph_id`` and give its constants' bytes back; an unknown id does nothing."""
        self._forget_failure(graph_id)
        plan = self._plans.pop(graph_id, None)
        if plan is not None:
            self.nbytes -= plan.held_bytes
            self._store.cancel(plan.held_bytes)

    def close(self) -> None:
        """Forget every graph and give the constants' bytes back. Idempotent."""
        self.closed = True
        self._store.cancel(self.nbytes)
        self.nbytes = 0
        self._plans.clear()
        for graph_id in list(self._failed):
            self._forget_failure(graph_id)

    # --- replay --------------------------------------------------------------------------------

    def run(self, op: RunGraph, job: Job, inline: bool, most: int) -> bool:
        """Check and replay ``op``, settling its outputs. False: it is too costly to run
        ``inline`` (:meth:`fits_inline`, ``most``: nothing changed).
        The caller holds ``np.errstate(all="ignore")``."""
        plan = self._plans.get(op.graph)
        if inline and plan is not None and not self.fits_inline(op, plan, most):
            return False
        args = self._check(op, plan, job)
        if args is not None and plan is not None:
            self._execute(op, plan, args, job)
        return True

    def fits_inline(self, op: RunGraph | RunSegment, plan: Plan, most: int) -> bool:
        """Whether a replay of ``plan`` may run on the loop: it costs at most the inline cost,
        or at most ``most`` with no more than :data:`INLINE_STEPS` steps (a step's own time,
        about a microsecond or two, is not in its cost: ``MIN_STEP_COST`` bounds a graph's
        length, it is not a price)."""
        cost = self.cost(op, plan)
        if cost <= self._inline_cost:
            return True
        return cost <= most and len(plan.steps) <= INLINE_STEPS

    def cost(self, op: RunGraph | RunSegment, plan: Plan) -> int:
        """The replay's work: its ops', and for a graph that writes in place the moves of the
        inputs that a reply or an exposure still sends (:meth:`guard` makes them safe)."""
        moves = sum(map(self._store.move_cost, op.args)) if plan.guarded else 0
        return plan.cost + moves

    def _check(self, op: RunGraph, plan: Plan | None, job: Job) -> list[Array] | None:
        """The input arrays of ``op``, or None when its outputs are settled (it failed, or
        inherited a failure)."""
        store, outcomes = self._store, self._outcomes
        try:
            for out in op.outputs():
                if out in store:
                    raise StoreError(ErrorCode.DUPLICATE_TENSOR, f"tensor id #{out} is in use")
            if job.rejected is not None:
                raise StoreError(job.rejected.code, job.rejected.message)
            args: list[Array] = []
            metas: list[TensorMeta] = []
            for tensor_id in op.args:
                value = store.get(tensor_id)
                if isinstance(value, Failure):
                    outcomes.mark(op, value)  # inherit the original failure
                    return None
                args.append(value.array)
                metas.append(value.meta)
            if plan is None:
                raise self._missing(op.graph)
            op.infer_signature(plan.signature, plan.outputs, *metas)
            return args
        except StoreError as exc:
            outcomes.fail(op, exc.code, str(exc), job)
        except InvalidOpError as exc:
            outcomes.fail(op, ErrorCode.INVALID_OP, str(exc), job)
        return None

    def _missing(self, graph_id: int) -> StoreError:
        failed = self._failed.get(graph_id)
        if failed is not None:
            return StoreError(
                failed.code, f"graph #{graph_id} failed to register: {failed.message}"
            )
        return StoreError(
            ErrorCode.UNKNOWN_GRAPH,
            f"graph #{graph_id} is not registered in this session (never, or dropped)",
        )

    def _execute(self, op: RunGraph, plan: Plan, args: list[Array], job: Job) -> None:
        """Reserve the scratch bytes, replay, and store the outputs (or fail them)."""
        store, outcomes = self._store, self._outcomes
        try:
            if plan.guarded:
                args = self.guard(op, plan)
            store.reserve(plan.scratch)
        except StoreError as exc:
            outcomes.fail(op, exc.code, str(exc), job)
            return
        slots = list(plan.slots)
        for slot, array in zip(plan.input_slots, args, strict=True):
            slots[slot] = array
        try:
            results = replay(plan, slots, self._stopped)
        except ReplayError as exc:
            store.cancel(plan.scratch)
            code = ErrorCode.INTERNAL if exc.mismatch else ErrorCode.EXECUTION_FAILED
            outcomes.fail(op, code, f"run_graph[{op.graph}] {exc}", job)
            return
        ran = outcomes.ops_run
        outcomes.keep(op, results, plan.outputs, plan.scratch, job, verified=True)
        if outcomes.ops_run != ran:  # stored: count the graph's ops by name too
            outcomes.op_counts.update(plan.op_counts)

    def guard(self, op: RunGraph | RunSegment, plan: Plan) -> list[Array]:
        """The input arrays, safe to write in place (:meth:`TensorStore.prepare_write`, which
        may move memory: every array is looked up again); an input written in place that is a
        read-only view is first replaced by a counted copy.

        Raises:
            StoreError: the quota, the budget or the process has no room for a move or a copy.
        """
        store = self._store
        for position, tensor_id in enumerate(op.args):
            if store.prepare_write(tensor_id) is None and position in plan.written:
                value = store.get(tensor_id)
                assert isinstance(value, Stored)  # checked by _check
                nbytes = value.array.nbytes
                store.reserve(nbytes)
                try:
                    copy = np.array(value.array, order="C")
                except MemoryError:
                    store.cancel(nbytes)
                    raise StoreError(
                        ErrorCode.SERVER_MEMORY_EXHAUSTED, f"no memory to copy #{tensor_id}"
                    ) from None
                store.replace(tensor_id, Stored(copy, value.meta), reserved=nbytes)
        arrays: list[Array] = []
        for tensor_id in op.args:
            value = store.get(tensor_id)
            assert isinstance(value, Stored)
            arrays.append(value.array)
        return arrays
