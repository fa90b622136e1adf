"""What a batch's requests are answered with, once its ops have run: reads, describes, stats,
syncs, and the two requests of direct transfers (``server/exposures.py``): an expose, which
makes a capability, and a claim, which sends the exposed bytes to the peer server that presents
it. No I/O here: the replies are messages and the byte views they send.
"""

from __future__ import annotations

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

from .errors import StoreError
from .exposures import Exposures
from .store import Failure, Stored, TensorStore, sent_view

Reply = tuple[
    ReadReply | SyncReply | StatsReply | DescribeReply | ExposeReply | RequestFailed | SessionError,
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

    def answer(self, request: Request) -> Reply:
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
        if isinstance(request, Expose | Claim):
            return self._transfer(request)
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

    def _transfer(self, request: Expose | Claim) -> Reply:
        """A capability for an expose; the exposed bytes, as a read reply, for a claim."""
        try:
            if self.exposures is None:
                raise StoreError(
                    ErrorCode.TRANSFER_FAILED,
                    "this device runs in the client's process: it has no transfers",
                )
            if isinstance(request, Expose):
                capability = self.exposures.expose(self.store, request.tensor, request.audience)
                ttl = self.exposures.ttl
                return ExposeReply(
                    request_id=request.request_id, capability=capability, ttl=ttl
                ), ()
            meta = TensorMeta(request.shape, request.dtype)
            exposure = self.exposures.claim(request.capability, request.claimant, meta)
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
