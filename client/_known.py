"""What the client knows of tensors' values without asking the server, and when it stops knowing.

Each device keeps a :class:`Known`: facts learnt about its tensors (their values once read or
uploaded, the number of true elements of a boolean mask once an indexing by it was described)
so that a later read, ``bool()`` or a mask's indexing needs no round trip.

A fact holds for the memory the tensor has at the moment it was learnt. Views share memory (an
in-place op writes its target's memory, and every view of the same root sees it), so each handle
carries ``_base``: the id of the memory it may view (its own id for an op that always writes
fresh memory, the viewed input's base for a view-making op, ``-1`` when it may view several).
Every in-place write marks its target's base written; a fact learnt before the last write of its
handle's base is dropped. A write whose reach the client cannot tell (a base of ``-1``, a
captured graph's run, an unchecked op) forgets every fact.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from protocol import Stats
from protocol.ops import (
    FFT,
    AdamDirection,
    AnyOp,
    Arange,
    Binary,
    BinaryScalar,
    Cumulative,
    Eye,
    FromBuffer,
    Full,
    Join,
    Linspace,
    Nonzero,
    Reduce,
    Repeat,
    Roll,
    SearchSorted,
    Sort,
    Take,
    Tile,
    Unary,
    Unique,
    Where,
)

if TYPE_CHECKING:
    from ._handle import Handle

ALONG_MOST = 12  # reads sent along with another
RECENT_MOST = 8  # small results made since the last read that the next read brings
ALONG_ELEMENTS = 1 << 12  # the largest mask read along with its any() or all()
VALUES_KEPT = 1 << 16  # the largest array (bytes) whose values are kept once read or uploaded
BYTES_KEPT = 16 << 20  # all kept values of a device together: the oldest facts go first
FACTS_KEPT = 1 << 16  # facts of a device, values or not: the oldest go first
WRITTEN_KEPT = 1 << 16  # written bases remembered before every fact is forgotten at once

# Ops whose output is always fresh memory on the server (numpy's ufuncs, reductions, joins,
# sorts, takes, rolls, tiles and the creation functions allocate); any other op's output may be
# a view of its first input. Unary's real, imag and conj may return their input itself.
FRESH_OPS = frozenset(
    {Binary, BinaryScalar, Reduce, Where, Full, FromBuffer, Arange, Eye, Linspace, AdamDirection}
    | {Join, Take, Sort, Cumulative, SearchSorted, Nonzero, Unique, FFT, Roll, Tile, Repeat}
)
NOT_FRESH_UNARY = frozenset({"real", "imag", "conj"})


@dataclass(slots=True)
class Fact:
    """What is known of one tensor's values as they were at ``epoch``."""

    epoch: int
    values: np.ndarray[Any, Any] | None = None  # read-only
    count: int | None = None  # true (non-zero) elements, for a boolean array
    complement: weakref.ref[Handle] | None = None  # a bool array whose negation this is
    source: weakref.ref[Handle] | None = None  # the array this ``any``/``all`` reduces
    # the small arrays exact ops (``abs``, ``max``, comparisons) made this one from
    roots: tuple[weakref.ref[Handle], ...] = ()
    array: weakref.ref[Handle] | None = None  # the small array this element is selected from
    pending: Future[Any] | None = None  # a read sent along with another: the values to come
    upload: int = 0  # an upload's number, until the server is known to hold it (0: it is)


def fresh(op: AnyOp) -> bool:
    """Whether ``op``'s output is fresh memory, never a view of an input."""
    if isinstance(op, Unary):
        return op.op not in NOT_FRESH_UNARY
    return type(op) in FRESH_OPS


class Known:
    """The facts a device's client holds about its tensors, and the writes that end them."""

    __slots__ = (
        "facts",
        "_written",
        "_epoch",
        "_forgotten",
        "_bytes",
        "_conn",
        "_writes",
        "paused",
        "_recent",
        "_uploads",
        "_confirmed",
        "_check",
    )

    def __init__(self, conn: Any = None) -> None:
        # insertion order is age; the oldest leave first, in O(1) (a dict's first key is
        # found by scanning the slots its removed keys left)
        self.facts: OrderedDict[int, Fact] = OrderedDict()
        self._written: dict[int, int] = {}  # base -> epoch of its last write
        self._epoch = 0
        self._forgotten = 0  # the epoch of the last write of unknown reach
        self._bytes = 0
        # The connection counts the writing ops it queues (``writes``: in-place ops, graph
        # runs); those that did not come through :meth:`wrote` (an op queued with
        # ``Device.submit`` directly) are writes of unknown reach.
        self._conn = conn if hasattr(conn, "writes") else _Unconnected()
        self._writes = 0
        self.paused = False  # while a capture records: it sees every read
        self._recent: list[weakref.ref[Handle]] = []  # 0-d results since the last read
        # An upload's values are known at once, but the server may refuse it (memory, size):
        # they are used once a session's stats, asked along with a read sent after it, show no
        # failed tensor (:meth:`confirm_along`).
        self._uploads = 0  # uploads noted
        self._confirmed = 0  # uploads up to this number are held by the server
        self._check: tuple[int, Future[Any]] | None = None  # stats asked after upload n

    @property
    def epoch(self) -> int:
        """Now, as facts are dated: a fact dated before a write of its memory is gone."""
        return self._epoch

    def __bool__(self) -> bool:
        return bool(self.facts) and not self.paused

    def wrote(self, base: int) -> None:
        """An in-place op is about to be queued that writes the memory of ``base`` (-1:
        unknown memory)."""
        if self._conn.writes != self._writes:
            self.forget()
        self._writes = self._conn.writes + 1
        self._epoch += 1
        if base < 0 or len(self._written) >= WRITTEN_KEPT:
            self.forget()
        else:
            self._written[base] = self._epoch

    def _catch_up(self) -> None:
        """Forget everything if the connection queued writes that :meth:`wrote` did not see."""
        if self._conn.writes != self._writes:
            self._writes = self._conn.writes
            self.forget()

    def forget(self) -> None:
        """Forget every fact: something wrote memory the client cannot name."""
        self._epoch += 1
        self._forgotten = self._epoch
        self.facts.clear()
        self._written.clear()
        self._bytes = 0

    def fact(self, handle: Handle) -> Fact | None:
        """What is known of ``handle``'s values now, if anything."""
        self._catch_up()
        fact = self.facts.get(handle._id)
        if fact is None or self.paused:
            return None
        if fact.epoch < self._forgotten or self._written.get(handle._base, -1) > fact.epoch:
            self._drop(handle._id)
            return None
        return fact

    def values(self, handle: Handle) -> np.ndarray[Any, Any] | None:
        fact = self._resolved(handle)
        return None if fact is None else fact.values

    def count(self, handle: Handle) -> int | None:
        """The number of non-zero elements of ``handle``, if known."""
        fact = self._resolved(handle)
        if fact is None:
            return None
        if fact.count is None and fact.values is not None:
            fact.count = int(np.count_nonzero(fact.values))
        return fact.count

    def derivable(self, handle: Handle) -> tuple[np.ndarray[Any, Any] | None, int]:
        """``handle``'s values to derive others' from, and the number of the upload whose
        confirmation they still await (0: none), which what is derived from them awaits too:
        an upload's values are known at once, and a read of what was derived from them must
        still raise the upload's error if the server refused it. Never waits."""
        fact = self._taken_in(handle)
        if fact is None or fact.values is None:
            return None, 0
        if fact.upload > self._confirmed and self._check is not None and self._check[1].done():
            self._settle(self._check[0])
            if self.facts.get(handle._id) is not fact:  # dropped: the server refused something
                return None, 0
        return fact.values, (fact.upload if fact.upload > self._confirmed else 0)

    def _resolved(self, handle: Handle) -> Fact | None:
        """:meth:`_taken_in`, and only once the server is known to hold it if it is an
        upload's (or derived from one)."""
        fact = self._taken_in(handle)
        if fact is not None and fact.upload > self._confirmed and not self._settle(fact.upload):
            return None
        return fact

    def _taken_in(self, handle: Handle) -> Fact | None:
        """:meth:`fact`, with the values of a read sent along with another's taken in (a read
        that failed is forgotten: the handle's own read raises its error)."""
        fact = self.fact(handle)
        if fact is None:
            return None
        if fact.pending is not None:
            pending, fact.pending = fact.pending, None
            try:
                values = pending.result()
            except Exception:
                self._drop(handle._id)
                return None
            values.flags.writeable = False
            self._bytes += values.nbytes
            fact.values = values
        return fact

    def check_open(self) -> None:
        """Raise the connection's error, as a read would (a value known needs no connection,
        but a closed or broken one must still be told)."""
        check = getattr(self._conn, "_check_open", None)
        if check is not None:
            check()

    def confirm_along(self) -> None:
        """Before a read: ask for the session's stats with it if uploads await confirmation."""
        if self._check is not None and self._check[1].done():
            self._settle(self._check[0])
        if self._check is None and self._uploads > self._confirmed and not self.paused:
            request = self._conn.request
            if request is not None:
                self._check = (self._uploads, request(lambda rid: Stats(request_id=rid)))

    def _settle(self, upload: int) -> bool:
        """Whether upload number ``upload`` is confirmed, from the stats asked after it (if
        any were): no failed tensor confirms every upload before them; a failed one leaves
        them unconfirmable (they are forgotten: reads ask the server)."""
        if self._check is None or self._check[0] < upload:
            return False
        checked, stats = self._check
        self._check = None
        try:
            failed = stats.result().failed
        except Exception:
            failed = -1
        if failed == 0:
            self._confirmed = max(self._confirmed, checked)
            return True
        for tensor_id in [t for t, f in self.facts.items() if 0 < f.upload <= checked]:
            self._drop(tensor_id)
        return False

    def read_along(self, handle: Handle) -> list[Handle]:
        """The arrays whose values a read of ``handle`` fetches in the same round trip: the
        mask an ``any``/``all`` reduces (its indexing by it follows), and the small results
        and masks made since the last read (conditions read one after another, a mask tested
        after a read of something else)."""
        if self.paused:
            return []
        recent, self._recent = self._recent, []
        along: list[Handle] = []
        for a in (handle, *(r() for r in recent)):
            if a is None:
                continue
            if a is not handle:
                along.append(a)
            fact = self.fact(a)
            if fact is None:
                continue
            source = None if fact.source is None else fact.source()
            if source is not None and source.size <= ALONG_ELEMENTS:
                along.append(source)
            along += self.roots(source) if source is not None else ()
            along += self.roots(a)  # later ops on them are then answered without a read
        unique = {id(a): a for a in along if self._unknown(a)}
        return list(unique.values())[:ALONG_MOST]

    def roots(self, handle: Handle, element: bool = False) -> list[Handle]:
        """The small arrays exact ops made ``handle`` from, if known (``Fact.roots``); with
        ``element``, the array an element is selected from too (an element's own read
        brings it not: a lone item is read alone)."""
        fact = self.fact(handle)
        if fact is None:
            return []
        refs = fact.roots or ((fact.array,) if element and fact.array is not None else ())
        return [r for r in (ref() for ref in refs) if r is not None]

    def _unknown(self, handle: Handle) -> bool:
        fact = self.fact(handle)
        return fact is None or (fact.values is None and fact.pending is None)

    def note_result(self, handle: Handle) -> None:
        """``handle`` is a 0-d result (a reduction, a comparison) or a small mask: likely read
        soon."""
        if len(self._recent) >= RECENT_MOST:
            del self._recent[0]
        self._recent.append(weakref.ref(handle))

    def learn(
        self,
        handle: Handle,
        *,
        values: np.ndarray[Any, Any] | None = None,
        count: int | None = None,
        complement: Handle | None = None,
        source: Handle | None = None,
        roots: Sequence[Handle] = (),
        array: Handle | None = None,
        pending: Future[Any] | None = None,
        epoch: int | None = None,
        uploaded: bool = False,
        awaiting: int = 0,
    ) -> None:
        """Note a fact about ``handle``'s values as they are now (or were at ``epoch``).
        ``values`` are kept (a read-only copy is the caller's to make) if small enough: an
        upload's (``uploaded``) once confirmed, a read's at once, values derived from an
        upload's once upload number ``awaiting`` is confirmed (:meth:`derivable`)."""
        if handle._base < 0 or self.paused:
            return
        if values is not None and values.nbytes > VALUES_KEPT:
            values = None
        old = self.fact(handle)
        if epoch is None and old is not None:  # it holds still: add to what is known
            fact = Fact(old.epoch, old.values, old.count, old.complement, old.source)
            fact.pending, fact.roots, fact.array = old.pending, old.roots, old.array
            fact.upload = old.upload if values is None else 0
        else:
            fact = Fact(self._epoch if epoch is None else epoch)
        if uploaded and values is not None:
            self._uploads += 1
            fact.upload = self._uploads
        elif awaiting and values is not None:
            fact.upload = awaiting
        fact.values = values if values is not None else fact.values
        fact.count = count if count is not None else fact.count
        if complement is not None:
            fact.complement = weakref.ref(complement)
        if source is not None:
            fact.source = weakref.ref(source)
        if roots:
            fact.roots = tuple(weakref.ref(r) for r in roots)
        if array is not None:
            fact.array = weakref.ref(array)
        if pending is not None and fact.values is None:
            fact.pending = pending
        self._drop(handle._id)
        self.facts[handle._id] = fact
        self._bytes += 0 if fact.values is None else fact.values.nbytes
        while self._bytes > BYTES_KEPT or len(self.facts) > FACTS_KEPT:
            oldest = self.facts.popitem(last=False)[1]
            self._bytes -= 0 if oldest.values is None else oldest.values.nbytes

    def learn_count(self, handle: Handle, count: int) -> None:
        """``handle`` has ``count`` true elements; so has the complement of its negation."""
        fact = self.fact(handle)
        self.learn(handle, count=count)
        negated = None if fact is None or fact.complement is None else fact.complement()
        if negated is not None and fact is not None:
            self.learn(negated, count=negated.size - count, epoch=fact.epoch)

    def _drop(self, tensor_id: int) -> None:
        fact = self.facts.pop(tensor_id, None)
        if fact is not None and fact.values is not None:
            self._bytes -= fact.values.nbytes


class _Unconnected:
    """The connection of a device without one (a record-only capture device)."""

    writes = 0
    request = None


H = TypeVar("H", bound="Handle")


def viewing(handle: H) -> H:
    """``handle``, marked as an output that may view any tensor (a captured graph's)."""
    handle._base = -1
    return handle
