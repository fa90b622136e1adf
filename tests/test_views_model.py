"""A session's views against numpy's, as a state machine (hypothesis): bases, views of views,
writes, reads whose replies are held unsent, frees, in any order. After every step each tensor
equals its numpy twin (built by the same numpy calls, so numpy's own view-or-copy decisions
are the model), every held reply still holds the bytes it was read with, and the session's
bytes are exactly the memory its tensors use, counted once, and the memory that held replies
keep of a root moved before a write (charged until they are gone)."""

from __future__ import annotations

from typing import Any, cast

import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from protocol import Batch, Read
from protocol.ops import (
    AnyOp,
    BinaryName,
    BroadcastTo,
    Full,
    GetItem,
    IndexItem,
    InPlaceBinary,
    PermuteDims,
    Reshape,
    SetItem,
    SliceSpec,
)
from server.roots import root_of
from server.session import Reply, Session
from server.store import Stored


def _slice(length: int, data: st.DataObject) -> tuple[slice, SliceSpec]:
    start = data.draw(st.integers(0, length))
    stop = data.draw(st.integers(start, length))
    step = data.draw(st.integers(1, 3))
    return slice(start, stop, step), SliceSpec(start=start, stop=stop, step=step)


class Views(RuleBasedStateMachine):
    """Tensors by id on the server and their numpy twins, side by side."""

    @initialize()
    def start(self) -> None:
        self.session = Session("s", 0)
        self.twins: dict[int, np.ndarray[Any, Any]] = {}
        self.replies: list[tuple[memoryview, bytes]] = []  # held, unsent: (bytes, as read)
        self.next_id = 0

    def _run(
        self, ops: list[AnyOp], reads: tuple[int, ...] = (), frees: tuple[int, ...] = ()
    ) -> list[Reply]:
        batch = Batch(
            ops=ops, requests=[Read(request_id=t, tensor=t) for t in reads], frees=list(frees)
        )
        job = self.session.start(batch, [])
        assert self.session.step(job, inline=False)
        return self.session.finish(job)

    def _new_id(self) -> int:
        self.next_id += 1
        return self.next_id

    def _pick(self, data: st.DataObject) -> int:
        return data.draw(st.sampled_from(sorted(self.twins)))

    @rule(rows=st.integers(1, 4), cols=st.integers(1, 5), value=st.integers(-9, 9))
    def base(self, rows: int, cols: int, value: int) -> None:
        out = self._new_id()
        self._run([Full(out=out, shape=(rows, cols), dtype="float64", value=float(value))])
        self.twins[out] = np.full((rows, cols), float(value))

    @precondition(lambda self: self.twins)
    @rule(data=st.data(), how=st.sampled_from(["slice", "index", "reshape", "permute", "bcast"]))
    def view(self, data: st.DataObject, how: str) -> None:
        source = self._pick(data)
        twin, out = self.twins[source], self._new_id()
        op: AnyOp
        if how == "slice" and twin.ndim:
            local, spec = _slice(twin.shape[0], data)
            op, result = GetItem(out=out, x=source, key=(spec,)), twin[local]
        elif how == "index" and twin.ndim and twin.shape[0]:
            i = data.draw(st.integers(0, twin.shape[0] - 1))
            op, result = GetItem(out=out, x=source, key=(i,)), np.asarray(twin[i])
        elif how == "reshape":
            op, result = Reshape(out=out, x=source, shape=(-1,)), np.reshape(twin, (-1,))
        elif how == "permute":
            axes = tuple(reversed(range(twin.ndim)))
            op, result = PermuteDims(out=out, x=source, axes=axes), np.transpose(twin, axes)
        else:
            shape = (2, *twin.shape)
            op, result = BroadcastTo(out=out, x=source, shape=shape), np.broadcast_to(twin, shape)
        self._run([op])
        self.twins[out] = result

    @precondition(lambda self: self.twins)
    @rule(data=st.data(), value=st.integers(-99, 99), whole=st.booleans())
    def write(self, data: st.DataObject, value: int, whole: bool) -> None:
        target = self._pick(data)
        twin = self.twins[target]
        key: tuple[IndexItem, ...] = ("...",)
        local: Any = ...
        if not whole and twin.ndim:
            local, spec = _slice(twin.shape[0], data)
            key = (spec,)
        scalar = self._new_id()
        ops: list[AnyOp] = [
            Full(out=scalar, shape=(), dtype="float64", value=float(value)),
            SetItem(out=target, key=key, value=scalar),
        ]
        self._run(ops, frees=(scalar,))
        if not twin.flags.writeable:  # a read-only view is written into its own copy
            twin = self.twins[target] = twin.copy()
        twin[local] = value

    @precondition(lambda self: self.twins)
    @rule(data=st.data(), value=st.integers(-9, 9), how=st.sampled_from(["add", "multiply"]))
    def update(self, data: st.DataObject, value: int, how: str) -> None:
        """``x += v`` / ``x *= v``: one in-place op that writes ``x``'s memory."""
        target = self._pick(data)
        twin = self.twins[target]
        scalar = self._new_id()
        ops: list[AnyOp] = [
            Full(out=scalar, shape=(), dtype="float64", value=float(value)),
            InPlaceBinary(op=cast(BinaryName, how), out=target, x2=scalar),
        ]
        self._run(ops, frees=(scalar,))
        if not twin.flags.writeable:
            twin = self.twins[target] = twin.copy()
        getattr(np, how)(twin, value, out=twin)

    @precondition(lambda self: self.twins)
    @rule(data=st.data(), keep=st.booleans())
    def read(self, data: st.DataObject, keep: bool) -> None:
        tensor_id = self._pick(data)
        ((reply, (view,)),) = self._run([], reads=(tensor_id,))
        assert reply.type == "read_reply"
        expected = np.ascontiguousarray(self.twins[tensor_id]).tobytes()
        assert bytes(view) == expected
        if keep:  # not sent yet: later writes must not reach these bytes
            self.replies.append((view, expected))

    @precondition(lambda self: self.replies)
    @rule()
    def send(self) -> None:
        self.replies.pop(0)

    @precondition(lambda self: self.twins)
    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        tensor_id = self._pick(data)
        self._run([], frees=(tensor_id,))
        del self.twins[tensor_id]

    @invariant()
    def tensors_match_numpy(self) -> None:
        for tensor_id, twin in self.twins.items():
            value = self.session.store.get(tensor_id)
            assert isinstance(value, Stored)
            np.testing.assert_array_equal(value.array, twin, strict=True)

    @invariant()
    def held_replies_are_unchanged(self) -> None:
        for view, expected in self.replies:
            assert bytes(view) == expected

    @invariant()
    def memory_is_counted_once(self) -> None:
        store = self.session.store
        roots: dict[int, np.ndarray[Any, Any]] = {}
        for tensor_id in self.twins:
            value = store.get(tensor_id)
            assert isinstance(value, Stored)
            root = root_of(value.array)
            roots[id(root)] = root
        assert all(r.base is None for r in roots.values())
        assert store.nbytes == sum(r.nbytes for r in roots.values())
        assert store.budget.used == store.nbytes + store.moved.nbytes
        sent = [root_of(cast(np.ndarray[Any, Any], v.obj)) for v, _ in self.replies]
        kept = {id(r): r for r in sent}
        left = sum(r.nbytes for key, r in kept.items() if key not in roots)  # moved, or freed
        assert store.moved.nbytes <= left
        assert store.reserved == 0

    def teardown(self) -> None:
        if hasattr(self, "session"):
            self.replies.clear()  # sent: what they kept dies, and its charge with it
            self._run([], frees=tuple(self.twins))
            assert (self.session.store.nbytes, self.session.store.budget.used) == (0, 0)


Views.TestCase.settings = settings(
    max_examples=150,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_views_match_numpy = Views.TestCase
