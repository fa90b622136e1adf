"""What a batch's requests are answered with, once its ops have run: reads, describes, stats,
syncs, and the two requests of direct transfers (``server/exposures.py``): an expose, which
makes a capability, and a claim, which sends the exposed bytes to the peer server that presents
it. No I/O here: the replies are messages and the byte views they send.

An expose is made before the replies, as the batch's last step (:meth:`Requests.expose`,
called by ``Session.step``), because it may copy: a small view's exposure keeps a compact copy
of its bytes, whose cost (``Exposures.copy_cost``) is counted as an op's, so that a large one
is made in a worker thread, never on the event loop.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from protocol import (
    Batch,
    Claim,
    Describe,
    DescribeReply,
    ErrorCode,
    ErrorInfo,
    Expose,
    ExposeReply,
    GraphRefused,
    Read,
    ReadReply,
    RequestFailed,
    SessionError,
    Stats,
    StatsReply,
    SyncReply,
    TensorMeta,
)
from protocol.messages import Request

from .errors import StoreError, bare
from .exposures import Exposures
from .outcome import Job
from .roots import sent_view
from .store import Failure, Stored, TensorStore

Reply = tuple[
    ReadReply
    | SyncReply
    | StatsReply
    | DescribeReply
    | ExposeReply
    | RequestFailed
    | SessionError
    | GraphRefused,
    Sequence[memoryview],
]


class Requests:
    """Answers the requests of one session (its ``store``). ``exposures``: the server's open
    transfer capabilities, or None where there are none (the in-process device)."""

    def __init__(self, store: TensorStore, exposures: Exposures | None) -> None:
        self.store = store
        self.exposures = exposures

    def reply_bytes(self, batch: Batch) -> int:
        """The tensor bytes the replies to ``batch``'s reads and claims will carry (now)."""
        total = 0
        for request in batch.requests:
            if isinstance(request, Read):
                value = self.store.lookup(request.tensor)
                if isinstance(value, Stored):
                    total += value.array.nbytes
            elif isinstance(request, Claim) and self.exposures is not None:
                total += self.exposures.nbytes(request.capability)
        return total

    def expose(self, job: Job, inline_cost: int | None, pause_at: float) -> bool:
        """Make ``job``'s exposes, in order (:attr:`Job.exposed`, by position in its requests);
        True once all are made. False, to go on later from the next one: its compact copy
        costs more than ``inline_cost`` (None: any cost may run here; ``job.op_started`` is set
        for the deadline watch), or ``time.monotonic()`` passed ``pause_at`` (``job.paused``)."""
        requests = job.batch.requests
        if job.exposing is None:
            job.exposing = [i for i, r in enumerate(requests) if type(r) is Expose][::-1]
        while job.exposing:
            request = requests[job.exposing[-1]]
            assert isinstance(request, Expose)
            exposures = self.exposures
            cost = 0 if exposures is None else exposures.copy_cost(self.store, request.tensor)
            if inline_cost is not None and cost > inline_cost:
                return False
            if time.monotonic() > pause_at:
                job.paused = True
                return False
            job.op_started = time.monotonic()
            try:
                made: str | StoreError = self._transfers().expose(
                    self.store, request.tensor, request.audience
                )
            except StoreError as exc:
                made = bare(exc)  # kept until answered: no frames (they hold the session)
            job.exposed[job.exposing.pop()] = made
        return True

    def answer(self, request: Request, made: str | StoreError | None = None) -> Reply:
        """The reply to ``request``; an expose's is what :meth:`expose` ``made`` of it."""
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
                server_tensor_bytes=store.budget.used,
                connections=store.budget.sessions,
            )
            return reply, ()
        if isinstance(request, Expose):
            if made is None:  # only a closed session's batch is left unfinished
                made = StoreError(ErrorCode.INTERNAL, "the expose was not made")
            if isinstance(made, StoreError):
                return _failed(request.request_id, made)
            ttl = self._transfers().ttl  # there are some: one was made
            return ExposeReply(request_id=request.request_id, capability=made, ttl=ttl), ()
        if isinstance(request, Claim):
            return self._claim(request)
        return SyncReply(request_id=request.request_id), ()

    def _stored(self, request: Read | Describe) -> Stored | Reply:
        """The tensor a request names, or the reply that says why it cannot be had."""
        try:
            value = self.store.get(request.tensor)
        except StoreError as exc:
            return _failed(request.request_id, exc)
        if isinstance(value, Failure):
            return RequestFailed(request_id=request.request_id, error=value.error), ()
        return value

    def _describe(self, request: Describe) -> Reply:
        value = self._stored(request)
        if not isinstance(value, Stored):
            return value
        meta = value.meta
        return DescribeReply(request_id=request.request_id, shape=meta.shape, dtype=meta.dtype), ()

    def _read(self, request: Read) -> Reply:
        value = self._stored(request)
        if not isinstance(value, Stored):
            return value
        view = sent_view(value.array)  # not a copy: a strided view is copied as it is sent
        self.store.share(request.tensor, view)  # the reply's bytes are written later
        meta = value.meta
        reply = ReadReply(
            request_id=request.request_id, shape=meta.shape, dtype=meta.dtype, nbytes=view.nbytes
        )
        return reply, (view,)

    def _transfers(self) -> Exposures:
        """The server's exposures. Raises :class:`StoreError` (``transfer_failed``) where there
        are none."""
        if self.exposures is None:
            raise StoreError(
                ErrorCode.TRANSFER_FAILED,
                "this device runs in the client's process: it has no transfers",
            )
        return self.exposures

    def _claim(self, request: Claim) -> Reply:
        """The exposed bytes, as a read reply."""
        try:
            meta = TensorMeta(request.shape, request.dtype)
            exposure = self._transfers().claim(request.capability, request.claimant, meta)
        except StoreError as exc:
            return _failed(request.request_id, exc)
        meta = exposure.meta
        reply = ReadReply(
            request_id=request.request_id,
            shape=meta.shape,
            dtype=meta.dtype,
            nbytes=exposure.sent.nbytes,
        )
        return reply, (exposure.sent,)


def _failed(request_id: int, exc: StoreError) -> Reply:
    error = ErrorInfo(code=exc.code, message=str(exc))
    return RequestFailed(request_id=request_id, error=error), ()
