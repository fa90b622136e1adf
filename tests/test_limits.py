"""Bad input and allocation bombs through a real server: each gets its documented error, the
connection is kept (the stream is intact), another session's tensors are unchanged, and the
server's tensor-byte accounting returns to its baseline."""

from __future__ import annotations

import gc
import json
import pickle
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from websockets.exceptions import ConnectionClosed

import client
from protocol import Batch, DType, ErrorCode, Read, Sync, byte_view
from protocol.messages import Request
from protocol.ops import AnyOp, Arange, Binary, Eye, FromBuffer, Full, Reshape

from .raw import TOKEN, Raw, Witness
from .servers import ServerProcess, run_server

pytestmark = pytest.mark.wire

MIB = 2**20
LIMITS = (
    "--max-op-bytes",
    "1MiB",
    "--session-quota",
    "4MiB",
    "--memory-budget",
    "6MiB",
    "--max-message-size",
    "2MiB",
    "--max-ndim",
    "8",
)


@pytest.fixture(scope="module")
def limited() -> Iterator[ServerProcess]:
    with run_server("--token", TOKEN, *LIMITS) as proc:
        yield proc


@pytest.fixture
def witness(limited: ServerProcess) -> Iterator[Witness]:
    w = Witness(limited.url)
    yield w
    w.close()


@pytest.fixture
def raw(limited: ServerProcess) -> Iterator[Raw]:
    r = Raw(limited.url)
    yield r
    r.close()


@pytest.fixture
def dev(limited: ServerProcess) -> Iterator[client.RemoteDevice]:
    with client.RemoteDevice(limited.url, token=TOKEN) as d:
        yield d


def assert_kept(raw: Raw) -> None:
    """The connection still works: a sync is answered."""
    (reply,) = raw.request(Batch(requests=[Sync(request_id=99)]))
    assert reply.type == "sync_reply"


def frame(header: bytes, body: bytes = b"") -> bytes:
    return struct.pack("<I", len(header)) + header + body


def batch_json(**fields: Any) -> bytes:
    return json.dumps({"type": "batch", **fields}).encode()


# --- malformed messages: BAD_MESSAGE, connection kept ------------------------------------------

MALFORMED = {
    "empty": b"",
    "short length": b"\x01\x00",
    "zero header length": struct.pack("<I", 0),
    "header longer than message": struct.pack("<I", 500) + b"{}",
    "header over the limit": struct.pack("<I", 2**31) + b"{}",
    "not json": frame(b"{not json"),
    "json not an object": frame(b"[1, 2, 3]"),
    "unknown message type": frame(b'{"type": "shell", "cmd": "rm -rf /"}'),
    "extra bytes": frame(batch_json()) + b"trailing",
    "truncated buffers": frame(batch_json(buffers=[1000]), b"only ten b"),
    "unknown op kind": frame(batch_json(ops=[{"kind": "system", "out": 1, "cmd": "ls"}])),
    "einsum not in catalogue": frame(batch_json(ops=[{"kind": "einsum", "out": 1, "x": 0}])),
    "wrong type: shape": frame(
        batch_json(ops=[{"kind": "full", "out": 1, "shape": "ab", "dtype": "int8", "value": 0}])
    ),
    "wrong type: out": frame(
        batch_json(ops=[{"kind": "full", "out": 1.5, "shape": [], "dtype": "int8", "value": 0}])
    ),
    "negative id": frame(batch_json(frees=[-1])),
    "huge int: id": frame(batch_json(frees=[2**70])),
    "huge int: dim": frame(
        batch_json(ops=[{"kind": "full", "out": 1, "shape": [2**64], "dtype": "int8", "value": 0}])
    ),
    "huge int: axis": frame(
        batch_json(ops=[{"kind": "reduce", "op": "sum", "out": 2, "x": 1, "axis": [10**30]}])
    ),
    "huge int: index": frame(
        batch_json(ops=[{"kind": "getitem", "out": 2, "x": 1, "key": [10**30]}])
    ),
    "huge int: eye k": frame(
        batch_json(
            ops=[{"kind": "eye", "out": 1, "n_rows": 2, "n_cols": 2, "k": 10**30, "dtype": "int64"}]
        )
    ),
    # the Array API families' integer fields are int64 too
    "huge int: roll shift": frame(
        batch_json(ops=[{"kind": "roll", "out": 2, "x": 1, "shift": [10**30]}])
    ),
    "huge int: take axis": frame(
        batch_json(
            ops=[{"kind": "take", "op": "take", "out": 3, "x": 1, "indices": 2, "axis": -(10**30)}]
        )
    ),
    "huge int: setitem slice": frame(
        batch_json(
            ops=[{"kind": "setitem", "out": 1, "value": 2, "key": [{"start": 0, "stop": 2**63}]}]
        )
    ),
    "huge int: tile reps": frame(
        batch_json(ops=[{"kind": "tile", "out": 2, "x": 1, "reps": [2**64]}])
    ),
    "huge int: repeat": frame(
        batch_json(ops=[{"kind": "repeat", "out": 2, "x": 1, "repeats": 2**64}])
    ),
    "huge int: linspace num": frame(
        batch_json(
            ops=[
                {
                    "kind": "linspace",
                    "out": 2,
                    "start": 0.0,
                    "stop": 1.0,
                    "num": 2**63,
                    "dtype": "float64",
                }
            ]
        )
    ),
    "huge int: fft n": frame(
        batch_json(ops=[{"kind": "fft", "op": "fft", "out": 2, "x": 1, "n": [10**30]}])
    ),
    "huge int: matrix_power n": frame(
        batch_json(ops=[{"kind": "linalg", "op": "matrix_power", "out": 2, "xs": [1], "n": 10**30}])
    ),
    "repeated output id": frame(
        batch_json(ops=[{"kind": "nonzero", "out": 2, "more": [2], "x": 1}])
    ),
    "negative dim": frame(
        batch_json(ops=[{"kind": "full", "out": 1, "shape": [-1], "dtype": "int8", "value": 0}])
    ),
    "reshape to -2": frame(batch_json(ops=[{"kind": "reshape", "out": 2, "x": 1, "shape": [-2]}])),
    "hello again": frame(b'{"type": "hello", "protocol": 1}'),
}


@pytest.mark.parametrize("payload", MALFORMED.values(), ids=MALFORMED.keys())
def test_malformed_message_is_refused_and_connection_kept(
    raw: Raw, witness: Witness, payload: bytes
) -> None:
    raw.send_raw(payload)
    reply = raw.recv()
    assert reply.type == "dropped" and reply.error.code == ErrorCode.BAD_MESSAGE
    assert reply.message == 1  # the first message after the hello: none of it ran
    assert_kept(raw)
    witness.assert_intact()


def test_text_frame_is_refused_and_connection_kept(raw: Raw, witness: Witness) -> None:
    raw.ws.send('{"type": "batch"}')  # a text frame: not protocol v1 framing
    assert raw.recv().error.code == ErrorCode.BAD_MESSAGE
    assert_kept(raw)
    witness.assert_intact()


# --- dtypes: only the Array API standard's numeric dtypes exist ---------------------------------

BAD_DTYPES = [
    "object",
    "O",
    "|O",
    ">f8",
    "<f8",
    "float16",
    "V8",
    "|S4",
    "<U2",
    "str",
    "[('a', '<i4')]",
    "datetime64[s]",
    "timedelta64",
    "bfloat16",
    "int",
]


@pytest.mark.parametrize("dtype", BAD_DTYPES)
def test_non_standard_dtypes_are_refused_at_decode(raw: Raw, witness: Witness, dtype: str) -> None:
    op = {"kind": "from_buffer", "out": 1, "shape": [1], "dtype": dtype, "buffer": 0}
    raw.send_raw(frame(batch_json(ops=[op], buffers=[8]), b"\x00" * 8))
    reply = raw.recv()
    assert reply.error.code == ErrorCode.BAD_MESSAGE and "dtype" in reply.error.message
    for op_kind in ("full", "astype"):
        bad: dict[str, Any] = {
            "kind": op_kind,
            "out": 2,
            "x": 1,
            "shape": [],
            "dtype": dtype,
            "value": 0,
        }
        raw.send_raw(frame(batch_json(ops=[bad])))
        assert raw.recv().error.code == ErrorCode.BAD_MESSAGE
    assert_kept(raw)
    witness.assert_intact()


# --- pickle: never unpickled -----------------------------------------------------------------


class _Boom:
    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (Path.touch, (self.path,))  # unpickling it would create the file


def test_pickle_payloads_are_never_unpickled(raw: Raw, witness: Witness, tmp_path: Path) -> None:
    marker = tmp_path / "unpickled"
    payload = pickle.dumps(_Boom(marker))
    raw.send_raw(payload)  # as a whole message
    assert raw.recv().error.code == ErrorCode.BAD_MESSAGE
    raw.send_raw(frame(payload))  # as the header
    assert raw.recv().error.code == ErrorCode.BAD_MESSAGE
    op = FromBuffer(out=1, shape=(len(payload),), dtype="uint8", buffer=0)  # as tensor bytes
    (reply,) = raw.request(
        Batch(ops=[op], buffers=[len(payload)], requests=[Read(request_id=1, tensor=1)]),
        [memoryview(payload)],
    )
    assert reply.type == "read_reply" and reply.nbytes == len(payload)  # just bytes
    assert not marker.exists()
    raw.request(Batch(frees=[1], requests=[Sync(request_id=2)]))
    witness.assert_intact()


# --- ops the server refuses: the op fails, the session goes on --------------------------------


def read_error(raw: Raw, batch: Batch, buffers: list[memoryview] | None = None) -> Any:
    (reply,) = raw.request(batch, buffers or [])
    assert reply.type == "request_failed", reply
    return reply.error


def test_byte_length_not_matching_shape(raw: Raw, witness: Witness) -> None:
    op = FromBuffer(out=1, shape=(3,), dtype="float64", buffer=0)
    error = read_error(
        raw,
        Batch(ops=[op], buffers=[16], requests=[Read(request_id=1, tensor=1)]),
        [memoryview(b"\x00" * 16)],
    )
    assert error.code == ErrorCode.INVALID_OP and "needs 24" in error.message
    assert_kept(raw)
    witness.assert_intact()


def test_too_many_dimensions(raw: Raw, witness: Witness) -> None:
    over_cap = Full(out=1, shape=(1,) * 9, dtype="int8", value=0)  # --max-ndim 8
    error = read_error(raw, Batch(ops=[over_cap], requests=[Read(request_id=1, tensor=1)]))
    assert error.code == ErrorCode.LIMIT_EXCEEDED and "9 dimensions" in error.message
    over_numpy = Full(out=2, shape=(1,) * 65, dtype="int8", value=0)
    error = read_error(raw, Batch(ops=[over_numpy], requests=[Read(request_id=2, tensor=2)]))
    assert error.code == ErrorCode.INVALID_OP and "65 dimensions" in error.message
    assert_kept(raw)
    witness.assert_intact()


def test_fill_value_too_big_for_dtype(raw: Raw, witness: Witness) -> None:
    dtypes: list[tuple[int, DType]] = [(1, "float64"), (2, "int64"), (3, "complex128")]
    for out, dtype in dtypes:
        op = Full(out=out, shape=(2,), dtype=dtype, value=10**400)
        error = read_error(raw, Batch(ops=[op], requests=[Read(request_id=out, tensor=out)]))
        assert error.code == ErrorCode.INVALID_OP and "out of" in error.message
    assert_kept(raw)
    witness.assert_intact()


# --- allocation bombs: refused from inference, before numpy allocates --------------------------

N = 10**6
M = 2**17  # a float32 vector of M elements is 512 KiB: under the 1 MiB per-op cap


def _bombs(xp: client.Namespace) -> dict[str, Any]:
    col, row = xp.ones((M, 1), dtype=xp.float32), xp.ones((1, M), dtype=xp.float32)
    return {
        "zeros": lambda: xp.zeros((10**12,)),
        "full 2**62": lambda: xp.full((2**31, 2**31), 1, dtype=xp.int8),
        "broadcast": lambda: col + row,
        "outer": lambda: col * row,
        "where": lambda: xp.where(col > 0, col, row),
        "matmul": lambda: col @ row,
        "arange ints": lambda: xp.arange(0, 10**15),
        "arange floats": lambda: xp.arange(0.0, 1e15, 1.0),
        "eye": lambda: xp.eye(N, N),
        "astype widening": lambda: xp.astype(xp.ones(2**18, dtype=xp.float32), xp.complex128),
        # the Array API families: every output size is known from inference
        "tile": lambda: xp.tile(row, (2**20, 1)),
        "tile 2**62": lambda: xp.tile(xp.ones((1,), dtype=xp.int8), (2**31, 2**31)),
        "repeat": lambda: xp.repeat(row, 2**20),
        "repeat by a tensor": lambda: xp.repeat(xp.ones(4), xp.asarray(np.full(4, 2**40))),
        "linspace": lambda: xp.linspace(0.0, 1.0, 10**12),
        "concat": lambda: xp.concat([row, row, row], axis=0),
        "stack": lambda: xp.stack([row, row, row]),
        "broadcast_to": lambda: xp.broadcast_to(row, (2**20, M)),
        "linalg outer": lambda: xp.linalg.outer(xp.reshape(row, (M,)), xp.reshape(row, (M,))),
        "fft n": lambda: xp.fft.fft(xp.ones(4), n=2**40),
    }


BOMB_NAMES = [
    "zeros",
    "full 2**62",
    "broadcast",
    "outer",
    "where",
    "matmul",
    "arange ints",
    "arange floats",
    "eye",
    "astype widening",
    "tile",
    "tile 2**62",
    "repeat",
    "repeat by a tensor",
    "linspace",
    "concat",
    "stack",
    "broadcast_to",
    "linalg outer",
    "fft n",
]


@pytest.mark.parametrize("name", BOMB_NAMES)
def test_allocation_bomb_is_refused_before_numpy(
    dev: client.RemoteDevice, witness: Witness, name: str
) -> None:
    xp = client.namespace(dev)
    before = dev.stats()
    with pytest.raises(client.RemoteError) as info:  # a data-dependent shape raises at once
        _bombs(xp)[name]().numpy()
    assert info.value.code == ErrorCode.LIMIT_EXCEEDED
    assert "per-op limit is 1048576" in str(info.value)
    np.testing.assert_array_equal(xp.ones(3).numpy(), np.ones(3))  # the session goes on
    del info  # the traceback holds the array too
    gc.collect()
    after = dev.stats()  # nothing was reserved for the refused op, nothing leaks
    assert (after.tensor_bytes, after.tensors) == (before.tensor_bytes, before.tensors)
    witness.assert_intact()


def test_declared_buffer_bomb_is_refused_before_allocation(raw: Raw, witness: Witness) -> None:
    op = FromBuffer(out=1, shape=(10**15,), dtype="uint8", buffer=0)
    header = Batch(ops=[op], buffers=[10**15], requests=[Read(request_id=1, tensor=1)])
    raw.send_raw(frame(header.model_dump_json().encode(), b"only a few bytes"))
    reply = raw.recv()  # the batch's op fails, its read is answered
    assert reply.type == "request_failed" and reply.error.code == ErrorCode.LIMIT_EXCEEDED
    assert_kept(raw)
    witness.assert_intact()


def test_an_upload_over_the_message_limit_fails_alone(
    dev: client.RemoteDevice, witness: Witness
) -> None:
    """The welcome says the server's limit; an upload that cannot fit is refused before it is
    sent, with a MemoryError as numpy's for an array it cannot allocate, and the session goes
    on."""
    xp = client.namespace(dev)
    assert dev._conn.welcome.max_message_size == 2 * MIB
    kept = xp.asarray(np.arange(10.0))
    before = dev.stats()
    with pytest.raises(client.MessageTooLargeError, match="at most 2097152 bytes") as info:
        xp.asarray(np.zeros(3 * MIB // 8))  # 3 MiB > --max-message-size 2MiB
    assert isinstance(info.value, MemoryError)
    np.testing.assert_array_equal((kept + 1).numpy(), np.arange(1.0, 11.0))  # it goes on
    after = dev.stats()
    assert (after.tensors, after.tensor_bytes) == (before.tensors, before.tensor_bytes)
    del kept
    dev.sync()  # the free reaches the server
    witness.assert_intact()


def test_oversized_message_closes_with_1009(dev: client.RemoteDevice, witness: Witness) -> None:
    """A client that does not check the limit (one that predates the welcome's
    ``max_message_size``) sends the message; the server closes the connection."""
    xp = client.namespace(dev)
    dev._conn._batch.limit = None
    with pytest.raises(client.ConnectionLost) as info:  # 3 MiB > --max-message-size 2MiB
        xp.asarray(np.zeros(3 * MIB // 8))
        dev.sync()
    assert info.value.code == ErrorCode.LIMIT_EXCEEDED
    witness.assert_intact()


def test_oversized_raw_message_closes_connection(raw: Raw, witness: Witness) -> None:
    raw.send_raw(b"\x00" * (3 * MIB))
    with pytest.raises(ConnectionClosed) as info:
        raw.recv()
    assert info.value.rcvd is not None and info.value.rcvd.code == 1009
    witness.assert_intact()


# --- quota and budget: refuse new work when full, never drop stored tensors --------------------


def test_quota_exhaustion_and_recovery_after_frees(
    dev: client.RemoteDevice, witness: Witness
) -> None:
    xp = client.namespace(dev)
    held = [xp.full((MIB // 8,), float(i)) for i in range(4)]  # 4 MiB: the whole quota
    assert dev.stats().tensor_bytes == 4 * MIB
    extra = xp.ones(1)
    with pytest.raises(client.RemoteError) as info:
        extra.numpy()
    assert info.value.code == ErrorCode.QUOTA_EXCEEDED
    upload = xp.asarray(np.ones(1000))  # refused at decode, before the buffer is allocated
    with pytest.raises(client.RemoteError) as info:
        upload.numpy()
    assert info.value.code == ErrorCode.QUOTA_EXCEEDED
    for i, h in enumerate(held):  # stored tensors are never dropped (read whole: no new op)
        np.testing.assert_array_equal(h.numpy(), np.full(MIB // 8, float(i)))
    del held[0], extra, upload
    gc.collect()
    again = xp.full((MIB // 8,), 7.0)  # fits again after the free
    assert dev.stats().tensor_bytes == 4 * MIB
    assert again.numpy()[-1] == 7.0
    del held, again, h, info
    gc.collect()
    stats = dev.stats()
    assert (stats.tensor_bytes, stats.tensors, stats.failed) == (0, 0, 0)
    witness.assert_intact()


def test_server_budget_exhaustion_and_recovery(limited: ServerProcess, witness: Witness) -> None:
    with (
        client.RemoteDevice(limited.url, token=TOKEN) as big,
        client.RemoteDevice(limited.url, token=TOKEN) as other,
    ):
        xb, xo = client.namespace(big), client.namespace(other)
        hog = [xb.full((MIB // 8,), 1.0) for _ in range(4)]  # 4 MiB of the 6 MiB budget
        big.sync()
        mine = xo.full((MIB // 8,), 2.0)
        assert mine.numpy()[0] == 2.0  # 5 MiB + the witness: fits
        refused = xo.full((MIB // 8,), 3.0)
        with pytest.raises(client.RemoteError) as info:
            refused.numpy()
        assert info.value.code == ErrorCode.SERVER_MEMORY_EXHAUSTED
        del hog[0]
        gc.collect()
        big.sync()
        retried = xo.full((MIB // 8,), 3.0)
        assert retried.numpy()[0] == 3.0 and mine.numpy()[0] == 2.0
        assert all((h.numpy() == 1.0).all() for h in hog)
    witness.assert_intact()


def test_views_are_zero_copy_and_counted_once(dev: client.RemoteDevice, witness: Witness) -> None:
    xp = client.namespace(dev)
    a = xp.asarray(np.arange(64, dtype=np.int64))  # a view of the message: copied when stored
    b = xp.reshape(a, (8, 8))  # views of a: the same 512 bytes, counted once
    c = b[2:4, ::2]
    d = xp.astype(c, xp.int64)  # astype copies: 64 new bytes
    e = xp.permute_dims(b, (1, 0))
    assert dev.stats().tensor_bytes == 512 + 64
    np.testing.assert_array_equal(d.numpy(), np.arange(64).reshape(8, 8)[2:4, ::2])
    np.testing.assert_array_equal(e.numpy(), np.arange(64).reshape(8, 8).T)
    del a, b, e
    gc.collect()
    assert dev.stats().tensor_bytes == 512 + 64  # c still holds a's memory: still counted
    f = c + 1  # a new array
    assert dev.stats().tensor_bytes == 512 + 64 + 64
    del c, d, f
    gc.collect()
    stats = dev.stats()
    assert (stats.tensor_bytes, stats.tensors) == (0, 0)
    witness.assert_intact()


def test_limit_ops_named_in_errors(raw: Raw, witness: Witness) -> None:
    ops: list[AnyOp] = [
        Arange(out=1, start=0, stop=2**40, dtype="int64"),
        Eye(out=2, n_rows=2**20, n_cols=2**20, dtype="bool"),
        Full(out=3, shape=(4,), dtype="float32", value=1.0),
        Reshape(out=4, x=3, shape=(2, 2)),
        Binary(op="add", out=5, x1=1, x2=3),  # inherits arange's failure
    ]
    requests: list[Request] = [Read(request_id=i, tensor=i) for i in (1, 2, 4, 5)]
    replies = raw.request(Batch(ops=ops, requests=requests))
    assert [r.type for r in replies] == [
        "request_failed",
        "request_failed",
        "read_reply",
        "request_failed",
    ]
    assert replies[0].error.code == replies[1].error.code == ErrorCode.LIMIT_EXCEEDED
    assert replies[3].error.op == replies[0].error.op == "arange() -> #1"
    raw.request(Batch(frees=[1, 2, 3, 4, 5], requests=[Sync(request_id=9)]))
    assert_kept(raw)
    witness.assert_intact()


def test_too_many_buffers_in_one_message(raw: Raw, witness: Witness) -> None:
    from protocol.codec import MAX_BUFFERS

    header = Batch(
        ops=[Full(out=1, shape=(2,), dtype="int8", value=0)],
        buffers=[0] * (MAX_BUFFERS + 1),
        requests=[Read(request_id=1, tensor=1)],
    )
    raw.send_raw(frame(header.model_dump_json().encode()))
    reply = raw.recv()  # the batch's op fails with the limit; its read is answered
    assert reply.type == "request_failed" and reply.error.code == ErrorCode.LIMIT_EXCEEDED
    assert f"limit of {MAX_BUFFERS}" in reply.error.message
    assert_kept(raw)
    witness.assert_intact()


@pytest.mark.server
def test_buffers_per_message_is_configurable() -> None:
    with run_server("--token", TOKEN, "--max-buffers", "2") as proc:
        raw, witness = Raw(proc.url), Witness(proc.url)
        data = np.arange(3, dtype=np.uint8)
        ops: list[AnyOp] = [
            FromBuffer(out=i + 1, shape=(1,), dtype="uint8", buffer=i) for i in range(3)
        ]
        (reply,) = raw.request(
            Batch(ops=ops, buffers=[1, 1, 1], requests=[Read(request_id=1, tensor=1)]),
            [byte_view(data[i : i + 1]) for i in range(3)],
        )
        assert reply.type == "request_failed" and reply.error.code == ErrorCode.LIMIT_EXCEEDED
        assert "3 buffers exceed the limit of 2" in reply.error.message
        assert_kept(raw)
        witness.assert_intact()
        raw.close()
        witness.close()


# --- data-dependent outputs: checked after numpy ran, before they are stored ------------------


def test_data_dependent_output_over_the_cap_is_refused(
    dev: client.RemoteDevice, witness: Witness
) -> None:
    """nonzero of 64**3 ones: three int64 index arrays of 2 MiB each, over the 1 MiB cap (the
    mask's count is known before numpy runs). unique_counts of 2**17 distinct values: 2 MiB of
    outputs, only known once numpy ran. Both fail; nothing of them stays counted."""
    xp = client.namespace(dev)
    mask = xp.ones((64, 64, 64), dtype=xp.bool)  # 256 KiB
    values = xp.arange(0, 2**17, dtype=xp.int64)  # 1 MiB
    before = dev.stats()
    with pytest.raises(client.RemoteError) as info:
        xp.nonzero(mask)
    assert info.value.code == ErrorCode.LIMIT_EXCEEDED
    assert "per-op limit is 1048576" in str(info.value)
    with pytest.raises(client.RemoteError) as info:
        xp.unique_counts(values)
    assert info.value.code == ErrorCode.LIMIT_EXCEEDED and "unique_counts" in str(info.value)
    assert "per-op limit is 1048576" in str(info.value)
    small = xp.nonzero(mask[:2, :2, :2])  # the same op under the cap is stored
    assert [i.shape for i in small] == [(8,)] * 3
    np.testing.assert_array_equal(small[2].numpy(), [0, 1] * 4)
    del small, info
    gc.collect()
    after = dev.stats()
    assert (after.tensor_bytes, after.tensors) == (before.tensor_bytes, before.tensors)
    del mask, values
    gc.collect()
    assert dev.stats().tensor_bytes == 0  # also sends the frees
    witness.assert_intact()


def test_data_dependent_output_over_the_quota_is_refused(
    dev: client.RemoteDevice, witness: Witness
) -> None:
    xp = client.namespace(dev)
    held = [xp.full((MIB // 8,), 1.0) for _ in range(2)]  # 2 MiB of the 4 MiB quota
    values = xp.arange(0, 2**17, dtype=xp.int64)  # 1 MiB
    mask = xp.ones((2**17,), dtype=xp.bool)  # 128 KiB: 896 KiB left, a 1 MiB result won't fit
    assert dev.stats().tensor_bytes == 3 * MIB + MIB // 8
    with pytest.raises(client.RemoteError) as info:
        xp.nonzero(mask)
    assert info.value.code == ErrorCode.QUOTA_EXCEEDED and "nonzero" in str(info.value)
    with pytest.raises(client.RemoteError) as info:
        _ = values[mask]  # a boolean mask: data-dependent too
    assert info.value.code == ErrorCode.QUOTA_EXCEEDED and "getitem" in str(info.value)
    with pytest.raises(client.RemoteError) as info:  # its length is known only after numpy
        xp.unique_values(values)
    assert info.value.code == ErrorCode.QUOTA_EXCEEDED and "unique_values" in str(info.value)
    assert dev.stats().tensor_bytes == 3 * MIB + MIB // 8  # nothing of them stays counted
    assert values.numpy()[-1] == 2**17 - 1  # stored tensors are intact
    (few,) = xp.nonzero(mask[:8])
    np.testing.assert_array_equal(few.numpy(), np.arange(8))
    del held, values, mask, few, info
    gc.collect()
    stats = dev.stats()
    assert (stats.tensor_bytes, stats.tensors) == (0, 0)
    witness.assert_intact()


# --- in-place updates: written into the target's memory, which its views share -------------


def test_setitem_accounting_through_views_and_pending_reads(
    dev: client.RemoteDevice, witness: Witness
) -> None:
    xp = client.namespace(dev)
    a = xp.zeros((128,), dtype=xp.int64)  # 1 KiB
    a[0] = 1  # written in place, nothing new counted
    assert dev.stats().tensor_bytes == 1024  # (the value's scalar is freed with it)
    view = a[...]  # shares a's memory
    a[1] = 2  # the view sees it: still one base
    assert dev.stats().tensor_bytes == 1024
    np.testing.assert_array_equal(view.numpy()[:2], [1, 2])
    del view
    gc.collect()
    assert dev.stats().tensor_bytes == 1024
    first = a.numpy()  # a read reply held a's bytes: the next update moves them first
    a[2] = 3
    assert first[2] == 0 and a.numpy()[2] == 3
    assert dev.stats().tensor_bytes == 1024
    del a, first
    gc.collect()
    stats = dev.stats()
    assert (stats.tensor_bytes, stats.tensors) == (0, 0)
    witness.assert_intact()


def test_setitem_on_a_read_only_view_over_the_quota_fails_the_target(
    dev: client.RemoteDevice, witness: Witness
) -> None:
    """The copy that a read-only view is written into needs room: without it the update fails
    like any refused op, and the base is untouched."""
    xp = client.namespace(dev)
    a = xp.full((MIB // 8,), 1.0)
    held = [xp.full((MIB // 8,), 2.0) for _ in range(2)]
    view = xp.broadcast_to(a, (1, MIB // 8))  # read-only: an update must copy 1 MiB
    dev.sync()
    filler = xp.full((MIB // 8 - 16,), 3.0)  # the quota is (nearly) full
    view[0, 0] = 5.0
    with pytest.raises(client.RemoteError) as info:
        view.numpy()
    assert info.value.code == ErrorCode.QUOTA_EXCEEDED and "setitem" in str(info.value)
    assert a.numpy()[0] == 1.0  # the base is unchanged
    del a, held, view, filler, info
    gc.collect()
    stats = dev.stats()
    assert (stats.tensor_bytes, stats.tensors, stats.failed) == (0, 0, 0)
    witness.assert_intact()
