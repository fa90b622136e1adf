"""Property-based fuzzing (hypothesis) of the frame decoder and of op validation.

Every input is either accepted or refused with a documented error: ``DecodeError`` (or its
``MessageLimitError``) from the decoder; from a session, a failed op whose code is a documented
one — never ``internal``, never an exception escaping the session, and never a byte of memory
accounting that does not return to zero.
"""

from __future__ import annotations

import json
from typing import Any, get_args

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocol import CLIENT_ADAPTER, DTYPES, Batch, DecodeError, ErrorCode, MessageDecoder, decode
from protocol.ops import (
    FFT,
    Axes,
    BinaryName,
    Cumulative,
    Join,
    Linalg,
    ReduceName,
    Sort,
    Take,
    Triangle,
    UnaryName,
    Unique,
)
from server.budget import MemoryBudget
from server.roots import root_of
from server.session import Limits, Session
from server.store import Failure, Stored, TensorStore

FUZZ = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=12,
)


def framed(header: bytes, body: bytes) -> bytes:
    return len(header).to_bytes(4, "little") + header + body


def feed_all(chunks: list[bytes]) -> None:
    decoder = MessageDecoder(CLIENT_ADAPTER, max_header=2**16, max_buffer_bytes=2**16)
    for chunk in chunks:
        decoder.feed(chunk)
    decoder.finish()


@FUZZ
@given(st.lists(st.binary(max_size=64), max_size=4))
def test_decoder_random_bytes(chunks: list[bytes]) -> None:
    try:
        feed_all(chunks)
    except DecodeError:
        pass


@FUZZ
@given(json_values, st.binary(max_size=32), st.lists(st.integers(0, 80), max_size=3))
def test_decoder_random_json_headers(header: Any, body: bytes, cuts: list[int]) -> None:
    data = framed(json.dumps(header).encode(), body)
    pieces, last = [], 0
    for cut in sorted(c for c in cuts if c > last):
        pieces.append(data[last:cut])
        last = cut
    pieces.append(data[last:])
    try:
        feed_all(pieces)
    except DecodeError:
        pass


# --- op-shaped inputs, executed by a real Session --------------------------------------------

small_int = st.integers(-6, 6)
wild_int = st.one_of(small_int, st.integers(-(2**64), 2**64), st.sampled_from([2**62, 2**63 - 1]))
dims = st.lists(st.one_of(st.integers(0, 5), wild_int), max_size=4)
names = st.sampled_from([*get_args(UnaryName), *get_args(BinaryName), *get_args(ReduceName), "x"])
ids = st.integers(0, 7)
scalars = st.one_of(
    st.booleans(),
    wild_int,
    st.floats(),
    st.fixed_dictionaries({"real": st.floats(), "imag": st.floats()}),
)
index_items = st.one_of(
    small_int,
    st.none(),
    st.just("..."),
    st.fixed_dictionaries({}, optional={"start": small_int, "stop": small_int, "step": small_int}),
    st.fixed_dictionaries({"tensor": st.integers(0, 7)}),  # an integer or boolean index array
)
FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "shape": dims,
    "dtype": st.sampled_from([*DTYPES, "float16", "object"]),
    "op": names,
    "x": ids,
    "x1": ids,
    "x2": ids,
    "condition": ids,
    "value": scalars,
    "start": st.one_of(wild_int, st.floats()),
    "stop": st.one_of(wild_int, st.floats()),
    "step": st.one_of(small_int, st.floats()),
    "n_rows": st.integers(0, 300),
    "n_cols": st.integers(0, 300),
    "k": wild_int,
    "axis": st.one_of(st.none(), st.lists(small_int, max_size=3)),
    "axes": st.lists(small_int, max_size=4),
    "keepdims": st.booleans(),
    "key": st.lists(index_items, max_size=4),
    "buffer": st.integers(0, 2),
}
REQUIRED = {
    "from_buffer": ("shape", "dtype", "buffer"),
    "full": ("shape", "dtype", "value"),
    "arange": ("start", "stop", "dtype"),
    "eye": ("n_rows", "n_cols", "dtype"),
    "unary": ("op", "x"),
    "binary": ("op", "x1", "x2"),
    "where": ("condition", "x1", "x2"),
    "astype": ("x", "dtype"),
    "reduce": ("op", "x"),
    "reshape": ("x", "shape"),
    "permute_dims": ("x", "axes"),
    "getitem": ("x", "key"),
}
OPTIONAL = {"arange": ("step",), "eye": ("k",), "reduce": ("axis", "keepdims")}


def _op_of(kind: str) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries(
        {"kind": st.just(kind), "out": st.integers(8, 12)}
        | {name: FIELDS[name] for name in REQUIRED[kind]},
        optional={name: FIELDS[name] for name in OPTIONAL.get(kind, ())},
    )


op_dicts = st.one_of([_op_of(kind) for kind in REQUIRED])
INPUTS = {
    1: ((3, 4), "float64"),
    2: ((4,), "int8"),
    3: ((2, 1, 4), "bool"),
    4: ((), "complex64"),
    5: ((0, 3), "uint64"),
    6: ((4,), "int64"),
    7: ((3, 3), "float32"),
}
DOCUMENTED_OP_ERRORS = {
    ErrorCode.INVALID_OP,
    ErrorCode.LIMIT_EXCEEDED,
    ErrorCode.UNKNOWN_TENSOR,
    ErrorCode.DUPLICATE_TENSOR,
    ErrorCode.EXECUTION_FAILED,
    ErrorCode.QUOTA_EXCEEDED,
    ErrorCode.SERVER_MEMORY_EXHAUSTED,
}


def new_session() -> Session:
    store = TensorStore(quota=2**20, budget=MemoryBudget(2**21))
    session = Session("fuzz", 0, store, Limits(max_op_bytes=2**16, max_ndim=8))
    setup = [
        {"kind": "full", "out": i, "shape": list(s), "dtype": d, "value": i}
        for i, (s, d) in INPUTS.items()
    ]
    run(session, Batch.model_validate_json(json.dumps({"ops": setup})), [])
    return session


def run(session: Session, batch: Batch, buffers: list[Any]) -> None:
    job = session.start(batch, buffers)
    while not session.step(job, inline=True):
        session.step(job, inline=False)
    for reply, _ in session.finish(job):
        assert reply.type in ("error", "read_reply", "request_failed", "sync_reply")


@FUZZ
@given(st.lists(op_dicts, min_size=1, max_size=4), st.lists(st.binary(max_size=40), max_size=3))
def test_ops_are_run_or_refused_with_documented_errors(
    ops: list[dict[str, Any]], raw_buffers: list[bytes]
) -> None:
    header = json.dumps({"type": "batch", "ops": ops, "buffers": [len(b) for b in raw_buffers]})
    try:
        batch, buffers = decode(CLIENT_ADAPTER, framed(header.encode(), b"".join(raw_buffers)))
    except DecodeError:
        return
    assert isinstance(batch, Batch)
    session = new_session()
    store = session.store
    run(session, batch, buffers)
    for op in batch.ops:
        assert_settled(store.get(op.out) if op.out in store else None)
    assert_accounting_exact(session)


def assert_settled(value: Stored | Failure | None) -> None:
    """A failure carries a documented code; a stored array is what its meta says."""
    if isinstance(value, Failure):
        assert value.error.code in DOCUMENTED_OP_ERRORS, value.error
    elif isinstance(value, Stored):
        assert value.array.shape == value.meta.shape
        assert value.array.dtype == np.dtype(value.meta.dtype)


def assert_accounting_exact(session: Session) -> None:
    """Every held root counted once, nothing reserved, and all of it given back on free."""
    store = session.store
    roots = {
        id(r): r
        for i in range(ALL_IDS)
        if isinstance(v := _get(store, i), Stored)
        for r in [root_of(v.array)]
    }
    assert all(r.base is None for r in roots.values())  # nothing held that is not counted
    held = sum(r.nbytes for r in roots.values())
    assert store.nbytes == held == store.budget.used and store.reserved == 0
    run(session, Batch(frees=list(range(ALL_IDS))), [])
    assert (store.nbytes, store.budget.used, len(store)) == (0, 0, 0)


# --- the Array API families: several outputs, data-dependent shapes, in-place updates -------

ALL_IDS = 16  # inputs 0-7, outputs 8-15


def _names(model: Any) -> st.SearchStrategy[str]:
    return st.sampled_from([*get_args(model.model_fields["op"].annotation), "x"])


id_lists = st.lists(ids, max_size=3)
more = st.lists(st.integers(8, 15), max_size=3)
axis_or_none = st.one_of(st.none(), wild_int)
ARRAY_API: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {  # kind: (required, optional)
    "setitem": ({"out": ids, "key": st.lists(index_items, max_size=3), "value": ids}, {}),
    "binary_inplace": ({"op": st.sampled_from(get_args(BinaryName)), "out": ids, "x2": ids}, {}),
    "binary_scalar": (
        {"op": st.sampled_from(get_args(BinaryName)), "x": ids, "scalar": scalars},
        {"scalar_first": st.booleans()},
    ),
    "binary_inplace_scalar": (
        {"op": st.sampled_from(get_args(BinaryName)), "out": ids, "scalar": scalars},
        {},
    ),
    "take": ({"op": _names(Take), "x": ids, "indices": ids, "axis": wild_int}, {}),
    "join": ({"op": _names(Join), "xs": id_lists}, {"axis": axis_or_none}),
    "axes": ({"op": _names(Axes), "x": ids}, {"axis": st.lists(wild_int, max_size=3)}),
    "roll": (
        {"x": ids, "shift": st.lists(wild_int, max_size=3)},
        {"axis": st.lists(small_int, max_size=3)},
    ),
    "moveaxis": (
        {
            "x": ids,
            "source": st.lists(small_int, max_size=2),
            "destination": st.lists(small_int, max_size=2),
        },
        {},
    ),
    "broadcast_to": ({"x": ids, "shape": dims}, {}),
    "tile": ({"x": ids, "reps": dims}, {}),
    "repeat": ({"x": ids}, {"repeats": wild_int, "repeats_tensor": ids, "axis": axis_or_none}),
    "triangle": ({"op": _names(Triangle), "x": ids}, {"k": wild_int}),
    "linspace": (
        {"start": st.floats(), "stop": st.floats(), "num": wild_int, "dtype": FIELDS["dtype"]},
        {"endpoint": st.booleans()},
    ),
    "sort": ({"op": _names(Sort), "x": ids}, {"axis": wild_int, "descending": st.booleans()}),
    "cumulative": (
        {"op": _names(Cumulative), "x": ids},
        {"axis": axis_or_none, "include_initial": st.booleans()},
    ),
    "searchsorted": ({"x1": ids, "x2": ids}, {"side": st.sampled_from(["left", "right"])}),
    "nonzero": ({"x": ids}, {"more": more}),
    "unique": ({"op": _names(Unique), "x": ids}, {"more": more}),
    "linalg": (
        {"op": _names(Linalg), "xs": id_lists},
        {"more": more, "n": wild_int, "offset": wild_int, "keepdims": st.booleans()},
    ),
    "fft": (
        {"op": _names(FFT), "x": ids},
        {
            "n": st.lists(st.one_of(st.none(), wild_int), max_size=2),
            "axes": st.lists(small_int, max_size=2),
        },
    ),
}


def _array_api_op(kind: str) -> st.SearchStrategy[dict[str, Any]]:
    required, optional = ARRAY_API[kind]
    return st.fixed_dictionaries(
        {"kind": st.just(kind), "out": st.integers(8, 15)} | required, optional=optional
    )


@FUZZ
@given(st.lists(st.one_of([_array_api_op(kind) for kind in ARRAY_API]), min_size=1, max_size=4))
def test_array_api_ops_keep_accounting_exact(ops: list[dict[str, Any]]) -> None:
    """Multi-output, data-dependent and in-place ops under a 64 KiB per-op cap and a 1 MiB
    quota: each is run or refused with a documented code, and the bytes held are exactly the
    roots held (the copies that read-only views are written into included), with nothing left
    reserved."""
    try:
        batch = Batch.model_validate_json(json.dumps({"ops": ops}))
    except ValueError:
        return
    session = new_session()
    run(session, batch, [])
    for tensor_id in range(ALL_IDS):
        assert_settled(_get(session.store, tensor_id))
    assert_accounting_exact(session)


def _get(store: TensorStore, tensor_id: int) -> Stored | Failure | None:
    return store.get(tensor_id) if tensor_id in store else None
