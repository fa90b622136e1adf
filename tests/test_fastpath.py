"""The session's fast path (server/fastpath.py) leaves exactly what the general path leaves."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from protocol import Batch
from protocol.ops import AnyOp, Binary, BinaryScalar, Full, Unary
from protocol.scalars import ComplexValue
from server import session as session_module
from server.budget import MemoryBudget
from server.fastpath import FastPath
from server.limits import Limits
from server.session import Session
from server.store import Failure, Stored, TensorStore

SETUP: list[AnyOp] = [
    Full(out=1, shape=(16,), dtype="float32", value=1.5),
    Full(out=2, shape=(16,), dtype="int8", value=-2),
    Full(out=3, shape=(), dtype="float64", value=float("inf")),
    Full(out=4, shape=(3, 1), dtype="complex64", value=1.0),
    Full(out=5, shape=(4,), dtype="bool", value=True),
]
OPS: list[AnyOp] = [
    Binary(op="add", out=10, x1=1, x2=1),
    Binary(op="add", out=11, x1=10, x2=1),  # the cached checks, again
    Unary(op="real", out=12, x=1),  # the input itself: held, not fresh
    Unary(op="real", out=13, x=4),  # a view of a held root
    Binary(op="pow", out=14, x1=2, x2=2),  # numpy refuses negative integer powers
    Unary(op="exp", out=15, x=2),  # computed as float64, stored as float32
    Binary(op="floor_divide", out=16, x1=3, x2=1),  # 0-d with inf: a numpy scalar, fixed up
    Unary(op="negative", out=17, x=3),  # 0-d: numpy returns a scalar
    Binary(op="add", out=18, x1=4, x2=1),  # broadcasts to (3, 16)
    Binary(op="matmul", out=19, x1=1, x2=1),  # not on the fast path
    Binary(op="bitwise_and", out=20, x1=1, x2=1),  # refused: no loop for floats
    Binary(op="add", out=21, x1=14, x2=2),  # inherits the pow failure
    Binary(op="add", out=22, x1=99, x2=1),  # unknown input
    Binary(op="add", out=10, x1=1, x2=1),  # taken output id
    Binary(op="add", out=23, x1=18, x2=18),  # over the per-op cap
    Unary(op="sqrt", out=24, x=5),
    Binary(op="multiply", out=25, x1=1, x2=1),
    Binary(op="multiply", out=26, x1=25, x2=25),  # over the quota
]
SCALAR_OPS: list[AnyOp] = [  # a Python scalar in the op (run with room in the quota)
    Binary(op="pow", out=36, x1=2, x2=2),  # numpy refuses negative integer powers
    BinaryScalar(op="add", out=30, x=1, scalar=1.0),
    BinaryScalar(op="add", out=31, x=30, scalar=2.0),  # the cached checks, another value
    BinaryScalar(op="subtract", out=32, x=2, scalar=3, scalar_first=True),  # int8: 3 - x
    BinaryScalar(op="add", out=33, x=2, scalar=1000),  # does not fit int8: refused
    BinaryScalar(op="add", out=34, x=2, scalar=2**70),  # a bignum: refused
    BinaryScalar(op="multiply", out=35, x=2, scalar=0.5),  # int8 * float: float64 (cap)
    BinaryScalar(op="pow", out=43, x=2, scalar=-1),  # refused as an integer power, too
    BinaryScalar(op="divide", out=37, x=5, scalar=ComplexValue(real=0, imag=1)),
    BinaryScalar(op="floor_divide", out=38, x=3, scalar=2.0, scalar_first=True),  # 2 // inf
    BinaryScalar(op="matmul", out=39, x=1, scalar=2.0),  # refused: 0-dimensional
    BinaryScalar(op="add", out=40, x=99, scalar=1.0),  # unknown input
    BinaryScalar(op="add", out=41, x=36, scalar=1),  # inherits the pow failure
    BinaryScalar(op="less", out=42, x=1, scalar=True),
]


def _run(session: Session, ops: list[AnyOp]) -> list[Any]:
    job = session.start(Batch(ops=ops), [])
    while not session.step(job, inline=True):
        session.step(job, inline=False)
    return [reply.model_dump() for reply, _ in session.finish(job)]


def _state(
    fast: bool, monkeypatch: pytest.MonkeyPatch, ops: list[AnyOp] = OPS, quota: int = 400
) -> list[Any]:
    if not fast:
        monkeypatch.setattr(session_module, "FAST_OPS", frozenset())
    store = TensorStore(quota=quota, budget=MemoryBudget(2**20))
    session = Session("s", 0, store, Limits(max_op_bytes=300))
    _run(session, SETUP)
    replies = _run(session, ops)
    values: list[Any] = []
    for tensor_id in range(50):
        value = store.lookup(tensor_id)
        if isinstance(value, Failure):
            values.append(value.error.model_dump())
        elif isinstance(value, Stored):
            array = value.array
            values.append((value.meta, array.dtype.str, array.tobytes(), array.base is None))
        else:
            values.append(None)
    counts = (session.ops_run, dict(session.op_counts), dict(session.error_counts))
    accounting = (store.nbytes, store.reserved, store.failed, store.budget.used)
    return [replies, values, counts, accounting]


def test_fast_and_general_paths_leave_the_same_state(monkeypatch: pytest.MonkeyPatch) -> None:
    fast = _state(True, monkeypatch)
    general = _state(False, monkeypatch)
    assert fast == general
    replies, values, counts, accounting = fast
    assert values[13][3] is False  # a view was kept as a view
    assert values[14]["code"] == "execution_failed" and values[21] == values[14]
    assert values[20]["code"] == "invalid_op" and values[22]["code"] == "unknown_tensor"
    assert values[23]["code"] == "limit_exceeded" and values[26]["code"] == "quota_exceeded"
    assert [r["error"]["code"] for r in replies] == ["duplicate_tensor"]
    assert accounting[1] == 0 and accounting[0] == accounting[3]


def test_scalar_operands_leave_the_same_state_on_both_paths(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fast = _state(True, monkeypatch, SCALAR_OPS, quota=4000)
    general = _state(False, monkeypatch, SCALAR_OPS, quota=4000)
    assert fast == general
    replies, values, counts, accounting = fast
    assert values[31][0] == ((16,), "float32") and set(np.frombuffer(values[31][2], "<f4")) == {4.5}
    assert np.array_equal(np.frombuffer(values[32][2], "i1"), np.full(16, 5, "i1"))
    assert values[33]["code"] == values[34]["code"] == "invalid_op"  # does not fit: refused
    assert "out of bounds for int8" in values[33]["message"]
    assert values[35][0] == ((16,), "float64")
    assert values[36]["code"] == values[43]["code"] == "execution_failed" == values[41]["code"]
    assert values[37][0] == ((4,), "complex128") and values[38][0] == ((), "float64")
    assert values[39]["code"] == "invalid_op" and values[40]["code"] == "unknown_tensor"
    assert values[42][0] == ((16,), "bool")
    assert accounting[1] == 0 and accounting[0] == accounting[3]


def test_fast_path_results_equal_numpy_and_held_results_are_not_counted_twice() -> None:
    session = Session("s", 0)
    _run(session, SETUP + OPS[:3])
    value, x, same = (session.store.lookup(i) for i in (11, 1, 12))
    assert isinstance(value, Stored) and isinstance(x, Stored) and isinstance(same, Stored)
    assert np.array_equal(value.array, np.full(16, 4.5, dtype=np.float32))
    assert same.array is x.array  # real(x) of a float is x: stored once, counted once
    assert session.store.nbytes == (64 + 16 + 8 + 24 + 4) + 64 + 64  # setup, #10, #11


def test_scalar_operands_take_the_fast_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """Count what the fast path ran (ran, not handed to the general path) by op name."""
    calls: list[str] = []
    real = FastPath.run

    def run(self: FastPath, op: AnyOp, job: Any, inline: bool) -> bool | None:
        done = real(self, op, job, inline)
        if done and isinstance(op, BinaryScalar):
            calls.append(op.op)
        return done

    monkeypatch.setattr(FastPath, "run", run)
    session = Session("s", 0)
    ops = [
        BinaryScalar(op="multiply", out=50 + i, x=1 if i == 0 else 49 + i, scalar=0.5)
        for i in range(100)
    ]
    _run(session, [*SETUP, *ops])
    assert calls == ["multiply"] * 100
    result = session.store.lookup(149)
    assert isinstance(result, Stored) and result.array[0] == np.float32(1.5 * 0.5**100)


_EDGES = [0.0, -0.0, 1.5, -2.0, 3.0, float("inf"), float("nan"), 7.0]


@pytest.mark.parametrize(
    "dtype", ["bool", "int8", "uint8", "int64", "float32", "float64", "complex64"]
)
def test_a_prepared_call_computes_what_the_runner_computes(dtype: str) -> None:
    """``elementwise.one_call``, which the fast path caches per rule, against the runner, for
    every unary and binary op and scalar operands of each type, bit for bit."""
    from typing import get_args

    from protocol.ops.elementwise import BinaryName, UnaryName
    from server import executor
    from server.executor.elementwise import one_call

    with np.errstate(all="ignore"):
        x = np.array(_EDGES).astype(dtype)
        y = np.array(_EDGES[::-1]).astype(dtype)
    ops: list[tuple[AnyOp, list[np.ndarray]]] = []
    ops += [(Unary(op=name, out=2, x=0), [x]) for name in get_args(UnaryName)]
    ops += [(Binary(op=name, out=2, x1=0, x2=1), [x, y]) for name in get_args(BinaryName)]
    ops += [
        (BinaryScalar(op=name, out=2, x=0, scalar=s, scalar_first=first), [x])
        for name in get_args(BinaryName)
        for s in (True, 3, -2.5)
        for first in (False, True)
    ]
    prepared = 0
    for op, args in ops:
        try:
            call = one_call(op, [dtype] * len(args))
        except Exception:  # noqa: BLE001 - a dtype the op refuses: the runner refuses it too
            continue
        if call is None:
            continue
        prepared += 1
        with np.errstate(all="ignore"):
            try:
                want = np.asarray(executor.runner(op)(op, args, ()))
            except Exception as exc:  # noqa: BLE001 - the same error from the prepared call
                with pytest.raises(type(exc)):
                    call(op, args)
                continue
            got = np.asarray(call(op, args))
        assert got.dtype == want.dtype, op.describe()
        np.testing.assert_array_equal(got, want, strict=True, err_msg=op.describe())
        assert got.tobytes() == want.tobytes(), op.describe()  # -0.0 and NaN payloads too
    assert prepared > 10
