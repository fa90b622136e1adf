"""Tensors that one session lets another server (or another session of this one) copy once:
the capabilities of direct transfers. No I/O here: the network side of a pull is
``server/peers.py``, given to each session as a :data:`Fetch`.

Theory of operation. ``expose`` (the :class:`~protocol.Expose` request, answered once every op
before it has run) keeps the tensor's array as it is now under a fresh random capability, bound
to one audience (the ``server_id`` of the server that may claim it) and to a deadline (the
server's ``--transfer-ttl``). The array is shared with the store as a read reply's is
(:meth:`TensorStore.share`): a later in-place write moves the tensor to fresh memory first,
so the exposed bytes are the value at exposure. ``claim`` takes the exposure out at once (a
capability works once), and answers with its bytes: a peer server's :class:`~protocol.Claim`
gets a read reply, a same-server ``pull`` a copy in memory.

Memory: an exposure's bytes are counted in its session's quota (``TensorStore.exposed``) and
in the budget from ``expose`` until it is claimed, expires (``expire``, called every few
seconds by the server), or its session closes, because the tensor may be freed or rewritten
meanwhile and the exposure alone then keeps the bytes: all of its root's (a view keeps its base
alive), or, for a view under half its root, a compact copy made at once. While the tensor
lives it is counted twice: conservative, and over within seconds for a transfer.
A session holds at most :data:`MAX_OPEN` capabilities at once. A used, expired or withdrawn
capability leaves a tombstone (at most :data:`TOMBSTONES`), so a refusal says why.

Threads: the registry is shared by every session, on the loop and in worker threads, so it
locks; it changes a store's ``exposed`` only under its lock, and the budget locks itself.
"""

from __future__ import annotations

import collections
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from protocol import ErrorCode, TensorMeta
from protocol.ops import Pull

from .errors import StoreError
from .roots import copy_cost, root_of, sent_view
from .store import Failure, Stored, TensorStore

MAX_OPEN = 256  # capabilities one session may hold open
TOMBSTONES = 65_536  # used, expired and withdrawn capabilities remembered, to say why

# The network side of a pull from another server: the array behind ``pull.capability`` at
# ``pull.source``, claimed as ``claimant`` (this server's id). Raises StoreError
# (``transfer_failed`` or ``capability_refused``, relayed from the source).
Fetch = Callable[[Pull, str], np.ndarray[Any, Any]]


@dataclass(slots=True)
class Exposure:
    """One open capability: the tensor as it was exposed, for whom, until when, charged to
    which store."""

    array: np.ndarray[Any, Any]
    meta: TensorMeta
    sent: memoryview  # the array's bytes as a read reply sends them (shared with the store)
    audience: str
    expires: float
    store: TensorStore
    nbytes: int  # charged: the memory it keeps alive (its root's, or its own copy's)


class Exposures:
    """The server's open capabilities. ``ttl``: seconds a capability lives."""

    def __init__(self, ttl: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl = ttl
        self._clock = clock
        self._open: dict[str, Exposure] = {}  # in the order made: expiry order (one ttl)
        self._per_store: collections.Counter[TensorStore] = collections.Counter()
        self._gone: collections.OrderedDict[str, str] = collections.OrderedDict()  # -> why
        self._lock = threading.Lock()

    def expose(self, store: TensorStore, tensor_id: int, audience: str) -> str:
        """A capability for ``tensor_id`` of ``store``, claimable once by ``audience``. Its
        bytes are charged before a compact copy is made (:meth:`copy_cost` says what that
        costs: the caller runs a costly one off the event loop).

        Raises:
            StoreError: ``unknown_tensor``; the failure of a failed tensor (its own code);
                ``quota_exceeded`` (the session's quota, or :data:`MAX_OPEN`) or
                ``server_memory_exhausted`` (the budget, or no memory for the copy) for the
                exposure's bytes.
        """
        value = store.get(tensor_id)
        if isinstance(value, Failure):
            raise StoreError(value.error.code, value.error.message)
        array = value.array
        compact = _compacted(array)
        nbytes = array.nbytes if compact else root_of(array).nbytes  # what it keeps alive
        with self._lock:
            self._expire_locked()
            if self._per_store[store] >= MAX_OPEN:
                raise StoreError(
                    ErrorCode.QUOTA_EXCEEDED,
                    f"the session holds {MAX_OPEN} open transfer capabilities; claim them or "
                    "let them expire first",
                )
            if nbytes > store.free_quota():
                raise StoreError(
                    ErrorCode.QUOTA_EXCEEDED,
                    f"exposing #{tensor_id} needs {nbytes} bytes of the session's quota until it "
                    f"is claimed; {store.free_quota()} are left",
                )
            self._charge_locked(store, nbytes)
        if compact:  # its own bytes, no more: charged above, copied now
            try:
                array = np.array(array, order="C")
            except MemoryError:
                with self._lock:
                    self._charge_locked(store, nbytes, opened=-1)
                raise StoreError(
                    ErrorCode.SERVER_MEMORY_EXHAUSTED, f"no memory for a copy of {nbytes} bytes"
                ) from None
        sent = sent_view(array)
        capability = secrets.token_urlsafe(32)
        expires = self._clock() + self.ttl
        with self._lock:
            self._open[capability] = Exposure(
                array, value.meta, sent, audience, expires, store, nbytes
            )
        if not compact:
            store.share(tensor_id, sent, counted=True)  # a later write moves the tensor
        return capability

    @staticmethod
    def copy_cost(store: TensorStore, tensor_id: int) -> int:
        """The work, as ``executor.cost`` counts it, of the compact copy that exposing
        ``tensor_id`` makes (0 if it makes none: not a small view, or not a stored tensor)."""
        value = store.lookup(tensor_id)
        if not isinstance(value, Stored) or not _compacted(value.array):
            return 0
        return copy_cost(value.array.nbytes)

    def claim(self, capability: str, claimant: str, meta: TensorMeta) -> Exposure:
        """The exposure behind ``capability``, taken out for good (refused or not, once found
        for ``claimant``), if its tensor has ``meta`` (what the claimant reserved).

        Raises:
            StoreError: ``capability_refused``: unknown, already used, expired, withdrawn
                (its session closed), or bound to another server than ``claimant``;
                ``transfer_failed``: the tensor is not ``meta``.
        """
        with self._lock:
            self._expire_locked()
            exposure = self._open.get(capability)
            if exposure is None:
                why = self._gone.get(capability, "is unknown to this server")
                raise StoreError(ErrorCode.CAPABILITY_REFUSED, f"the capability {why}")
            if exposure.audience != claimant:
                raise StoreError(
                    ErrorCode.CAPABILITY_REFUSED,
                    f"the capability is bound to server {exposure.audience}, not {claimant}",
                )
            self._close_locked(capability, "was already used (a capability works once)")
        if (exposure.meta.shape, exposure.meta.dtype) != (tuple(meta.shape), meta.dtype):
            raise StoreError(
                ErrorCode.TRANSFER_FAILED,
                f"the capability's tensor is {exposure.meta.dtype} of shape "
                f"{exposure.meta.shape}; the pull said {meta.dtype} of shape {meta.shape}",
            )
        return exposure

    def nbytes(self, capability: str) -> int:
        """The bytes a claim of ``capability`` would send now (0 if it would be refused)."""
        exposure = self._open.get(capability)  # no lock: a hint for the reply's size
        return 0 if exposure is None else exposure.sent.nbytes

    def withdraw(self, store: TensorStore) -> None:
        """Withdraw every capability of ``store`` (its session closed)."""
        with self._lock:
            if store not in self._per_store:
                return
            for capability in [c for c, e in self._open.items() if e.store is store]:
                self._close_locked(capability, "was withdrawn: its session closed")

    def expire(self) -> None:
        """Drop the capabilities past their deadline (also done by every expose and claim)."""
        with self._lock:
            self._expire_locked()

    def _expire_locked(self) -> None:
        now = self._clock()
        while self._open:
            capability, exposure = next(iter(self._open.items()))
            if exposure.expires > now:
                return  # the rest were made later
            self._close_locked(capability, f"expired ({self.ttl:g} s after it was made)")

    def _charge_locked(self, store: TensorStore, nbytes: int, opened: int = 1) -> None:
        """Count a capability of ``nbytes`` for ``store``: ``opened`` 1, charged; -1, given
        back.

        Raises:
            StoreError: ``server_memory_exhausted``, the budget has no room (nothing charged).
        """
        if opened > 0:
            store.budget.reserve(nbytes, store.in_use())
        else:
            store.budget.release(nbytes)
        store.exposed += opened * nbytes
        self._per_store[store] += opened
        if not self._per_store[store]:
            del self._per_store[store]

    def _close_locked(self, capability: str, why: str) -> None:
        exposure = self._open.pop(capability)
        self._charge_locked(exposure.store, exposure.nbytes, opened=-1)
        self._gone[capability] = why
        while len(self._gone) > TOMBSTONES:
            self._gone.popitem(last=False)


def _compacted(array: np.ndarray[Any, Any]) -> bool:
    """Whether an exposure of ``array`` keeps a compact copy, not its root: a small view (under
    half its root), whose root may be far larger than what is sent."""
    return 2 * array.nbytes < root_of(array).nbytes
