"""The memory that stored tensors use, each a *root* (an ndarray whose ``base`` is None), and
who still sends it: what keeps an in-place write from the bytes of a reply or an exposure.

Views share memory, as in numpy (docs/array-api.md): an in-place op writes into its target's
memory, so every tensor that views the same root sees the write. Two kinds of sender must not
see it: a read reply whose bytes are not sent yet, and an exposure (``server/exposures.py``),
whose bytes are the tensor's value at exposure. Each records the array it sends from, weakly
(:meth:`Root.share`); while one lives, the store *moves* the root before a write
(``TensorStore.prepare_write``): its bytes are copied to fresh memory and every tensor that
used it is re-pointed there, so the senders keep the old bytes and the tensors stay one family.

A move is a copy of the whole root into fresh memory (:func:`copy_cost`), however little the
write changes: the op that writes counts it in its work (``Session._over_cost``), so that a
large one runs in a worker thread like any costly op, never on the event loop. The old memory
lives as long as its senders: an exposure counts its root's bytes already (in its session's
quota and the budget, from ``expose`` on); a read reply does not, so the store holds them in
the quota and the budget from before the move until that memory dies.
"""

from __future__ import annotations

import weakref
from typing import Any

import numpy as np

from protocol import byte_view

Array = np.ndarray[Any, Any]
Senders = list[weakref.ref[Array]]
# A byte copied into memory just allocated, in the cost model's unit (``executor.cost``): its
# page faulted in first (bench/REASONS.md, 'The op cost model').
FRESH_BYTE = 4


def root_of(array: Array) -> Array:
    """The last ndarray in ``array``'s chain of bases (``array`` itself if it has none)."""
    root = array
    while isinstance(root.base, np.ndarray):
        root = root.base
    return root


def sent_view(array: Array) -> memoryview:
    """What a read reply sends of ``array``: its bytes, or if it is strided a view of its own
    (which :meth:`Root.share` follows) that the sender copies a fragment at a time
    (``server/sending.py``), never the whole (24 reads of a 63 MiB view took 1.5 GiB)."""
    return byte_view(array) if array.flags.c_contiguous else array.view().data


def copy_cost(nbytes: int) -> int:
    """What copying ``nbytes`` into memory just allocated costs (a move of a root, an
    exposure's compact copy), as ``executor.cost`` counts: each page faults in first."""
    return nbytes * FRESH_BYTE


class Root:
    """Memory that stored tensors use: the owning array, how many tensors use it, and the
    arrays that read replies and exposures send from (weakly: sent once they are gone; None
    until the first). Made once per op result: kept light (no set of users; a move, which is
    rare, finds them)."""

    __slots__ = ("array", "users", "readers", "exposed")

    def __init__(self, array: Array) -> None:
        self.array = array
        self.users = 1
        self.readers: Senders | None = None  # read replies: their bytes counted nowhere
        self.exposed: Senders | None = None  # exposures: their bytes counted by each

    def share(self, exporter: Array, counted: bool) -> None:
        """Record that a read reply (an exposure, ``counted``: its bytes are charged by it)
        sends from ``exporter``, a view of this memory."""
        senders = (self.exposed if counted else self.readers) or []
        if senders and not len(senders) & (len(senders) - 1):
            senders = _alive(senders)  # pruned at 1, 2, 4... senders (at each, 100k reads of
        senders.append(weakref.ref(exporter))  # one tensor in one batch held the loop 20 s+)
        if counted:
            self.exposed = senders
        else:
            self.readers = senders

    def replies_pending(self) -> bool:
        """Whether a read reply may still send these bytes."""
        if self.readers:
            self.readers = _alive(self.readers)
        return bool(self.readers)

    def being_sent(self) -> bool:
        """Whether a read reply or an exposure may still send these bytes."""
        if self.exposed:
            self.exposed = _alive(self.exposed)
        return self.replies_pending() or bool(self.exposed)


def _alive(senders: Senders) -> Senders:
    return [r for r in senders if r() is not None]
