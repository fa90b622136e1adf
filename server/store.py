"""A session's tensors (id -> numpy array or the failure that produced it) and memory accounting.

Accounting (docs/security.md) counts memory, not tensors: every stored array is either the
owner of its memory (a *root*: an ndarray whose ``base`` is None) or a view whose root is
already held by this store (``reshape``, slicing, ``permute_dims`` stay zero-copy). A root's
bytes are counted once, while any tensor uses it, and given back when the last one is freed.
Any other result (a view of a received message or of a temporary) is copied before it is
stored (``server/outcome.py``), so no byte is held that is not counted. Bytes are *reserved*
before numpy runs, from the inferred output size, against the session's quota and the
server-wide budget (``server/budget.py``); the reservation becomes the new root, is given back
when the result is a view of a held root, or is cancelled if the op fails. When full, new work
is refused (``quota_exceeded`` / ``server_memory_exhausted``); stored tensors are never dropped.

Entries cost bookkeeping (``records``; RSS: 538 bytes an empty tensor, 822 a failure record),
counted in the budget and bounded per session by the quota's size again, apart from tensor
bytes (:meth:`TensorStore.entry_room`): an op needs room for its entry too. A failure record
may use :data:`FAILURE_HEADROOM` more (invariant 5: its readers must learn the error); past
that its outputs stay unknown ids, and :meth:`TensorStore.take_unrecorded` says so. An upload's
buffer is counted from its allocation (:meth:`TensorStore.hold_upload`) until its op takes it.

Views share memory, as in numpy (docs/array-api.md): an in-place op writes into its target's
memory, so every tensor that views the same root sees the write. :meth:`TensorStore.prepare_write`
keeps two things apart from it: a read reply or an exposure that still sends the root's bytes
(:meth:`TensorStore.share`): the root is *moved* first (``server/roots.py``: a copy of all of
it, which the writing op counts in its work, :meth:`TensorStore.move_cost`), and the old memory
is charged while it lives (an exposure's by the exposure; a read reply's by the store, in
:attr:`TensorStore.moved`, from before the copy is made); and a read-only view
(``broadcast_to``), which numpy cannot write: that one tensor is written into a copy.

Threads: a store is changed by one thread at a time — the event loop, or the worker thread
running its session's ops (the session defers :meth:`TensorStore.close` until that thread has
returned), so it takes no lock; the budget, shared by every session's threads, locks. A result
that arrives after :meth:`TensorStore.close` (only when the server abandons a worker thread at
shutdown) is discarded and its reservation given back.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from protocol import ErrorCode, ErrorInfo, MessageLimitError, TensorMeta

from .budget import Bookkeeping, Holds, MemoryBudget
from .errors import StoreError
from .roots import Root, copy_cost, root_of

ENTRY_BYTES = 640  # a stored tensor's bookkeeping: its id, record, array header and root
FAILURE_BYTES = 768  # a failure record's, before the text of its error
FAILURE_HEADROOM = 4 << 20  # failure records kept past full bookkeeping or budget (~4000)
ENTRY_MIN = 1 << 20  # the bookkeeping a session may hold under the smallest quota (~1600)


@dataclass(frozen=True, slots=True)
class Failure:
    """What a failed op leaves in place of its output; dependants inherit it unchanged."""

    error: ErrorInfo


@dataclass(frozen=True, slots=True)
class Stored:
    """A tensor's array (``meta`` has its real shape: no ``UNKNOWN`` dim)."""

    array: np.ndarray[Any, Any]
    meta: TensorMeta


def entry_bytes(value: Stored | Failure) -> int:
    """What keeping ``value`` costs the process beyond its array's bytes."""
    if isinstance(value, Failure):
        return FAILURE_BYTES + len(value.error.message) + len(value.error.op or "")
    return ENTRY_BYTES


class TensorStore:
    """Tensors by client-allocated id, with byte accounting against a quota and a budget."""

    def __init__(self, quota: int | None = None, budget: MemoryBudget | None = None) -> None:
        self._items: dict[int, Stored | Failure] = {}
        self._roots: dict[int, Root] = {}  # by id() of the root array
        self.quota = quota
        self.budget = budget if budget is not None else MemoryBudget(2**63)
        self.nbytes = 0  # bytes of the roots the stored arrays use
        self.reserved = 0  # bytes reserved for ops that are running
        # what the entries cost (entry_bytes), in the budget; the quota's size again at most
        self.records = Bookkeeping(self.budget, 2**63 if quota is None else max(quota, ENTRY_MIN))
        self.uploads = Holds()  # upload buffers allocated and not yet taken by their ops
        self.headers = Holds()  # decoded message headers' objects (server/header_memory.py)
        self.moved = Holds()  # memory moved away from (prepare_write) that read replies send
        self.exposed = 0  # bytes of open transfer capabilities (server/exposures.py changes it)
        self.failed = 0
        self.unrecorded = 0  # failure records not kept since take_unrecorded
        self._first_unrecorded: ErrorInfo | None = None
        self.closed = False

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, tensor_id: int) -> bool:
        return tensor_id in self._items

    def get(self, tensor_id: int) -> Stored | Failure:
        """Raises :class:`StoreError` (``unknown_tensor``) for an id the session lacks."""
        try:
            return self._items[tensor_id]
        except KeyError:
            raise StoreError(
                ErrorCode.UNKNOWN_TENSOR, f"tensor #{tensor_id} does not exist in this session"
            ) from None

    def lookup(self, tensor_id: int) -> Stored | Failure | None:
        """What :meth:`get` returns, or None for an id the session lacks."""
        return self._items.get(tensor_id)

    def holds(self, root: np.ndarray[Any, Any]) -> bool:
        """True if ``root`` is the memory of a tensor in this store."""
        entry = self._roots.get(id(root))
        return entry is not None and entry.array is root

    def free_quota(self) -> int:
        """Bytes this session may still reserve (ignoring the server-wide budget)."""
        if self.quota is None:
            return 2**63
        return self.quota - self.in_use() + self.records.nbytes

    def in_use(self) -> int:
        """Bytes this session holds in the budget: its tensors, reservations, held buffers,
        exposed copies and records (``MemoryBudget.ceiling`` tells a small session by them)."""
        held = self.uploads.nbytes + self.moved.nbytes + self.headers.nbytes + self.exposed
        return self.nbytes + self.reserved + held + self.records.nbytes

    def entry_room(self) -> int:
        """Bookkeeping bytes this session may still add (see the module docstring)."""
        return self.records.limit - self.records.nbytes

    def reserve(self, nbytes: int) -> None:
        """Reserve ``nbytes`` for an op's output before it runs (with room for its entry:
        :data:`ENTRY_BYTES`, charged when it is stored).

        Raises:
            StoreError: ``quota_exceeded`` (this session's quota) or ``server_memory_exhausted``
                (the budget); nothing is reserved then.
        """
        # No store lock: only the thread running this session's ops changes ``reserved``.
        in_use = self.in_use()  # free_quota(), inlined: the budget takes it too
        if self.quota is not None and nbytes > self.quota - in_use + self.records.nbytes:
            raise self._quota_full(nbytes)
        if self.records.nbytes + ENTRY_BYTES > self.records.limit:  # entry_room(), inlined
            raise StoreError(
                ErrorCode.QUOTA_EXCEEDED,
                f"the session holds {len(self._items)} tensors and failure records, as many as "
                "its quota allows (their records take its size again); free tensors first",
            )
        self.budget.reserve(nbytes, in_use)
        self.reserved += nbytes

    def _quota_full(self, nbytes: int) -> StoreError:
        return StoreError(
            ErrorCode.QUOTA_EXCEEDED,
            f"the session's memory quota is full ({(self.quota or 0) - self.free_quota()} of "
            f"{self.quota} bytes in use, {nbytes} more needed); free tensors first, or raise "
            "--session-quota",
        )

    def hold_upload(self, nbytes: int) -> np.ndarray[Any, np.dtype[np.uint8]]:
        """A buffer for ``nbytes`` of an upload (the decoder's ``allocate``), counted in the
        quota and the budget until its op takes it (:meth:`take_upload`) or it is dropped.
        Raises :class:`MessageLimitError` (``quota_exceeded``, ``server_memory_exhausted``)."""
        try:
            if nbytes > self.free_quota():
                raise self._quota_full(nbytes)
            return self.budget.hold(nbytes, self.uploads, self.in_use())
        except StoreError as exc:
            raise MessageLimitError(str(exc), exc.code) from None

    def take_upload(self, buffers: Sequence[object], index: int, nbytes: int) -> bool:
        """Whether the ``nbytes`` held for ``buffers[index]`` (:meth:`hold_upload`) became the
        running op's reservation, as :meth:`reserve` makes it; False if they are not held
        (another size, a single-frame message's view): the caller reserves instead."""
        held = index < len(buffers) and self.budget.take(buffers[index], nbytes, self.uploads)
        self.reserved += nbytes if held else 0
        return held

    def cancel(self, nbytes: int) -> None:
        """Give back a reservation whose op did not store a result."""
        self.reserved -= nbytes
        self.budget.release(nbytes)

    def put(
        self, tensor_id: int, value: Stored | Failure, reserved: int = 0, forced: bool = False
    ) -> None:
        """Store ``value``, turning the ``reserved`` bytes (from :meth:`reserve`) into its root:
        a :class:`Stored` array must be a view of a held root (the reservation is given back) or
        a root of exactly ``reserved`` bytes. After :meth:`close`, the value is dropped and its
        bytes released. A :class:`Failure` without room is not kept (``forced``: kept anyway).

        Raises:
            StoreError: ``duplicate_tensor`` if the id is taken (the reservation is kept).
        """
        if self.closed:
            self.reserved -= reserved
            self.budget.release(reserved)
            return
        if tensor_id in self._items:
            raise StoreError(ErrorCode.DUPLICATE_TENSOR, f"tensor id #{tensor_id} is in use")
        if isinstance(value, Failure):
            if not self.keep_record(entry_bytes(value), forced):  # answered as unrecorded
                self.unrecorded += 1
                self._first_unrecorded = self._first_unrecorded or value.error
                return
            self._items[tensor_id] = value
            self.failed += 1
            return
        self._items[tensor_id] = value
        self.records.add(ENTRY_BYTES)
        self.reserved -= reserved
        root = root_of(value.array)
        entry = self._roots.get(id(root))
        if entry is not None and entry.array is root:
            entry.users += 1
            self.budget.release(reserved)  # already counted
            return
        assert root.base is None and root.nbytes == reserved, (root.nbytes, reserved)
        self._roots[id(root)] = Root(root)
        self.nbytes += reserved

    def keep_record(self, nbytes: int, forced: bool = False) -> bool:
        """Charge ``nbytes`` of a failure's record (``records.remove`` gives them back):
        ``forced``, or if they fit the quota and the budget plus :data:`FAILURE_HEADROOM`;
        False, and nothing charged, if not."""
        fits = forced or nbytes <= self.entry_room() + FAILURE_HEADROOM
        return fits and self.records.add(
            nbytes, None if forced else FAILURE_HEADROOM, self.in_use()
        )

    def take_unrecorded(self) -> list[ErrorInfo]:
        """The error to answer for the failure records not kept since the last call, if any."""
        count, first = self.unrecorded, self._first_unrecorded
        if not count or first is None:
            return []
        self.unrecorded, self._first_unrecorded = 0, None
        quota_full = self.entry_room() < FAILURE_BYTES
        code = ErrorCode.QUOTA_EXCEEDED if quota_full else ErrorCode.SERVER_MEMORY_EXHAUSTED
        message = (
            f"{count} failed ops left no failure record (their outputs are unknown ids): "
            f"{len(self._items)} tensors and failure records fill the "
            f"{'quota' if quota_full else 'memory budget'}; free tensors. The first failed with "
            f"{first.code.value}: {first.message}"
        )
        return [ErrorInfo(code=code, message=message, op=first.op)]

    def share(self, tensor_id: int, sent: memoryview, counted: bool = False) -> None:
        """Record that a read reply of ``tensor_id`` (an exposure, ``counted``: it charges the
        bytes it keeps) sends ``sent`` (a byte view, as ``protocol.codec.byte_view`` makes)
        later: while the array it exports lives, no write reaches its bytes
        (:meth:`prepare_write` moves the root first). A view of a copy is no concern of the
        store's."""
        value = self._items.get(tensor_id)
        exporter = sent.obj
        if isinstance(value, Stored) and isinstance(exporter, np.ndarray):
            entry = self._roots[id(root_of(value.array))]
            if root_of(exporter) is entry.array:
                entry.share(exporter, counted)

    def move_cost(self, tensor_id: int) -> int:
        """The work, as ``executor.cost`` counts it, that :meth:`prepare_write` of
        ``tensor_id`` adds to its op: a move of its root if a reply or an exposure still sends
        it (0 if none does, or the id is unknown, failed or read-only)."""
        value = self._items.get(tensor_id)
        if not isinstance(value, Stored) or not value.array.flags.writeable:
            return 0
        entry = self._roots[id(root_of(value.array))]
        return copy_cost(entry.array.nbytes) if entry.being_sent() else 0

    def writes_in_place(self, tensor_id: int) -> bool:
        """Whether :meth:`prepare_write` of ``tensor_id`` gives its stored array as it is, with
        no move to count: writeable, and no reply or exposure sends its root."""
        value = self._items.get(tensor_id)
        if not isinstance(value, Stored) or not value.array.flags.writeable:
            return False
        return not self._roots[id(root_of(value.array))].being_sent()

    def prepare_write(self, tensor_id: int) -> np.ndarray[Any, Any] | None:
        """The array of ``tensor_id``, made safe to write in place: a root that a read reply or
        an exposure still sends from is moved first (every tensor on it is re-pointed to the
        same view of fresh memory, so an array taken before this call may be stale). None for a
        read-only view (numpy's ``broadcast_to``), and an unknown or failed id: the caller
        writes into a copy.

        Raises:
            StoreError: ``quota_exceeded`` or ``server_memory_exhausted``: the quota or the
                budget has no room for the memory that read replies keep (:attr:`moved`), or
                the process none for the move.
        """
        value = self._items.get(tensor_id)
        if not isinstance(value, Stored) or not value.array.flags.writeable:
            return None
        entry = self._roots[id(root_of(value.array))]
        if entry.being_sent() and entry.array.nbytes:
            self._move(entry)
            value = self._items[tensor_id]
            assert isinstance(value, Stored)
        return value.array

    def _move(self, entry: Root) -> None:
        """Copy ``entry``'s bytes to fresh memory and re-point its tensors there, each to the
        same offset and strides (so views stay views of one another). The old memory, if a
        read reply still sends it, is held in :attr:`moved` (reserved before the copy) until
        it dies; the store's counts do not change."""
        old = entry.array
        unsent = old.nbytes if entry.replies_pending() else 0  # an exposure's are counted
        if unsent > self.free_quota():
            raise self._quota_full(unsent)
        self.budget.reserve(unsent, self.in_use())
        try:
            fresh = np.empty(old.nbytes, dtype=np.uint8)
        except MemoryError:
            self.budget.release(unsent)
            raise StoreError(
                ErrorCode.SERVER_MEMORY_EXHAUSTED,
                f"no memory to move {old.nbytes} bytes that a read reply still sends",
            ) from None
        # An owning array is dense with non-negative strides: ravel("K") is its memory in order.
        fresh[...] = old.ravel(order="K").view(np.uint8)
        if unsent:
            self.budget.hold_while(old, unsent, self.moved)
        start = old.ctypes.data
        users = [
            (i, v)
            for i, v in self._items.items()
            if isinstance(v, Stored) and root_of(v.array) is old
        ]
        assert len(users) == entry.users
        for tensor_id, value in users:
            view = value.array
            moved: np.ndarray[Any, Any] = np.ndarray(
                view.shape,
                view.dtype,
                buffer=fresh,
                offset=view.ctypes.data - start,
                strides=view.strides,
            )
            moved.flags.writeable = bool(view.flags.writeable)
            self._items[tensor_id] = Stored(moved, value.meta)
        del self._roots[id(old)]
        entry.array = fresh
        entry.readers = entry.exposed = None
        self._roots[id(fresh)] = entry

    def replace(self, tensor_id: int, value: Stored | Failure, reserved: int = 0) -> None:
        """Store ``value`` under an id that exists (an in-place update keeps the id), as
        :meth:`put` does; the old value's root is released after ``value`` is counted, so a
        result written into the old array is not counted twice nor given back.

        Raises:
            StoreError: ``unknown_tensor`` if the id does not exist.
        """
        if not self.closed:
            self.get(tensor_id)  # raises for an unknown id
        old = None if self.closed else self._items.pop(tensor_id)
        self.put(tensor_id, value, reserved, forced=True)  # a failure takes the old one's place
        self._forget(old)  # after close: put drops value and gives its reservation back

    def free(self, tensor_id: int) -> None:
        """Forget an id. Freeing an unknown id does nothing (frees are idempotent)."""
        self._forget(self._items.pop(tensor_id, None))

    def _forget(self, value: Stored | Failure | None) -> None:
        if value is None:
            return
        self.records.remove(ENTRY_BYTES if type(value) is Stored else entry_bytes(value))
        if isinstance(value, Failure):
            self.failed -= 1
        else:
            root = root_of(value.array)
            entry = self._roots[id(root)]
            entry.users -= 1
            if not entry.users:
                del self._roots[id(root)]
                self.nbytes -= root.nbytes
                self.budget.release_root(root)

    def close(self) -> None:
        """Drop every tensor and give its bytes back; later results are discarded."""
        self.closed = True
        self._items.clear()
        self._roots.clear()
        self.budget.release(self.nbytes)
        self.records.close()
        self.nbytes = 0
        self.failed = 0
        self.budget.release_holds(self.uploads)  # not when their buffers die: that can wait
        self.budget.release_holds(self.moved)
        self.budget.release_holds(self.headers)

    clear = close
