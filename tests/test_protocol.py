"""Protocol-level tests: no sockets, no event loop."""

from __future__ import annotations

import json
import struct
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from pydantic import ValidationError

import protocol
from protocol import (
    CLIENT_ADAPTER,
    SERVER_ADAPTER,
    Batch,
    Claim,
    DecodeError,
    Describe,
    DescribeReply,
    Dropped,
    ErrorCode,
    ErrorInfo,
    Expose,
    ExposeReply,
    Hello,
    MessageDecoder,
    Read,
    ReadReply,
    Refused,
    RequestFailed,
    SessionError,
    Stats,
    StatsReply,
    Sync,
    SyncReply,
    TensorMeta,
    Welcome,
    byte_view,
    decode,
    encode,
)
from protocol.codec import to_frames
from protocol.errors import OpDTypeError, OpShapeError
from protocol.ops import (
    FFT,
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
    Cumulative,
    Eye,
    FromBuffer,
    Full,
    GetItem,
    InPlaceBinary,
    InPlaceBinaryScalar,
    Join,
    Linalg,
    Linspace,
    MomentUpdate,
    MoveAxis,
    Nonzero,
    PermuteDims,
    Pool,
    PoolBackward,
    Pull,
    Random,
    Reduce,
    Repeat,
    Reshape,
    Roll,
    RunGraph,
    RunSegment,
    SearchSorted,
    SetItem,
    SliceSpec,
    Softmax,
    Sort,
    Take,
    Tile,
    Triangle,
    Unary,
    Unique,
    Where,
    broadcast_shapes,
)
from protocol.ops.elementwise import matmul_shape
from protocol.scalars import ComplexValue
from protocol.schema import protocol_schema

ALL_OPS: list[AnyOp] = [
    FromBuffer(out=1, shape=(2, 3), dtype="float32", buffer=0),
    Full(out=2, shape=(), dtype="complex64", value=ComplexValue(real=1.0, imag=-2.5)),
    Full(out=3, shape=(4,), dtype="float64", value=float("inf")),
    Full(out=4, shape=(4,), dtype="uint64", value=2**64 - 1),
    Full(out=5, shape=(1,), dtype="bool", value=True),
    Arange(out=6, start=0.5, stop=3, step=0.25, dtype="float32"),
    Eye(out=7, n_rows=3, n_cols=4, k=-1, dtype="int8"),
    Unary(op="exp", out=8, x=1),
    Binary(op="matmul", out=9, x1=1, x2=7),
    InPlaceBinary(op="add", out=1, x2=3),
    BinaryScalar(op="subtract", out=40, x=1, scalar=float("-inf"), scalar_first=True),
    BinaryScalar(op="multiply", out=41, x=2, scalar=ComplexValue(real=0.5, imag=2.0)),
    InPlaceBinaryScalar(op="pow", out=4, scalar=2**64 - 1),
    Where(out=10, condition=5, x1=3, x2=4),
    AsType(out=11, x=2, dtype="float64"),
    Reduce(op="argmax", out=12, x=1, axis=(1,), keepdims=True),
    Reshape(out=13, x=1, shape=(3, -1)),
    PermuteDims(out=14, x=1, axes=(1, 0)),
    GetItem(out=15, x=1, key=(0, None, "...", SliceSpec(start=-1, stop=None, step=-2))),
    GetItem(out=16, x=1, key=(ArrayIndex(tensor=5), SliceSpec())),
    SetItem(out=1, key=(0, ArrayIndex(tensor=12)), value=10),
    Take(out=17, op="take_along_axis", x=1, indices=12, axis=-1),
    Join(out=18, op="concat", xs=(1, 1), axis=None),
    Axes(out=19, op="squeeze", x=1, axis=(0,)),
    Roll(out=20, x=1, shift=(1, -2), axis=(0, 1)),
    MoveAxis(out=21, x=1, source=(0,), destination=(-1,)),
    BroadcastTo(out=22, x=1, shape=(4, 2, 3)),
    Tile(out=23, x=1, reps=(2, 1)),
    Repeat(out=24, x=1, repeats_tensor=12, axis=0),
    Triangle(out=25, op="tril", x=1, k=-1),
    Linspace(out=26, start=0.0, stop=1.0, stop_imag=2.0, num=5, endpoint=False, dtype="complex64"),
    Sort(out=27, op="argsort", x=1, axis=0, descending=True),
    Cumulative(out=28, op="cumulative_prod", x=1, axis=1, include_initial=True),
    SearchSorted(out=29, x1=3, x2=1, side="right"),
    Nonzero(out=30, more=(31,), x=1),
    Unique(out=32, more=(33, 34, 35), op="unique_all", x=1),
    Linalg(out=36, more=(37, 38), op="svd", xs=(1,), full_matrices=False),
    Linalg(out=39, op="matrix_norm", xs=(1,), ord="nuc", keepdims=True),
    FFT(out=40, op="irfftn", x=2, n=(4, None), axes=(0, 1), norm="ortho"),
    RunGraph(out=41, more=(42,), graph=7, args=(1, 2)),
    RunSegment(out=43, graph=7, args=(1, 2)),
    Pull(out=43, source="ws://10.0.0.2:8765", capability="c" * 43, shape=(2, 3), dtype="int8"),
    Pull(out=44, source=None, capability="-" * 43, shape=(), dtype="bool"),
    Conv(
        out=45,
        op="conv_transpose",
        x=1,
        w=2,
        stride=(2, 1),
        padding=((1, 0), (2, 2)),
        dilation=(1, 3),
        groups=2,
        output_padding=(1, 0),
    ),
    Pool(out=46, op="avg", x=1, kernel=(3,), stride=(2,), padding=(1,), count_include_pad=False),
    PoolBackward(out=47, op="max", x=1, grad=2, kernel=(2, 2), stride=(2, 2), padding=(0, 0)),
    BatchNorm(out=48, x=1, mean=2, var=3, weight=None, bias=4, eps=1e-3),
    Softmax(out=49, op="log_softmax", x=1, axis=-2),
    Random(out=50, op="normal", state=1, shape=(3, 0), dtype="float64"),
    MomentUpdate(out=1, grad=2, decay=0.999, scale=0.0010000000000000009, squared=True),
    AdamDirection(out=51, exp_avg=1, exp_avg_sq=2, step_size=3, eps_term=4),
]
ERROR = ErrorInfo(code=ErrorCode.INVALID_OP, message="bad", op="matmul(#1, #2) -> #3")
CLIENT_MESSAGES: list[Any] = [
    Hello(protocol=1, device_index=3),
    Hello(protocol=1),
    Batch(),
    Batch(
        ops=ALL_OPS,
        frees=[1, 2**62],
        requests=[
            Read(request_id=1, tensor=9),
            Sync(request_id=2),
            Stats(request_id=3),
            Describe(request_id=4, tensor=30),
            Expose(request_id=5, tensor=9, audience="0a1b"),
            Claim(request_id=6, capability="_" * 43, claimant="ff", shape=(0, 2), dtype="uint8"),
        ],
        buffers=[24],
    ),
]
SERVER_MESSAGES: list[Any] = [
    Welcome(protocol=1, device_index=0, device_count=2, server_id="ab", session_id="cd"),
    Refused(protocol=1, error=ERROR),
    ReadReply(request_id=7, shape=(2, 3), dtype="float32", nbytes=24),
    SyncReply(request_id=1),
    StatsReply(request_id=2, tensors=3, tensor_bytes=4, failed=1),
    DescribeReply(request_id=4, shape=(7,), dtype="int64"),
    RequestFailed(request_id=3, error=ERROR),
    ExposeReply(request_id=5, capability="x" * 43, ttl=300.0),
    SessionError(error=ErrorInfo(code=ErrorCode.BAD_MESSAGE, message="x")),
    Dropped(message=3, error=ErrorInfo(code=ErrorCode.BAD_MESSAGE, message="y")),
]


def _buffers(message: Any) -> list[memoryview]:
    return [byte_view((np.arange(n) % 256).astype(np.uint8)) for n in message.buffer_sizes()]


def _wire(message: Any, buffers: list[memoryview]) -> bytes:
    return b"".join(bytes(c) for c in encode(message, buffers))


def _same(a: Any, b: Any) -> bool:  # NaN-tolerant model comparison
    return bool(a.model_dump_json() == b.model_dump_json())


@pytest.mark.parametrize("message", CLIENT_MESSAGES + SERVER_MESSAGES, ids=lambda m: m.type)
def test_every_message_round_trips(message: Any) -> None:
    adapter: Any = CLIENT_ADAPTER if message in CLIENT_MESSAGES else SERVER_ADAPTER
    buffers = _buffers(message)
    decoded, got = decode(adapter, _wire(message, buffers))
    assert type(decoded) is type(message) and _same(decoded, message)
    assert [bytes(b) for b in got] == [bytes(b) for b in buffers]


def test_every_op_family_is_covered() -> None:
    families = {type(op) for op in ALL_OPS}
    assert families == set(protocol.ops.AnyOp.__args__)


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 3000), max_size=4),
    cuts=st.lists(st.integers(0, 20000), max_size=6),
)
def test_fragmented_messages_decode_into_buffers(sizes: list[int], cuts: list[int]) -> None:
    ops: list[AnyOp] = [
        FromBuffer(out=i + 1, shape=(n,), dtype="uint8", buffer=i) for i, n in enumerate(sizes)
    ]
    batch = Batch(ops=ops, buffers=sizes)
    payloads = [np.random.default_rng(n).integers(0, 256, n, dtype=np.uint8) for n in sizes]
    data = _wire(batch, [byte_view(p) for p in payloads])
    header_end = 4 + struct.unpack_from("<I", data)[0]
    points = sorted({header_end, *(c for c in cuts if header_end < c < len(data))})
    decoder = MessageDecoder(CLIENT_ADAPTER)
    for start, stop in zip([0, *points], [*points, len(data)], strict=True):
        decoder.feed(data[start:stop])
    message, buffers = decoder.finish()
    assert message == batch
    for got, want in zip(buffers, payloads, strict=True):
        np.testing.assert_array_equal(np.frombuffer(got, np.uint8), want)


def test_to_frames_keeps_small_messages_whole_and_fragments_large_ones() -> None:
    small = encode(
        ReadReply(request_id=1, shape=(4,), dtype="uint8", nbytes=4), [memoryview(b"abcd")]
    )
    assert isinstance(to_frames(small), bytes)
    big = np.zeros(3 * 2**20 + 5, np.uint8)
    chunks = encode(
        ReadReply(request_id=1, shape=big.shape, dtype="uint8", nbytes=big.nbytes), [byte_view(big)]
    )
    frames = to_frames(chunks, fragment_size=2**20)
    assert isinstance(frames, list) and len(frames) == 5
    assert frames[0] is chunks[0] and sum(len(f) for f in frames[1:]) == big.nbytes


def _header(obj: Any) -> bytes:
    raw = json.dumps(obj).encode()
    return struct.pack("<I", len(raw)) + raw


@pytest.mark.parametrize(
    "data, match",
    [
        (b"", "shorter than"),
        (b"\x01\x00", "shorter than"),
        (struct.pack("<I", 0), "header length 0"),
        (struct.pack("<I", 2**31) + b"{}", "header length"),
        (struct.pack("<I", 100) + b"{}", "arrive whole"),
        (_header({"type": "nope"}), "invalid message"),
        (b"\x05\x00\x00\x00{oops", "invalid message"),
        (
            _header({"type": "batch", "ops": [{"kind": "unary", "op": "exp", "out": -1, "x": 1}]}),
            "out",
        ),
        (_header({"type": "batch", "ops": [{"kind": "pickle", "out": 1}]}), "invalid message"),
        (
            _header(
                {
                    "type": "batch",
                    "ops": [
                        {"kind": "full", "out": 1, "shape": [2], "dtype": "object", "value": 1}
                    ],
                }
            ),
            "dtype",
        ),
        (
            _header(
                {
                    "type": "batch",
                    "ops": [{"kind": "full", "out": 1, "shape": [2], "dtype": ">f8", "value": 1}],
                }
            ),
            "dtype",
        ),
        (
            _header(
                {
                    "type": "batch",
                    "ops": [{"kind": "full", "out": 1, "shape": [-2], "dtype": "int8", "value": 1}],
                }
            ),
            "shape",
        ),
        (_header({"type": "batch", "buffers": [8]}) + b"1234", "truncated"),
        (_header({"type": "batch", "buffers": [2]}) + b"1234", "more than"),
        (_header({"type": "batch", "extra": 1}), "extra"),
        (_header({"type": "hello", "protocol": "1"}), "protocol"),
    ],
)
def test_malformed_bytes_give_a_typed_error(data: bytes, match: str) -> None:
    with pytest.raises(DecodeError, match=match) as info:
        decode(CLIENT_ADAPTER, data)
    assert info.value.code is ErrorCode.BAD_MESSAGE


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200))
def test_random_bytes_decode_or_fail_typed(data: bytes) -> None:
    try:
        decode(CLIENT_ADAPTER, data)
    except DecodeError:
        pass


# --- inference agrees with numpy --------------------------------------------------------------

shapes = hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=4)


@settings(max_examples=100, deadline=None)
@given(st.lists(shapes, min_size=1, max_size=3))
def test_broadcast_shapes_match_numpy(items: list[tuple[int, ...]]) -> None:
    try:
        want = np.broadcast_shapes(*items)
    except ValueError:
        with pytest.raises(OpShapeError):
            broadcast_shapes(*items)
    else:
        assert broadcast_shapes(*items) == want


@settings(max_examples=100, deadline=None)
@given(shapes, shapes)
def test_matmul_shape_matches_numpy(a: tuple[int, ...], b: tuple[int, ...]) -> None:
    try:
        want = np.matmul(np.zeros(a), np.zeros(b)).shape
    except ValueError:
        with pytest.raises(OpShapeError):
            matmul_shape(a, b)
    else:
        assert matmul_shape(a, b) == want


@settings(max_examples=100, deadline=None)
@given(hnp.array_shapes(min_dims=1, max_dims=4, min_side=1, max_side=5), st.data())
def test_getitem_shape_matches_numpy(shape: tuple[int, ...], data: st.DataObject) -> None:
    key = data.draw(hnp.basic_indices(shape, allow_newaxis=True, allow_ellipsis=True))
    items = key if isinstance(key, tuple) else (key,)
    wire: Any = tuple(
        "..."
        if k is Ellipsis
        else SliceSpec(start=k.start, stop=k.stop, step=k.step)
        if isinstance(k, slice)
        else k
        for k in items
    )
    op = GetItem(out=2, x=1, key=wire)
    assert op.infer(TensorMeta(shape, "float64")).shape == np.zeros(shape)[key].shape


@settings(max_examples=150, deadline=None)
@given(shapes, st.lists(st.integers(-1, 6), max_size=4).map(tuple))
def test_reshape_rule_matches_numpy(shape: tuple[int, ...], target: tuple[int, ...]) -> None:
    op = Reshape(out=2, x=1, shape=target)
    try:
        want = np.zeros(shape).reshape(target).shape
    except ValueError:
        with pytest.raises(OpShapeError):
            op.infer(TensorMeta(shape, "float32"))
    else:
        assert op.infer(TensorMeta(shape, "float32")).shape == want


UNARY = list(protocol.ops.UnaryName.__args__)  # type: ignore[attr-defined]
BINARY = list(protocol.ops.BinaryName.__args__)  # type: ignore[attr-defined]


@pytest.mark.parametrize("dtype", protocol.DTYPES)
def test_inferred_dtypes_are_what_the_executor_produces(dtype: Any) -> None:
    """Every unary, reduction and astype, and every binary op and where against every dtype:
    inference == execution."""
    x = np.ones((2, 2), dtype=dtype)
    for name in UNARY:
        _check_against_executor(Unary(op=name, out=3, x=1), [x])
    for name in protocol.ops.ReduceName.__args__:  # type: ignore[attr-defined]
        _check_against_executor(Reduce(op=name, out=3, x=1, axis=(0,)), [x])
    _check_against_executor(AsType(out=3, x=1, dtype="complex64"), [x])
    for other in protocol.DTYPES:
        y = np.ones((2, 2), dtype=other)
        _check_against_executor(AsType(out=3, x=1, dtype=other), [x])
        _check_against_executor(Where(out=4, condition=1, x1=1, x2=2), [x > 0, x, y])
        for name in BINARY:
            _check_against_executor(Binary(op=name, out=3, x1=1, x2=2), [x, y])


def _check_against_executor(op: Any, args: list[Any]) -> None:
    from server import executor

    metas = [TensorMeta(a.shape, protocol.from_numpy(a.dtype)) for a in args]
    try:
        meta = op.infer(*metas)
    except OpDTypeError:
        return  # refused before numpy ever runs
    (result,) = executor.run(op, args, [], (meta,))  # raises InferenceMismatch if they differ
    assert result.dtype == protocol.to_numpy(meta.dtype)


def test_reduce_and_reshape_rules() -> None:
    x = TensorMeta((2, 0, 3), "int8")
    assert Reduce(op="sum", out=2, x=1, axis=(1,)).infer(x) == TensorMeta((2, 3), "int64")
    assert Reduce(op="mean", out=2, x=1, keepdims=True).infer(x) == TensorMeta((1, 1, 1), "float64")
    with pytest.raises(OpShapeError, match="no identity"):
        Reduce(op="max", out=2, x=1, axis=(1,)).infer(x)
    with pytest.raises(OpShapeError, match="out of bounds"):
        Reduce(op="sum", out=2, x=1, axis=(3,)).infer(x)
    with pytest.raises(OpShapeError):
        Reshape(out=2, x=1, shape=(-1, 0)).infer(x)
    with pytest.raises(OpShapeError):  # numpy refuses this too: -1 is ambiguous
        Reshape(out=2, x=1, shape=(0, -1)).infer(TensorMeta((2, 0), "bool"))
    with pytest.raises(OpShapeError, match="cannot reshape"):
        Reshape(out=2, x=1, shape=(4,)).infer(TensorMeta((3,), "bool"))


def test_device_specs_parse_and_refuse() -> None:
    assert str(protocol.parse_device_spec("ndarray")) == "ndarray"
    assert protocol.parse_device_spec("ndarray:4").count == 4  # type: ignore[union-attr]
    spec = protocol.parse_device_spec("capture:remote:ws://h:1")
    assert isinstance(spec, protocol.CaptureSpec) and isinstance(spec.inner, protocol.RemoteSpec)
    assert protocol.parse_device_spec("capture:") == protocol.CaptureSpec(inner=None)  # record-only
    assert protocol.parse_device_spec("ws://h:1") == protocol.RemoteSpec(url="ws://h:1")
    for bad in ["", "gpu", "ndarray:0", "ndarray:-1", "remote:http://x", "remote:", "ws://"]:
        with pytest.raises(protocol.DeviceSpecError, match="valid kinds"):
            protocol.parse_device_spec(bad)


def test_json_schema_export(tmp_path: Any) -> None:
    schema = protocol_schema()
    text = json.dumps(schema)
    for name in ["Hello", "Batch", "Welcome", "ReadReply", "Unary", "GetItem", "ErrorInfo"]:
        assert name in text
    from protocol.schema import main

    target = tmp_path / "schema.json"
    assert main([str(target)]) == 0
    assert json.loads(target.read_text()) == json.loads(json.dumps(schema, sort_keys=True))


def test_decoder_takes_buffer_bytes_written_in_place() -> None:
    from protocol import SERVER_ADAPTER, MessageDecoder, ReadReply
    from protocol.codec import encode_header

    values = np.arange(6, dtype=np.float32)
    decoder = MessageDecoder(SERVER_ADAPTER)
    assert decoder.writable() is None  # before the header
    decoder.feed(encode_header(ReadReply(request_id=1, shape=(6,), dtype="float32", nbytes=24)))
    data = values.tobytes()
    for start in (0, 10):  # two writes, as two recv_into calls would make them
        room = decoder.writable()
        assert room is not None and len(room) == 24 - start
        end = 10 if start == 0 else 24
        room[: end - start] = data[start:end]
        decoder.advance(end - start)
    assert decoder.writable() is None  # every buffer is full
    _, buffers = decoder.finish()
    np.testing.assert_array_equal(np.frombuffer(buffers[0], np.float32), values)


def test_outputs_of_one_op_are_distinct() -> None:
    with pytest.raises(ValidationError, match="not distinct"):
        Nonzero(out=8, more=(9, 8), x=1)
    with pytest.raises(ValidationError, match="not distinct"):
        Unique(op="unique_counts", out=8, more=(8,), x=1)
    assert Nonzero(out=8, more=(9,), x=1).outputs() == (8, 9)
