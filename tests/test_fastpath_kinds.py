"""The fast path's keyed ops (``server/fastkeys.py``: matmul, reductions, where, take, views,
astype, joins, creation, the nn ops and in-place updates) leave exactly what the general path
leaves: values, which tensors share memory, failures and their messages, the answers, the
counts and every byte of the accounting, with refusals (per-op caps on bytes and work, quota,
budget), failed and unknown inputs, taken ids, numpy's own errors, read-only targets and
targets that a read reply still sends."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from protocol import Batch, InvalidOpError, Read, TensorMeta
from protocol.ops import (
    AdamDirection,
    AnyOp,
    Arange,
    ArrayIndex,
    AsType,
    Axes,
    BatchNorm,
    Binary,
    BinaryScalar,
    BroadcastTo,
    Conv,
    Full,
    GetItem,
    InPlaceBinary,
    InPlaceBinaryScalar,
    Join,
    MomentUpdate,
    PermuteDims,
    Pool,
    PoolBackward,
    Random,
    Reduce,
    Reshape,
    SetItem,
    SliceSpec,
    Softmax,
    Take,
    Triangle,
    Where,
)
from server import fastpath as fastpath_module
from server import session as session_module
from server.budget import MemoryBudget
from server.fastpath import FastPath
from server.limits import Limits
from server.roots import root_of
from server.session import Session
from server.store import Failure, Stored, TensorStore

ALL = SliceSpec()
SETUP: list[AnyOp] = [
    Full(out=1, shape=(4, 6), dtype="float32", value=1.5),
    Arange(out=2, start=0, stop=24, dtype="float32"),
    Reshape(out=3, x=2, shape=(4, 6)),  # a view of #2
    Full(out=4, shape=(6, 5), dtype="float32", value=0.25),
    Arange(out=5, start=0, stop=3, dtype="int64"),
    BinaryScalar(op="greater", out=6, x=3, scalar=10.0),
    Full(out=7, shape=(2,), dtype="uint64", value=5),  # a generator state
    Arange(out=8, start=0, stop=50, dtype="float32"),
    Reshape(out=9, x=8, shape=(2, 1, 5, 5)),
    Full(out=10, shape=(3, 1, 3, 3), dtype="float32", value=0.1),
    Full(out=11, shape=(3,), dtype="float32", value=0.5),
    Full(out=12, shape=(3,), dtype="float32", value=2.0),
    Full(out=13, shape=(3,), dtype="float32", value=1.5),
    Full(out=14, shape=(3,), dtype="float32", value=-1.0),
    Full(out=15, shape=(4,), dtype="int8", value=3),
    Full(out=17, shape=(6,), dtype="float32", value=2.0),
    BroadcastTo(out=16, x=17, shape=(4, 6)),  # a read-only view
    Full(out=18, shape=(4, 2), dtype="int64", value=1),
    Full(out=19, shape=(3,), dtype="int64", value=100),  # out of range for take
    Full(out=20, shape=(128, 128), dtype="float32", value=1.0),
    Full(out=21, shape=(4, 6), dtype="float32", value=3.0),
    Full(out=22, shape=(4,), dtype="int8", value=3),
    Full(out=23, shape=(4,), dtype="int8", value=3),
    Full(out=24, shape=(4,), dtype="float32", value=7.0),
    Full(out=25, shape=(), dtype="float32", value=0.01),  # a step term
    Full(out=26, shape=(4, 6), dtype="float32", value=0.25),  # a moment
    Full(out=27, shape=(4, 6), dtype="float32", value=0.5),  # another
    Full(out=28, shape=(4, 6), dtype="float32", value=0.75),  # and another
]
CONV = {"stride": (1, 1), "padding": ((1, 1), (1, 1)), "dilation": (1, 1), "groups": 1}
POOL = {"kernel": (2, 2), "stride": (2, 2), "padding": (0, 0), "count_include_pad": True}
OPS: list[AnyOp] = [
    Binary(op="matmul", out=30, x1=3, x2=4),
    Binary(op="matmul", out=31, x1=1, x2=4),  # the cached checks, again
    Binary(op="matmul", out=32, x1=4, x2=4),  # refused: shapes (twice: not cached)
    Binary(op="matmul", out=33, x1=4, x2=4),
    Binary(op="matmul", out=34, x1=20, x2=20),  # over the work cap
    Reduce(op="sum", out=35, x=3, axis=(1,), keepdims=True),
    Reduce(op="mean", out=36, x=3),  # 0-d: numpy returns a scalar
    Reduce(op="var", out=37, x=3, axis=(0,), correction=1.0),
    Reduce(op="argmax", out=38, x=3, axis=(1,)),
    Reduce(op="all", out=39, x=6),
    Where(out=40, condition=6, x1=3, x2=1),
    Take(op="take", out=41, x=3, indices=5, axis=0),
    Take(op="take_along_axis", out=42, x=3, indices=18, axis=1),
    Take(op="take", out=43, x=3, indices=19, axis=0),  # numpy's IndexError
    Reshape(out=44, x=3, shape=(6, 4)),  # a view of #2 again
    PermuteDims(out=45, x=44, axes=(1, 0)),
    Axes(op="expand_dims", out=46, x=3, axis=(0,)),
    Axes(op="squeeze", out=47, x=46, axis=(0,)),
    BroadcastTo(out=48, x=17, shape=(2, 4, 6)),
    BroadcastTo(out=49, x=17, shape=(200, 100, 6)),  # a view over the byte cap all the same
    GetItem(out=50, x=3, key=(SliceSpec(start=1, stop=3), 2)),
    GetItem(out=51, x=3, key=("...", None, ALL)),
    GetItem(out=52, x=3, key=(ArrayIndex(tensor=5),)),  # by a tensor: the general path
    AsType(out=53, x=3, dtype="float64"),
    AsType(out=54, x=3, dtype="float32"),  # a copy all the same
    Join(op="stack", out=55, xs=(1, 3), axis=0),
    Join(op="concat", out=56, xs=(17,) * 17, axis=0),  # wide: the general path
    Full(out=57, shape=(3,), dtype="int8", value=100),
    Full(out=58, shape=(3,), dtype="int8", value=1000),  # does not fit: refused
    Full(out=59, shape=(3,), dtype="float32", value=float("nan")),
    Arange(out=60, start=0, stop=5, dtype="int64"),
    Arange(out=61, start=0.5, stop=2, step=0.25, dtype="float64"),
    Triangle(op="triu", out=62, x=3, k=0),
    Softmax(op="softmax", out=63, x=3, axis=-1),
    Softmax(op="log_softmax", out=64, x=3, axis=-1),
    Conv(op="conv", out=65, x=9, w=10, **CONV),  # type: ignore[arg-type]
    Pool(op="max", out=66, x=65, **POOL),  # type: ignore[arg-type]
    PoolBackward(op="max", out=67, x=65, grad=66, **POOL),  # type: ignore[arg-type]
    BatchNorm(out=68, x=65, mean=11, var=12, weight=13, bias=14, eps=1e-5),
    BatchNorm(out=69, x=65, mean=11, var=12, eps=1e-5),
    Random(op="uniform", out=70, state=7, shape=(3, 4)),
    Random(op="normal", out=71, state=7, shape=(3, 4), dtype="float64"),
    InPlaceBinary(op="add", out=3, x2=1),  # written into #2's memory: #44, #45... see it
    InPlaceBinaryScalar(op="multiply", out=3, scalar=0.5),
    InPlaceBinaryScalar(op="add", out=15, scalar=3),
    InPlaceBinaryScalar(op="add", out=22, scalar=1000),  # does not fit int8: #22 fails
    InPlaceBinary(op="add", out=16, x2=1),  # a read-only view: written into a copy
    InPlaceBinary(op="divide", out=23, x2=23),  # int /= int: #23 fails
    SetItem(out=3, key=(SliceSpec(start=0, stop=2),), value=17),
    SetItem(out=44, key=(ArrayIndex(tensor=5),), value=24),  # by a tensor: the general path
    InPlaceBinary(op="subtract", out=21, x2=43),  # reads a failed tensor: #21 fails
    Binary(op="matmul", out=72, x1=999, x2=4),  # an unknown input
    Reduce(op="sum", out=73, x=43),  # inherits the take's failure
    Reshape(out=30, x=3, shape=(24,)),  # a taken output id
    Reshape(out=74, x=3, shape=(5, 5)),  # refused: 24 elements
    MomentUpdate(out=26, grad=1, decay=0.9, scale=0.1),  # in place
    MomentUpdate(out=26, grad=1, decay=0.999, scale=0.001, squared=True),
    MomentUpdate(out=16, grad=1, decay=0.9, scale=0.1),  # a read-only view: into a copy
    MomentUpdate(out=24, grad=4, decay=0.9, scale=0.1),  # refused: shapes
    MomentUpdate(out=27, grad=1, decay=float("nan"), scale=0.1),  # refused, its rule cached
    MomentUpdate(out=28, grad=28, decay=0.9, scale=0.1),  # its own id as gradient: refused
    AdamDirection(out=75, exp_avg=1, exp_avg_sq=17, step_size=25, eps_term=25),  # shapes
    AdamDirection(out=76, exp_avg=1, exp_avg_sq=26, step_size=25, eps_term=25),
    AdamDirection(out=77, exp_avg=1, exp_avg_sq=3, step_size=11, eps_term=25),  # not 0-d
    MomentUpdate(out=26, grad=43, decay=0.9, scale=0.1),  # a failed gradient: #26 fails
]
FILL = Full(out=80, shape=(8, 64), dtype="float32", value=0.0)
QUOTA_OPS: list[AnyOp] = [  # run with the quota or the budget nearly full after FILL
    FILL,
    Reshape(out=81, x=3, shape=(24,)),  # a view reserves its bytes first: refused
    Binary(op="matmul", out=82, x1=3, x2=4),
    InPlaceBinary(op="add", out=3, x2=1),  # in place: nothing to reserve
    MomentUpdate(out=26, grad=1, decay=0.9, scale=0.1),  # in place, its 96-byte scratch
    Reduce(op="sum", out=83, x=3),  # 4 bytes: fits
]
KEYED_KINDS = {
    "matmul",
    "sum",
    "mean",
    "var",
    "argmax",
    "all",
    "where",
    "take",
    "take_along_axis",
    "reshape",
    "permute_dims",
    "expand_dims",
    "squeeze",
    "broadcast_to",
    "getitem",
    "astype",
    "stack",
    "full",
    "arange",
    "triu",
    "softmax",
    "log_softmax",
    "conv",
    "max_pool",
    "max_pool_backward",
    "batch_norm",
    "random_uniform",
    "random_normal",
    "add",
    "multiply",
    "setitem",
    "moment_update",
    "adam_direction",
}


def _run(session: Session, ops: list[AnyOp], *requests: Any) -> list[Any]:
    job = session.start(Batch(ops=ops, requests=list(requests)), [])
    while not session.step(job, inline=True):
        session.step(job, inline=False)
    return session.finish(job)


def _disable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(session_module, "FAST_OPS", frozenset())
    monkeypatch.setattr(fastpath_module, "KEYS", {})


def _snapshot(session: Session, replies: list[Any], ids: int = 100) -> list[Any]:
    """Everything the session holds under ids below ``ids`` and counts, and every answer (a
    tensor by its value, meta, layout and the first id sharing its memory)."""
    store = session.store
    first_of_root: dict[int, int] = {}
    values: list[Any] = []
    for tensor_id in range(ids):
        value = store.lookup(tensor_id)
        if isinstance(value, Failure):
            values.append(value.error.model_dump())
        elif isinstance(value, Stored):
            a = value.array
            root = first_of_root.setdefault(id(root_of(a)), tensor_id)
            layout = (a.strides, a.flags.writeable, a.base is None, root)
            values.append((value.meta, a.dtype.str, a.tobytes(), layout))
        else:
            values.append(None)
    answers = [(reply.model_dump(), [bytes(d) for d in data]) for reply, data in replies]
    counts = (session.ops_run, dict(session.op_counts), dict(session.error_counts))
    budget = store.budget
    roots = sorted((r.users, r.array.nbytes) for r in store._roots.values())  # noqa: SLF001
    accounting = (store.nbytes, store.reserved, store.failed, store.records.nbytes, roots)
    shared = (budget.used, budget.overhead, budget.reservations)
    return [answers, values, counts, accounting, shared]


BUDGET = 1 << 22


def _session(quota: int, budget: int) -> Session:
    store = TensorStore(quota=quota, budget=MemoryBudget(budget))
    return Session("s", 0, store, Limits(max_op_bytes=256 << 10, max_op_cost=100_000))


def _state(
    fast: bool,
    monkeypatch: pytest.MonkeyPatch,
    ops: list[AnyOp],
    quota: int = 1 << 20,
    taken: int = 0,
) -> list[Any]:
    """``ops`` after SETUP, on the fast path or not, with ``taken`` bytes of the budget held
    by others (as other sessions' tensors hold them)."""
    with monkeypatch.context() as patch:
        if not fast:
            _disable(patch)
        session = _session(quota, BUDGET)
        replies = _run(session, SETUP)
        session.store.budget.reserve(taken)
        replies += _run(session, ops, Read(request_id=1, tensor=44))
        return _snapshot(session, replies)


def test_keyed_ops_leave_the_same_state_on_both_paths(monkeypatch: pytest.MonkeyPatch) -> None:
    fast = _state(True, monkeypatch, OPS)
    assert fast == _state(False, monkeypatch, OPS)
    answers, values, counts, accounting, _ = fast
    codes = {i: v["code"] for i, v in enumerate(values) if isinstance(v, dict)}
    assert codes == {
        21: "execution_failed",
        22: "invalid_op",
        23: "invalid_op",
        24: "invalid_op",  # moment_update refused
        27: "invalid_op",  # ... a NaN factor
        28: "invalid_op",  # ... its moment as its gradient
        26: "execution_failed",  # moment_update of a failed gradient
        32: "invalid_op",
        33: "invalid_op",
        34: "limit_exceeded",
        43: "execution_failed",
        49: "limit_exceeded",
        58: "invalid_op",
        72: "unknown_tensor",
        73: "execution_failed",
        74: "invalid_op",
        75: "invalid_op",  # adam_direction refused: shapes
        77: "invalid_op",  # ... and a term not 0-d
    }
    assert "out of bounds for int8" in values[22]["message"]
    assert [a[0]["error"]["code"] for a in answers if "error" in a[0]] == ["duplicate_tensor"]
    roots = {i: v[3][3] for i, v in enumerate(values) if isinstance(v, tuple)}
    assert roots[3] == roots[44] == roots[45] == roots[46] == roots[47] == roots[50] == 2
    assert roots[48] == 17 and roots[16] != 17  # written into a copy of the read-only view
    x = np.frombuffer(values[3][2], np.float32).reshape(4, 6)
    want = (np.arange(24, dtype=np.float32).reshape(4, 6) + np.float32(1.5)) * np.float32(0.5)
    want[:2] = 7.0  # 2.0 by #3's setitem, then 7.0 by #44's: #44 views the same memory
    assert np.array_equal(x, want)
    assert np.array_equal(np.frombuffer(values[45][2], np.float32), want.reshape(6, 4).T.ravel())
    assert values[36][0] == ((), "float32") and values[38][0] == ((4,), "int64")
    assert np.array_equal(np.frombuffer(values[15][2], np.int8), np.full(4, 6, np.int8))
    assert accounting[1] == 0


def test_the_keyed_ops_took_the_fast_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """The comparison above is not vacuous: these ops ran on the fast path."""
    ran: set[str] = set()
    real = FastPath.run_keyed

    def run_keyed(self: FastPath, op: AnyOp, job: Any, inline: bool) -> bool | None:
        done = real(self, op, job, inline)
        if done:
            ran.add(op.name())
        return done

    monkeypatch.setattr(FastPath, "run_keyed", run_keyed)
    _state(True, monkeypatch, OPS)
    assert ran == KEYED_KINDS


@pytest.mark.parametrize("full", ["quota", "budget"])
def test_refusals_by_quota_and_budget_are_the_same(
    monkeypatch: pytest.MonkeyPatch, full: str
) -> None:
    """With 40 bytes left after FILL: a view (which reserves its bytes first), a matmul and a
    moment update (its scratch) are refused, a 4-byte sum fits the quota."""
    probe = _session(1 << 20, BUDGET)
    _run(probe, [*SETUP, FILL])
    budget = probe.store.budget
    ceiling = budget.ceiling(0, probe.store.in_use())  # what a session holding that may fill
    room = (ceiling - budget.used - budget.overhead - 40, probe.store.nbytes + 40)
    quota, taken = (room[1], 0) if full == "quota" else (1 << 20, room[0])
    fast = _state(True, monkeypatch, QUOTA_OPS, quota, taken)
    assert fast == _state(False, monkeypatch, QUOTA_OPS, quota, taken)
    values = fast[1]
    code = "quota_exceeded" if full == "quota" else "server_memory_exhausted"
    assert isinstance(values[80], tuple)
    assert values[81]["code"] == values[82]["code"] == values[26]["code"] == code
    if full == "quota":
        assert isinstance(values[83], tuple) and isinstance(values[3], tuple)


def test_a_target_that_a_read_reply_still_sends_is_moved_on_both_paths(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An in-place write while a reply of its root is pending takes the general path (the
    root moves first); the reply keeps the old bytes, the views follow the tensor."""
    states = []
    for fast in (True, False):
        with monkeypatch.context() as patch:
            if not fast:
                _disable(patch)
            session = Session("s", 0)
            _run(session, SETUP + [Reshape(out=44, x=3, shape=(6, 4))])
            pending = _run(session, [], Read(request_id=1, tensor=3))
            before = bytes(pending[0][1][0])
            replies = _run(session, [InPlaceBinaryScalar(op="add", out=44, scalar=1.0)])
            assert bytes(pending[0][1][0]) == before  # the reply's bytes were not written
            states.append(_snapshot(session, replies))
    assert states[0] == states[1]
    values = states[0][1]
    assert values[3][3][3] == values[44][3][3] == 2  # one family still, in new memory
    want = np.arange(24, dtype=np.float32) + np.float32(1.0)
    assert np.array_equal(np.frombuffer(values[44][2], np.float32), want)


_EDGES = [0.0, -0.0, 1.5, -2.0, 3.0, float("inf"), float("nan"), 7.0]


@pytest.mark.parametrize("dtype", ["bool", "int8", "uint8", "int64", "float32", "complex64"])
@pytest.mark.parametrize("other", ["bool", "int8", "float32", "float64"])
def test_a_prepared_in_place_call_writes_what_the_runner_writes(dtype: str, other: str) -> None:
    """``elementwise.inplace_call``, which the fast path caches per rule, against
    ``binary_inplace`` in place, for every binary op, an array operand of ``other`` and scalar
    operands of each type, bit for bit (errors too), where the op's checks pass."""
    from typing import get_args

    from protocol.ops.elementwise import BinaryName
    from server.executor.elementwise import binary_inplace, inplace_call

    with np.errstate(all="ignore"):
        x = np.array(_EDGES).astype(dtype)
        y = np.array(_EDGES[::-1]).astype(other)
    meta = TensorMeta(x.shape, dtype)  # type: ignore[arg-type]
    other_meta = TensorMeta(y.shape, other)  # type: ignore[arg-type]
    ops: list[tuple[AnyOp, list[TensorMeta]]] = []
    ops += [(InPlaceBinary(op=n, out=0, x2=1), [meta, other_meta]) for n in get_args(BinaryName)]
    ops += [
        (InPlaceBinaryScalar(op=n, out=0, scalar=s), [meta])
        for n in get_args(BinaryName)
        for s in (True, 3, -2.5)
    ]
    prepared = 0
    for op, metas in ops:
        try:
            op.infer_all(*metas)
        except InvalidOpError:
            continue  # refused by its checks: never run
        call = inplace_call(op, [m.dtype for m in metas])
        if call is None:
            continue
        prepared += 1
        want, got = x.copy(), x.copy()
        with np.errstate(all="ignore"):
            try:
                binary_inplace(op, [want, y][: len(metas)], [], True)  # type: ignore[arg-type]
            except Exception as exc:  # noqa: BLE001 - the same error from the prepared call
                with pytest.raises(type(exc)):
                    call(op, [got, y][: len(metas)], [])
                continue
            assert call(op, [got, y][: len(metas)], []) is got  # written in place
        assert got.tobytes() == want.tobytes(), op.describe()  # -0.0 and NaN payloads too
    assert prepared > 10
