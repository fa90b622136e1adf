"""The per-op fast paths made for the benchmarks give what the slow paths gave."""

from __future__ import annotations

import socket
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import client
from protocol import DTYPES, OpShapeError, TensorMeta, to_numpy
from protocol.ops import Binary, Linalg, Unary, broadcast_shapes
from server import executor
from server.executor import elementwise


@given(hnp.mutually_broadcastable_shapes(num_shapes=2, max_dims=4))
def test_broadcast_shapes_matches_numpy(shapes: Any) -> None:
    a, b = shapes.input_shapes
    assert broadcast_shapes(a, b) == np.broadcast_shapes(a, b)
    assert broadcast_shapes(a, a) == a


def test_broadcast_shapes_still_refuses_mismatches() -> None:
    with pytest.raises(OpShapeError):
        broadcast_shapes((2, 3), (3, 2))


@given(st.sampled_from(DTYPES))
def test_dtype_names_of_arrays_in_either_byte_order_notation(name: Any) -> None:
    dtype = to_numpy(name)
    for array in (np.zeros(2, dtype=dtype), np.zeros(2, dtype=dtype.newbyteorder("="))):
        assert elementwise._wire(array) == array.dtype.name == name


def test_cost_counts_elements_and_matmul_work() -> None:
    """Per element for element-wise ops; every multiply-add of a matmul (numpy's own loop for
    integers: at least one element operation each); n**3 for a factorization."""
    exp = Unary(op="exp", out=2, x=1)
    one = executor.cost(exp, TensorMeta((), "float64"), [np.zeros(())])
    assert executor.cost(exp, TensorMeta((5,), "float64"), [np.zeros(5)]) == 5 * one
    x, y = np.zeros((4, 800), np.int64), np.zeros((800, 2), np.int64)
    matmul = Binary(op="matmul", out=3, x1=1, x2=2)
    assert executor.cost(matmul, TensorMeta((4, 2), "int64"), [x, y]) >= 4 * 2 * 800
    inv = Linalg(op="inv", out=2, xs=(1,))
    assert executor.cost(inv, TensorMeta((200, 200), "float64"), [np.zeros((200, 200))]) >= 200**3


@pytest.mark.wire
def test_connection_has_nodelay_and_no_compression(dev: client.RemoteDevice) -> None:
    ws = dev._conn._ws
    assert ws.socket.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
    assert ws.response.status_code == 101
    assert "Sec-WebSocket-Extensions" not in ws.response.headers  # no permessage-deflate


def test_requests_only_batches_encode_as_pydantic_does() -> None:
    from protocol import Batch, Read, Stats, Sync, encode
    from protocol.codec import requests_only, to_frames
    from protocol.messages import Request

    cases: list[tuple[Request, ...]] = [
        (Read(request_id=3, tensor=2**40),),
        (Sync(request_id=1), Stats(request_id=2), Read(request_id=9, tensor=1)),
        (),
    ]
    for requests in cases:
        assert requests_only(requests) == to_frames(encode(Batch(requests=list(requests))))
