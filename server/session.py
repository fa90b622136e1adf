"""One client session: its tensor store and the rules for running a batch. No I/O here.

Rule: imports numpy, ``protocol`` and ``server.store``/``server.executor``/``server.logs`` only.

Theory of operation: the transport hands each decoded :class:`~protocol.Batch` to
:meth:`Session.start`, then calls :meth:`Session.step` until it returns True — on the event loop
with ``inline=True`` (cheap ops run at once, the call stops before the first heavy op), and in a
worker thread with ``inline=False`` for the rest — then :meth:`Session.finish` applies the frees
and answers the requests. Ops run strictly in submission order (invariant 6). A failed op stores
a :class:`Failure` under its output id; ops that read a failed tensor inherit the failure
unchanged, so a read names the op that really failed (invariant 5).

Limits (invariant 8): :meth:`Session._check` refuses an op whose inferred output exceeds the
ndim cap or the per-op byte cap (``limit_exceeded``) before numpy runs; :meth:`_execute`
reserves the output's bytes in the store (``quota_exceeded``, ``server_memory_exhausted``)
before numpy allocates them. A refused op fails like any other: its output is marked failed
and the session goes on. A result that is a view of a tensor the session holds is stored as it
is (counted once, see ``server/store.py``); a view of anything else is copied first.
Deadline: :attr:`Job.op_started` is the monotonic time the running op began; the transport
watches it and, past the deadline, closes the session (:meth:`close`): the op itself cannot be
interrupted, so its result is discarded when numpy returns.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from protocol import (
    DTYPES,
    Batch,
    ErrorCode,
    ErrorInfo,
    InvalidOpError,
    MessageLimitError,
    Read,
    ReadReply,
    RequestFailed,
    SessionError,
    Stats,
    StatsReply,
    SyncReply,
    TensorMeta,
    byte_view,
    to_numpy,
)
from protocol.codec import Buffer
from protocol.messages import Request
from protocol.ops import AnyOp, numel

from . import executor
from .logs import fields
from .store import Failure, Stored, StoreError, TensorStore, root_of

log = logging.getLogger("tensorwire.session")

_ITEMSIZE = {name: to_numpy(name).itemsize for name in DTYPES}
INLINE_COST = 1 << 16  # element operations an op may cost and still run on the event loop

Reply = tuple[
    ReadReply | SyncReply | StatsReply | RequestFailed | SessionError, Sequence[memoryview]
]


@dataclass(frozen=True)
class Limits:
    """Per-op caps checked on the inferred output before numpy runs."""

    max_op_bytes: int = 2**63
    max_ndim: int = 64


@dataclass
class Job:
    batch: Batch
    buffers: Sequence[Buffer]
    rejected: ErrorInfo | None = None  # the whole batch was refused: every op fails with this
    next: int = 0  # index of the next op to run
    errors: list[ErrorInfo] = field(default_factory=list)
    op_started: float | None = None  # time.monotonic() when the running op began


class Session:
    """A session's tensors and how batches change them."""

    def __init__(
        self,
        session_id: str,
        device_index: int,
        store: TensorStore | None = None,
        limits: Limits | None = None,
    ) -> None:
        self.session_id = session_id
        self.device_index = device_index
        self.store = store if store is not None else TensorStore()
        self.limits = limits if limits is not None else Limits()
        self.ops_run = 0
        self.op_counts: Counter[str] = Counter()  # by op name; read by server.metrics
        self.error_counts: Counter[str] = Counter()  # failed ops by error code
        self.store.budget.sessions += 1
        self.closed = False  # set by close(); the ops loop stops at the next op
        self._in_thread = False  # a worker thread runs this session's ops now

    def enter_thread(self) -> None:
        """The transport is about to run :meth:`step` in a worker thread (call on the loop)."""
        self._in_thread = True

    def leave_thread(self) -> None:
        """The worker thread returned (call on the loop); a deferred :meth:`close` happens."""
        self._in_thread = False
        if self.closed:
            self.store.close()

    def start(
        self, batch: Batch, buffers: Sequence[Buffer], rejected: ErrorInfo | None = None
    ) -> Job:
        """A job for ``batch``; with ``rejected``, every op of it fails with that error.

        Frees of tensors that no op of the batch reads are applied at once, so memory freed
        and allocated in one batch counts against the quota only once (the rest are applied
        by :meth:`finish`, after the ops, as the protocol says).
        """
        read = {tensor_id for op in batch.ops for tensor_id in op.inputs()}
        for tensor_id in batch.frees:
            if tensor_id not in read:
                self.store.free(tensor_id)
        return Job(batch, buffers, rejected)

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
        if total > self.store.budget.free_bytes():
            raise MessageLimitError(
                f"the batch uploads {total} bytes; the server's memory budget has "
                f"{self.store.budget.free_bytes()} left",
                ErrorCode.SERVER_MEMORY_EXHAUSTED,
            )

    def step(self, job: Job, inline: bool) -> bool:
        """Run ops from ``job.next``. With ``inline``, stop before the first op whose cost
        exceeds :data:`INLINE_COST`. Returns True when every op has run.
        """
        ops = job.batch.ops
        while job.next < len(ops) and not self.closed:
            op = ops[job.next]
            job.op_started = time.monotonic()
            checked = self._check(op, job)
            if checked is not None:
                args, meta, nbytes = checked
                if inline and executor.cost(op, meta, args) > INLINE_COST:
                    return False
                self._execute(op, args, meta, nbytes, job)
            job.next += 1
        return True

    def _check(
        self, op: AnyOp, job: Job
    ) -> tuple[list[np.ndarray[Any, Any]], TensorMeta, int] | None:
        """Inputs, inferred output and output bytes of ``op``, or None when its output is
        already settled (failed, refused, or inherited a failure)."""
        try:
            if op.out in self.store:
                raise StoreError(ErrorCode.DUPLICATE_TENSOR, f"tensor id #{op.out} is in use")
            if job.rejected is not None:
                raise StoreError(job.rejected.code, job.rejected.message)
            args: list[np.ndarray[Any, Any]] = []
            metas: list[TensorMeta] = []
            for tensor_id in op.inputs():
                value = self.store.get(tensor_id)
                if isinstance(value, Failure):
                    self.store.put(op.out, value)  # inherit the original failure
                    return None
                args.append(value.array)
                metas.append(value.meta)
            meta = op.infer(*metas)
            return args, meta, self._output_bytes(meta)
        except StoreError as exc:
            self._fail(op, exc.code, str(exc), job)
        except InvalidOpError as exc:
            self._fail(op, ErrorCode.INVALID_OP, str(exc), job)
        return None

    def _output_bytes(self, meta: TensorMeta) -> int:
        """The output's bytes (Python ints: no overflow).

        Raises:
            StoreError: ``limit_exceeded``, for an output over a per-op cap.
        """
        limits = self.limits
        if len(meta.shape) > limits.max_ndim:
            raise StoreError(
                ErrorCode.LIMIT_EXCEEDED,
                f"the output has {len(meta.shape)} dimensions; the limit is {limits.max_ndim}",
            )
        itemsize = _ITEMSIZE[meta.dtype]
        nbytes = numel(meta.shape) * itemsize
        if not nbytes and numel(tuple(d for d in meta.shape if d)) * itemsize >= 2**63:
            raise StoreError(  # an empty array whose other dims overflow numpy's intp
                ErrorCode.LIMIT_EXCEEDED,
                f"the dimensions {list(meta.shape)} overflow numpy's index type, even if empty",
            )
        if nbytes > limits.max_op_bytes:
            raise StoreError(
                ErrorCode.LIMIT_EXCEEDED,
                f"the output {meta.dtype}{list(meta.shape)} needs {nbytes} bytes; the per-op "
                f"limit is {limits.max_op_bytes}",
            )
        return nbytes

    def _execute(
        self,
        op: AnyOp,
        args: list[np.ndarray[Any, Any]],
        meta: TensorMeta,
        nbytes: int,
        job: Job,
    ) -> None:
        try:
            self.store.reserve(nbytes)
        except StoreError as exc:
            self._fail(op, exc.code, str(exc), job)
            return
        try:
            array = self._owned(executor.run(op, args, job.buffers, meta))
        except InvalidOpError as exc:
            self.store.cancel(nbytes)
            self._fail(op, ErrorCode.INVALID_OP, str(exc), job)
        except executor.InferenceMismatch as exc:
            self.store.cancel(nbytes)
            self._fail(op, ErrorCode.INTERNAL, str(exc), job)
        except Exception as exc:  # numpy's genuine runtime failures
            self.store.cancel(nbytes)
            self._fail(op, ErrorCode.EXECUTION_FAILED, f"{type(exc).__name__}: {exc}", job)
        else:
            self.store.put(op.out, Stored(array, meta), reserved=nbytes)
            self.ops_run += 1
            self.op_counts[getattr(op, "op", None) or op.kind] += 1

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

    def _fail(self, op: AnyOp, code: ErrorCode, message: str, job: Job) -> None:
        error = ErrorInfo(code=code, message=message, op=op.describe())
        self.error_counts[code.value] += 1
        level = logging.ERROR if code is ErrorCode.INTERNAL else logging.INFO
        log.log(level, "op failed", extra=fields(session=self.session_id, op=error.op, code=code))
        if code is ErrorCode.DUPLICATE_TENSOR:
            job.errors.append(error)  # the id belongs to another tensor: leave it alone
        else:
            self.store.put(op.out, Failure(error))

    def finish(self, job: Job) -> list[Reply]:
        """Apply the batch's frees, then answer its requests in order."""
        for tensor_id in job.batch.frees:
            self.store.free(tensor_id)
        replies: list[Reply] = [(SessionError(error=e), ()) for e in job.errors]
        replies.extend(self._answer(request) for request in job.batch.requests)
        return replies

    def _answer(self, request: Request) -> Reply:
        if isinstance(request, Read):
            return self._read(request)
        if isinstance(request, Stats):
            store = self.store
            reply = StatsReply(
                request_id=request.request_id,
                tensors=len(store),
                tensor_bytes=store.nbytes,
                failed=store.failed,
                server_tensor_bytes=store.budget.used,
                connections=store.budget.sessions,
            )
            return reply, ()
        return SyncReply(request_id=request.request_id), ()

    def _read(self, request: Read) -> Reply:
        try:
            value = self.store.get(request.tensor)
        except StoreError as exc:
            error = ErrorInfo(code=exc.code, message=str(exc))
            return RequestFailed(request_id=request.request_id, error=error), ()
        if isinstance(value, Failure):
            return RequestFailed(request_id=request.request_id, error=value.error), ()
        view = byte_view(value.array)
        reply = ReadReply(
            request_id=request.request_id,
            shape=value.meta.shape,
            dtype=value.meta.dtype,
            nbytes=view.nbytes,
        )
        return reply, (view,)

    def close(self) -> None:
        """Drop every tensor and stop running ops. Idempotent. While a worker thread runs this
        session's ops the store is left to it until :meth:`leave_thread` (so the store is never
        changed by two threads at once); its current op's result is then discarded."""
        if not self.closed:
            self.closed = True
            self.store.budget.sessions -= 1
        if not self._in_thread:
            self.store.close()
