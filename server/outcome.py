"""How an op's outcome is settled in its session's store: a result verified, charged and
stored, or a failure marked under the op's outputs; and the counts of both.

Both ways of running an op end here: the general path of :class:`~server.session.Session`
and its fast path (``server/fastpath.py``), so the two give the same errors, in the same
order, with the same accounting. Nothing here decides whether or how an op runs.

Results: what numpy returned is verified against the inferred metas (:func:`executor.checked`;
a result that is not the inferred one is ``internal``), then made countable
(:meth:`Outcomes._owned`: a view of a tensor the session holds is kept as it is, counted once;
a view of anything else is copied), then charged (:meth:`Outcomes._charge`: the reservation
made before numpy ran is grown or shrunk to the bytes the results really add; an output of
data-dependent length is checked against the per-op cap, quota and budget only now, with the
same codes), then stored under the op's outputs (replacing the target, for an in-place op).

Failures (ARCHITECTURE.md, invariant 5): a failed op stores a :class:`Failure` under every
output, which the ops that read it inherit unchanged, so a read names the op that really
failed. Only an output id that belongs to another tensor is left alone (``duplicate_tensor``,
or an in-place op on an unknown target): the error is then answered on its own
(:attr:`Job.errors`). A failure gives back whatever the op had reserved.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from protocol import Batch, ErrorCode, ErrorInfo, InvalidOpError, TensorMeta
from protocol.codec import Buffer
from protocol.ops import AnyOp

from . import executor
from .errors import StoreError
from .limits import Limits
from .logs import fields
from .roots import root_of
from .store import Failure, Stored, TensorStore

log = logging.getLogger("tensorwire.session")


@dataclass
class Job:
    """One batch being run: where its ops stand, and the errors to answer on their own."""

    batch: Batch
    buffers: Sequence[Buffer]
    rejected: ErrorInfo | None = None  # the whole batch was refused: every op fails with this
    registered: int = 0  # graphs of the batch registered (or refused), before its first op
    next: int = 0  # index of the next op to run
    errors: list[ErrorInfo] = field(default_factory=list)
    refused: list[tuple[int, ErrorInfo]] = field(default_factory=list)  # graph id, why (segments)
    op_started: float | None = None  # time.monotonic() when the running op began
    paused: bool = False  # Session.step stopped inline to give the loop a turn, not for a heavy op
    frees_after: dict[int, list[int]] = field(default_factory=dict)  # op index -> ids it frees
    # the batch's frees (server/frees.py): to plan or apply before the next op, and once all ran
    chores: Iterator[None] | None = None
    ending: Iterator[None] | None = None
    # its exposes, made once its ops and frees ran (server/requests.py): the positions of those
    # left in its requests, and what each made (a capability, or why not) by position
    exposing: list[int] | None = None
    exposed: dict[int, str | StoreError] = field(default_factory=dict)

    def running(self) -> str:
        """What runs now (for the per-op deadline's message): a registration, an op, or once
        its ops ran, its frees or an expose (its compact copy: ``Requests.expose``)."""
        graphs, ops = self.batch.graphs, self.batch.ops
        if self.registered < len(graphs):
            return f"registering graph #{graphs[self.registered].graph_id}"
        if self.next < len(ops):
            return ops[self.next].describe()
        return "an expose of the batch" if self.exposing else "the batch's frees"


class Outcomes:
    """Settles the outcome of each op of one session in its ``store``, and counts them.

    The counters are plain attributes, bumped without a lock by the one thread that runs the
    session's ops; ``server.metrics`` copies them at scrape time.
    """

    def __init__(self, session_id: str, store: TensorStore, limits: Limits) -> None:
        self.session_id = session_id  # for the log
        self.store = store
        self.limits = limits
        self.ops_run = 0
        self.op_counts: Counter[str] = Counter()  # by op name
        self.error_counts: Counter[str] = Counter()  # failed ops by error code

    def keep(
        self,
        op: AnyOp,
        raw: np.ndarray[Any, Any] | tuple[np.ndarray[Any, Any], ...],
        metas: tuple[TensorMeta, ...],
        reserved: int,
        job: Job,
        verified: bool = False,
    ) -> None:
        """Verify what numpy returned for ``op`` against ``metas`` (:func:`executor.checked`;
        ``verified``: :func:`executor.run` did), settle the reservation of ``reserved`` bytes
        on it (:meth:`_charge`) and store it; or fail the op, the reservation given back."""
        try:
            if verified and isinstance(raw, tuple):
                results = raw
            else:
                results = executor.checked(op, raw, metas)
            arrays = tuple(self._owned(a) for a in results)
            needs = self._charge(arrays, reserved)
        except Exception as exc:
            self.run_failed(op, exc, reserved, job)
            return
        for out, array, meta, need in zip(op.outputs(), arrays, metas, needs, strict=True):
            stored = Stored(array, TensorMeta(array.shape, meta.dtype))  # known dims now
            if op.inplace:
                self.store.replace(out, stored, reserved=need)
            else:
                self.store.put(out, stored, reserved=need)
        self.ops_run += 1
        self.op_counts[op.name()] += 1

    def run_failed(self, op: AnyOp, exc: Exception, reserved: int, job: Job) -> None:
        """Fail ``op``, which raised ``exc`` while or after numpy ran, and give back the
        ``reserved`` bytes: a data-dependent output over a limit keeps its code
        (:class:`StoreError`), a refused op is ``invalid_op``, a result that is not the
        inferred one ``internal``, and any other exception (numpy's genuine runtime failures)
        ``execution_failed``."""
        self.store.cancel(reserved)
        if isinstance(exc, StoreError):
            self.fail(op, exc.code, str(exc), job)
        elif isinstance(exc, InvalidOpError):
            self.fail(op, ErrorCode.INVALID_OP, str(exc), job)
        elif isinstance(exc, executor.InferenceMismatch):
            self.fail(op, ErrorCode.INTERNAL, str(exc), job)
        else:
            self.fail(op, ErrorCode.EXECUTION_FAILED, f"{type(exc).__name__}: {exc}", job)

    def fail(self, op: AnyOp, code: ErrorCode, message: str, job: Job) -> None:
        """Fail ``op`` with ``code``: count and log it, and mark its outputs failed, unless an
        output id belongs to another tensor (then the error goes to ``job.errors``)."""
        error = ErrorInfo(code=code, message=message, op=op.describe())
        self.error_counts[code.value] += 1
        level = logging.ERROR if code is ErrorCode.INTERNAL else logging.INFO
        log.log(level, "op failed", extra=fields(session=self.session_id, op=error.op, code=code))
        if code is ErrorCode.DUPLICATE_TENSOR or (op.inplace and op.out not in self.store):
            job.errors.append(error)  # the id belongs to another tensor: leave it alone
        else:
            self.mark(op, Failure(error))

    def mark(self, op: AnyOp, value: Failure) -> None:
        """Store ``value`` under every output of ``op`` (replacing, for an in-place op)."""
        for out in op.outputs():
            if op.inplace:
                self.store.replace(out, value)
            else:
                self.store.put(out, value)

    def _charge(self, arrays: tuple[np.ndarray[Any, Any], ...], reserved: int) -> list[int]:
        """The bytes each result adds to the store (a view of a held root adds none, a root
        shared by two results counts once), with the reservation of ``reserved`` bytes grown
        or shrunk to their sum. A data-dependent output (an ``UNKNOWN`` dim) is only known now:
        it is checked against the per-op cap, quota and budget here, before it is stored.

        Raises:
            StoreError: ``limit_exceeded``, ``quota_exceeded`` or ``server_memory_exhausted``;
                the reservation is then unchanged.
        """
        seen: set[int] = set()
        needs: list[int] = []
        for array in arrays:
            root = root_of(array)
            fresh = not self.store.holds(root) and id(root) not in seen
            seen.add(id(root))
            needs.append(root.nbytes if fresh else 0)
        total = sum(needs)
        if total > reserved:
            if total > self.limits.max_op_bytes:
                raise StoreError(
                    ErrorCode.LIMIT_EXCEEDED,
                    f"the outputs need {total} bytes; the per-op limit is "
                    f"{self.limits.max_op_bytes}",
                )
            self.store.reserve(total - reserved)
        elif total < reserved:
            self.store.cancel(reserved - total)
        return needs

    def _owned(self, array: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        """``array`` if the store can count it exactly, else a C-contiguous copy.

        Kept: a view of (or the same array as) a tensor this session holds, and an array that
        owns its memory alone — a fresh result, or the buffer the decoder allocated for a
        fragmented upload (zero-copy). Copied: a view of a received message or of a temporary.
        (An array whose root is not held cannot overlap a held tensor: every held array lies
        inside its own held root.)
        """
        root = root_of(array)
        if self.store.holds(root):
            return array
        if root.base is None and root.nbytes == array.nbytes:
            return array
        return array.copy(order="C")
