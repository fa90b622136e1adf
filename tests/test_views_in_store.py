"""In-place ops against the store's reference-counted roots, in memory (no server): an update
writes into its target only when nothing else can see that memory, and is counted once."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from protocol import Batch, Read
from protocol.ops import AnyOp, Full, GetItem, SetItem
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
    return [Full(out=value_id, shape=(), dtype="int64", value=value),
            SetItem(out=out, key=(index,), value=value_id)]  # fmt: skip


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
    assert bytes(view) == bytes(32)  # copy-on-write: the reply still holds the zeros
    assert array(session, 1).tolist() == [7, 0, 0, 0]
    assert session.store.nbytes == 32 + 8  # the old root is no tensor's: not counted
    run(session, update(1, 1, 3, 8))  # the copy is not shared: in place again
    assert bytes(view) == bytes(32)


def test_view_sharing_the_memory_never_changes_and_the_copy_is_counted() -> None:
    session = Session("s", 0)
    run(session, [Full(out=1, shape=(4,), dtype="int64", value=0),
                  GetItem(out=2, x=1, key=("...",))])  # fmt: skip
    assert np.shares_memory(array(session, 1), array(session, 2))
    assert session.store.nbytes == 32  # a view: counted once
    run(session, update(1, 0, 3, 7))
    assert array(session, 2).tolist() == [0, 0, 0, 0]
    assert array(session, 1).tolist() == [7, 0, 0, 0]
    assert session.store.nbytes == 32 + 32 + 8  # the copy is counted
    session.store.free(2)
    assert session.store.nbytes == 32 + 8
    session.store.free(1)
    session.store.free(3)
    assert session.store.nbytes == 0 and session.store.budget.used == 0
