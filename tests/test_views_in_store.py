"""In-place ops against the store's roots, in memory (no server): an update writes into its
target's memory, which its views share, as numpy does; a read reply not sent yet never sees
it (the root moves), a read-only view is written into a copy, and every byte is counted once."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from protocol import Batch, Read, TensorMeta
from protocol.ops import (
    AnyOp,
    Binary,
    BroadcastTo,
    Full,
    GetItem,
    InPlaceBinary,
    PermuteDims,
    Reshape,
    SetItem,
    SliceSpec,
)
from server import executor
from server.session import Reply, Session
from server.store import Stored


def run(session: Session, ops: Sequence[AnyOp], reads: Sequence[int] = ()) -> list[Reply]:
    batch = Batch(ops=list(ops), requests=[Read(request_id=t, tensor=t) for t in reads])
    job = session.start(batch, [])
    assert session.step(job, inline=False)
    return session.finish(job)


def array(session: Session, tensor_id: int) -> np.ndarray[Any, Any]:
    value = session.store.get(tensor_id)
    assert isinstance(value, Stored)
    return value.array


def update(out: int, index: int, value_id: int, value: int) -> list[AnyOp]:
    return [
        Full(out=value_id, shape=(), dtype="int64", value=value),
        SetItem(out=out, key=(index,), value=value_id),
    ]


def test_unshared_target_is_written_in_place_and_not_counted_again() -> None:
    session = Session("s", 0)
    run(session, [Full(out=1, shape=(4,), dtype="int64", value=0)])
    before = array(session, 1)
    run(session, update(1, 0, 2, 7))
    assert array(session, 1) is before  # no copy
    assert before.tolist() == [7, 0, 0, 0]
    assert session.store.nbytes == 32 + 8
    assert session.store.reserved == 0


def test_pending_read_reply_never_sees_a_later_write() -> None:
    session = Session("s", 0)
    ((reply, (view,)),) = run(session, [Full(out=1, shape=(4,), dtype="int64", value=0)], [1])
    assert reply.type == "read_reply"
    run(session, update(1, 0, 2, 7))  # the reply's bytes are not sent yet
    assert bytes(view) == bytes(32)  # the root moved: the reply still holds the zeros
    assert array(session, 1).tolist() == [7, 0, 0, 0]
    assert session.store.nbytes == 32 + 8  # the old memory is no tensor's: not counted
    moved = array(session, 1)
    run(session, update(1, 1, 3, 8))  # the reply still lives, but the new memory is not its
    assert array(session, 1) is moved and bytes(view) == bytes(32)
    del reply, view
    run(session, [], [1])  # a second read, whose reply is dropped at once (sent)
    run(session, update(1, 2, 4, 9))
    assert array(session, 1) is moved  # nothing sends from it any more: written in place


def test_a_view_sees_writes_to_its_base_and_the_base_sees_writes_to_the_view() -> None:
    session = Session("s", 0)
    run(
        session,
        [
            Full(out=1, shape=(4,), dtype="int64", value=0),
            GetItem(out=2, x=1, key=(SliceSpec(start=1, stop=3),)),
            Reshape(out=3, x=1, shape=(2, 2)),
            PermuteDims(out=4, x=3, axes=(1, 0)),
        ],
    )
    assert session.store.nbytes == 32  # views: counted once
    run(session, update(2, 0, 5, 7))  # x[1:3][0] = 7
    run(session, update(4, 1, 6, 9))  # x.reshape(2, 2).T[1] = 9: x[1] and x[3]
    assert array(session, 1).tolist() == [0, 9, 0, 9]
    assert array(session, 2).tolist() == [9, 0]
    assert array(session, 3).tolist() == [[0, 9], [0, 9]]
    assert session.store.nbytes == 32 + 16 and session.store.reserved == 0
    for tensor_id in (1, 2, 3, 4, 5, 6):
        session.store.free(tensor_id)
    assert session.store.nbytes == 0 and session.store.budget.used == 0


def test_a_moved_root_keeps_its_views_one_family() -> None:
    """A write while a reply sends from the memory moves the root; every tensor on it moves
    to the same view of the new memory, so later writes still reach them all."""
    session = Session("s", 0)
    run(
        session,
        [
            Full(out=1, shape=(2, 3), dtype="float64", value=1.0),
            PermuteDims(out=2, x=1, axes=(1, 0)),
            GetItem(out=3, x=1, key=(1,)),
        ],
    )
    ((_, (view,)),) = run(session, [], [1])
    run(
        session,
        [Full(out=4, shape=(), dtype="float64", value=5.0), SetItem(out=3, key=(2,), value=4)],
    )
    assert bytes(view) == np.ones((2, 3)).tobytes()
    assert array(session, 1).tolist() == [[1, 1, 1], [1, 1, 5]]
    assert array(session, 2).tolist() == [[1, 1], [1, 1], [1, 5]]
    assert np.shares_memory(array(session, 1), array(session, 2))
    assert np.shares_memory(array(session, 1), array(session, 3))
    # through the transposed view: x[:, 0] = 3
    run(
        session,
        [Full(out=5, shape=(), dtype="float64", value=3.0), SetItem(out=2, key=(0,), value=5)],
    )
    assert array(session, 1).tolist() == [[3, 1, 1], [3, 1, 5]]
    assert session.store.nbytes == 48 + 8 + 8


def test_a_read_only_view_is_written_into_a_counted_copy() -> None:
    session = Session("s", 0)
    run(
        session,
        [Full(out=1, shape=(3,), dtype="int64", value=0), BroadcastTo(out=2, x=1, shape=(2, 3))],
    )
    assert session.store.nbytes == 24
    run(session, update(2, 0, 3, 7))  # b[0] = 7, on a read-only broadcast view
    assert array(session, 2).tolist() == [[7, 7, 7], [0, 0, 0]]
    assert array(session, 1).tolist() == [0, 0, 0]  # its base is untouched
    assert session.store.nbytes == 24 + 48 + 8
    for tensor_id in (1, 2, 3):
        session.store.free(tensor_id)
    assert session.store.nbytes == 0 and session.store.budget.used == 0


def test_replies_sent_are_forgotten_when_the_next_read_is_recorded() -> None:
    """A tensor read often and never written keeps no record of the replies already sent."""
    session = Session("s", 0)
    run(session, [Full(out=1, shape=(4,), dtype="int64", value=0)])
    for _ in range(100):
        run(session, [], [1])  # each reply is dropped (sent) at once
    (entry,) = session.store._roots.values()
    assert len(entry.readers) == 1


def test_an_in_place_matmul_costs_what_a_matmul_costs() -> None:
    """The cost decides whether an op may run on the event loop: ``x @= y`` is O(n**3)."""
    x = np.ones((256, 256))
    meta = TensorMeta((256, 256), "float64")
    binary = executor.cost(Binary(op="matmul", out=3, x1=1, x2=2), meta, [x, x])
    in_place = executor.cost(InPlaceBinary(op="matmul", out=1, x2=2), meta, [x, x])
    assert in_place == binary >= 256**3 // 8  # float64 BLAS: 1/8 of an element op a multiply-add
