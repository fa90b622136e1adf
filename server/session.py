"""One client session: its tensor store and the rules for running a batch. No I/O here.

Rule: imports numpy, ``protocol`` and ``server.store``/``server.executor``/``server.logs`` only.

Theory of operation: the transport hands each decoded :class:`~protocol.Batch` to
:meth:`Session.start`, then calls :meth:`Session.step` until it returns True — on the event loop
with ``inline=True`` (cheap ops run at once, the call stops before the first heavy op), and in a
worker thread with ``inline=False`` for the rest — then :meth:`Session.finish` applies the frees
and answers the requests. Ops run strictly in submission order (invariant 6). A failed op stores
a :class:`Failure` under its output id; ops that read a failed tensor inherit the failure
unchanged, so a read names the op that really failed (invariant 5).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from protocol import (
    Batch,
    Describe,
    DescribeReply,
    ErrorCode,
    ErrorInfo,
    InvalidOpError,
    Read,
    ReadReply,
    RequestFailed,
    SessionError,
    Stats,
    StatsReply,
    SyncReply,
    TensorMeta,
    byte_view,
    from_numpy,
)
from protocol.codec import Buffer
from protocol.messages import Request
from protocol.ops import AnyOp

from . import executor
from .logs import fields
from .store import Failure, Stored, StoreError, TensorStore

log = logging.getLogger("tensorwire.session")

INLINE_COST = 1 << 16  # element operations an op may cost and still run on the event loop

Reply = tuple[
    ReadReply | SyncReply | StatsReply | DescribeReply | RequestFailed | SessionError,
    Sequence[memoryview],
]


@dataclass
class Job:
    batch: Batch
    buffers: Sequence[Buffer]
    next: int = 0  # index of the next op to run
    errors: list[ErrorInfo] = field(default_factory=list)


class Session:
    """A session's tensors and how batches change them."""

    def __init__(self, session_id: str, device_index: int) -> None:
        self.session_id = session_id
        self.device_index = device_index
        self.store = TensorStore()
        self.ops_run = 0
        self.op_counts: Counter[str] = Counter()  # by op name; read by server.metrics
        self.error_counts: Counter[str] = Counter()  # failed ops by error code

    def start(self, batch: Batch, buffers: Sequence[Buffer]) -> Job:
        return Job(batch, buffers)

    def step(self, job: Job, inline: bool) -> bool:
        """Run ops from ``job.next``. With ``inline``, stop before the first op whose cost
        exceeds :data:`INLINE_COST`. Returns True when every op has run.
        """
        ops = job.batch.ops
        while job.next < len(ops):
            op = ops[job.next]
            checked = self._check(op, job)
            if checked is not None:
                args, metas = checked
                if inline and executor.cost(op, metas[0], args) > INLINE_COST:
                    return False
                self._execute(op, args, metas, job)
            job.next += 1
        return True

    def _check(
        self, op: AnyOp, job: Job
    ) -> tuple[list[np.ndarray[Any, Any]], tuple[TensorMeta, ...]] | None:
        """Inputs and inferred outputs of ``op``, or None when its outputs are already settled."""
        try:
            for out in () if op.inplace else op.outputs():
                if out in self.store:
                    raise StoreError(ErrorCode.DUPLICATE_TENSOR, f"tensor id #{out} is in use")
            args: list[np.ndarray[Any, Any]] = []
            metas: list[TensorMeta] = []
            for tensor_id in op.inputs():
                value = self.store.get(tensor_id)
                if isinstance(value, Failure):
                    self._settle(op, value)  # inherit the original failure
                    return None
                args.append(value.array)
                metas.append(value.meta)
            self._share_inputs(op)
            return args, op.infer_all(*metas)
        except StoreError as exc:
            self._fail(op, exc.code, str(exc), job)
        except InvalidOpError as exc:
            self._fail(op, ErrorCode.INVALID_OP, str(exc), job)
        return None

    def _share_inputs(self, op: AnyOp) -> None:
        """Every input may end up viewed by the output, except an in-place op's own target."""
        for tensor_id in op.inputs()[1:] if op.inplace else op.inputs():
            self.store.share(tensor_id)

    def _settle(self, op: AnyOp, value: Failure) -> None:
        """Store ``value`` under every output of ``op`` (replacing, for an in-place op)."""
        for out in op.outputs():
            if op.inplace:
                self.store.replace(out, value)
            else:
                self.store.put(out, value)

    def _execute(
        self, op: AnyOp, args: list[np.ndarray[Any, Any]], metas: tuple[TensorMeta, ...], job: Job
    ) -> None:
        try:
            owned = op.inplace and self._owned(op.out)
            arrays = executor.run(op, args, job.buffers, metas, in_place=owned)
        except InvalidOpError as exc:
            self._fail(op, ErrorCode.INVALID_OP, str(exc), job)
        except executor.InferenceMismatch as exc:
            self._fail(op, ErrorCode.INTERNAL, str(exc), job)
        except Exception as exc:  # numpy's genuine runtime failures
            self._fail(op, ErrorCode.EXECUTION_FAILED, f"{type(exc).__name__}: {exc}", job)
        else:
            for out, array in zip(op.outputs(), arrays, strict=True):
                meta = TensorMeta(array.shape, from_numpy(array.dtype))
                # an in-place op's result is its own unless it is another input's array
                stored = Stored(array, meta, owned=op.inplace and array is not args[1])
                if op.inplace:
                    self.store.replace(out, stored)
                else:
                    self.store.put(out, stored)
            self.ops_run += 1
            self.op_counts[getattr(op, "op", None) or op.kind] += 1

    def _owned(self, tensor_id: int) -> bool:
        value = self.store.get(tensor_id)
        return isinstance(value, Stored) and value.owned

    def _fail(self, op: AnyOp, code: ErrorCode, message: str, job: Job) -> None:
        error = ErrorInfo(code=code, message=message, op=op.describe())
        self.error_counts[code.value] += 1
        level = logging.ERROR if code is ErrorCode.INTERNAL else logging.INFO
        log.log(level, "op failed", extra=fields(session=self.session_id, op=error.op, code=code))
        if code is ErrorCode.DUPLICATE_TENSOR or (op.inplace and op.out not in self.store):
            job.errors.append(error)  # the id belongs to another tensor: leave it alone
        else:
            self._settle(op, Failure(error))

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
        if isinstance(request, Describe):
            return self._describe(request)
        if isinstance(request, Stats):
            store = self.store
            reply = StatsReply(
                request_id=request.request_id,
                tensors=len(store),
                tensor_bytes=store.nbytes,
                failed=store.failed,
            )
            return reply, ()
        return SyncReply(request_id=request.request_id), ()

    def _describe(self, request: Describe) -> Reply:
        try:
            value = self.store.get(request.tensor)
        except StoreError as exc:
            error = ErrorInfo(code=exc.code, message=str(exc))
            return RequestFailed(request_id=request.request_id, error=error), ()
        if isinstance(value, Failure):
            return RequestFailed(request_id=request.request_id, error=value.error), ()
        meta = value.meta
        return DescribeReply(request_id=request.request_id, shape=meta.shape, dtype=meta.dtype), ()

    def _read(self, request: Read) -> Reply:
        try:
            value = self.store.get(request.tensor)
        except StoreError as exc:
            error = ErrorInfo(code=exc.code, message=str(exc))
            return RequestFailed(request_id=request.request_id, error=error), ()
        if isinstance(value, Failure):
            return RequestFailed(request_id=request.request_id, error=value.error), ()
        self.store.share(request.tensor)  # the reply's bytes are written later
        view = byte_view(value.array)
        reply = ReadReply(
            request_id=request.request_id,
            shape=value.meta.shape,
            dtype=value.meta.dtype,
            nbytes=view.nbytes,
        )
        return reply, (view,)

    def close(self) -> None:
        self.store.clear()
