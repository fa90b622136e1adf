"""Data an attacker (or an unlucky client) cannot corrupt, through a real server: an upload's
bytes are the upload's, whatever ops of the same batch do to the tensors made from them."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from protocol import SERVER_ADAPTER, Batch, Read, byte_view, decode
from protocol.ops import FromBuffer, Full, SetItem
from protocol.ops.indexing import SliceSpec
from protocol.scalars import scalar_from_python

from .raw import TOKEN, Raw
from .servers import ServerProcess, run_server

# Over one 256 KiB websocket fragment, so the server receives the buffer into an array of its
# own and uploads are zero-copy views of it (a smaller message is copied, which hid the bug).
ELEMENTS = 2**16  # int64: 512 KiB


pytestmark = pytest.mark.wire


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    with run_server("--token", TOKEN) as proc:
        yield proc


@pytest.fixture
def raw(server: ServerProcess) -> Iterator[Raw]:
    r = Raw(server.url)
    yield r
    r.close()


def read_arrays(raw: Raw, batch: Batch, buffers: list[memoryview]) -> list[np.ndarray[Any, Any]]:
    """Send ``batch`` and return the arrays its reads answer, as int64."""
    raw.send(batch, buffers)
    arrays = []
    for _ in batch.requests:
        message, parts = decode(SERVER_ADAPTER, raw.ws.recv(timeout=30, decode=False))
        assert message.type == "read_reply", message
        arrays.append(np.frombuffer(bytes(parts[0]), dtype=np.int64))
    return arrays


def minus_999(out: int, value: int) -> list[Any]:
    """Ops that write -999 into ``out[0:10]`` in place (``value`` is a free id)."""
    return [
        Full(out=value, shape=(), dtype="int64", value=scalar_from_python(-999)),
        SetItem(out=out, key=(SliceSpec(start=0, stop=10),), value=value),
    ]


def test_setitem_does_not_reach_a_buffer_a_later_upload_reads(raw: Raw) -> None:
    uploaded = np.arange(ELEMENTS, dtype=np.int64)
    upload = FromBuffer(out=1, shape=(ELEMENTS,), dtype="int64", buffer=0)
    again = FromBuffer(out=3, shape=(ELEMENTS,), dtype="int64", buffer=0)
    batch = Batch(
        ops=[upload, *minus_999(1, 2), again],
        buffers=[uploaded.nbytes],
        requests=[Read(request_id=1, tensor=1), Read(request_id=2, tensor=3)],
    )
    first, second = read_arrays(raw, batch, [byte_view(uploaded)])
    np.testing.assert_array_equal(first[:10], -999)
    np.testing.assert_array_equal(first[10:], uploaded[10:])
    np.testing.assert_array_equal(second, uploaded)  # was -999 in its first 10 elements


def test_two_uploads_of_one_buffer_are_two_tensors(raw: Raw) -> None:
    # Both uploads made before the write: the write to one must not show in the other.
    uploaded = np.arange(ELEMENTS, dtype=np.int64)
    ops = [
        FromBuffer(out=1, shape=(ELEMENTS,), dtype="int64", buffer=0),
        FromBuffer(out=3, shape=(ELEMENTS,), dtype="int64", buffer=0),
        *minus_999(1, 2),
    ]
    batch = Batch(
        ops=ops,
        buffers=[uploaded.nbytes],
        requests=[Read(request_id=1, tensor=3), Read(request_id=2, tensor=1)],
    )
    untouched, written = read_arrays(raw, batch, [byte_view(uploaded)])
    np.testing.assert_array_equal(untouched, uploaded)
    np.testing.assert_array_equal(written[:10], -999)
