"""In-place ops against the store's roots, in memory (no server): an update writes into its
target's memory, which its views share, as numpy does; a read reply not sent yet or an
exposure never sees it (the root moves, a copy costed as an op's work), a read-only view is
written into a copy, and every byte is counted once: the old memory a reply keeps is charged
before the move is made, until it dies."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from protocol import Batch, ErrorCode, Expose, Read, TensorMeta
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
from server.exposures import Exposures
from server.pulls import Transfers
from server.roots import copy_cost
from server.session import Reply, Session
from server.store import Failure, Stored, TensorStore


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
    assert session.store.nbytes == 32 + 8  # the old memory is no tensor's ...
    assert session.store.moved.nbytes == 32  # ... but the reply's, charged while it lives
    assert session.store.budget.used == 32 + 8 + 32
    moved = array(session, 1)
    run(session, update(1, 1, 3, 8))  # the reply still lives, but the new memory is not its
    assert array(session, 1) is moved and bytes(view) == bytes(32)
    del reply, view
    assert session.store.moved.nbytes == 0 and session.store.budget.used == 32 + 8 + 8
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
    assert entry.readers is not None and len(entry.readers) == 1


def test_an_in_place_matmul_costs_what_a_matmul_costs() -> None:
    """The cost decides whether an op may run on the event loop: ``x @= y`` is O(n**3)."""
    x = np.ones((256, 256))
    meta = TensorMeta((256, 256), "float64")
    binary = executor.cost(Binary(op="matmul", out=3, x1=1, x2=2), meta, [x, x])
    in_place = executor.cost(InPlaceBinary(op="matmul", out=1, x2=2), meta, [x, x])
    assert in_place == binary >= 256**3 // 8  # float64 BLAS: 1/8 of an element op a multiply-add


def test_the_memory_a_reply_keeps_is_charged_before_a_move() -> None:
    """A write that would move a root the session's quota cannot hold twice fails
    (``quota_exceeded``) before anything is copied, and the target keeps its value."""
    session = Session("s", 0, store=TensorStore(quota=3 * 8192))
    ((_, (view,)),) = run(session, [Full(out=1, shape=(1024,), dtype="int64", value=0)], [1])
    assert session.store.move_cost(1) == copy_cost(8192)
    run(session, update(1, 0, 2, 7))  # 8 KiB more fit: 16 KiB and 8 bytes
    assert session.store.moved.nbytes == 8192 and array(session, 1)[0] == 7
    ((_, (again,)),) = run(session, [], [1])
    run(session, update(1, 0, 3, 9))  # a third 8 KiB does not fit
    value = session.store.get(1)
    assert isinstance(value, Failure) and value.error.code == ErrorCode.QUOTA_EXCEEDED
    assert bytes(view) == bytes(8192) and np.frombuffer(again, np.int64)[0] == 7
    del view, again
    assert session.store.moved.nbytes == 0


def test_an_exposed_root_moves_charged_once() -> None:
    """An exposure charges its root's bytes already: the move that a write makes adds nothing
    to the charge, and the exposure still sends the value it was made with."""
    session = Session("s", 0)
    exposures = Exposures(ttl=60.0)
    run(session, [Full(out=1, shape=(1024,), dtype="int64", value=0)])
    run(session, [Reshape(out=2, x=1, shape=(32, 32))])
    capability = exposures.expose(session.store, 1, "0123456789abcdef")
    assert session.store.move_cost(2) == copy_cost(8192)  # its view's root is sent
    run(session, update(2, 0, 3, 7))  # the view's first row
    assert session.store.moved.nbytes == 0 and session.store.exposed == 8192
    assert session.store.budget.used == 8192 + 8 + 8192  # the tensor, the 7, the exposure
    assert array(session, 1)[:33].tolist() == [7] * 32 + [0]
    assert array(session, 2)[0].tolist() == [7] * 32
    exposure = exposures.claim(capability, "0123456789abcdef", TensorMeta((1024,), "int64"))
    assert bytes(exposure.sent) == bytes(8192)
    assert session.store.move_cost(2) == 0  # the new memory is sent by nothing


def test_exposes_are_made_as_the_batch_ends_and_answered_in_order() -> None:
    """A batch's exposes are made once its ops ran, off the event loop when one copies much
    (a small view's compact copy): ``step(inline=True)`` stops before it; each is answered in
    its place, two of one request id too."""
    session = Session("s", 0, transfers=Transfers(Exposures(ttl=60.0), "self"))
    run(session, [Full(out=1, shape=(1 << 16,), dtype="int64", value=3)])
    run(session, [GetItem(out=2, x=1, key=(SliceSpec(stop=1 << 14),))])  # 128 KiB of 512
    requests = [Expose(request_id=7, tensor=2, audience="0123456789abcdef")] * 2
    job = session.start(Batch(ops=[], requests=[*requests, Read(request_id=8, tensor=2)]), [])
    assert not session.step(job, inline=True)  # a copy of 128 KiB: over the inline cost
    assert session.step(job, inline=False)
    replies = [reply for reply, _ in session.finish(job)]
    assert [r.type for r in replies] == ["expose_reply", "expose_reply", "read_reply"]
    assert session.store.exposed == 2 * 8 * (1 << 14)  # two compact copies, charged
