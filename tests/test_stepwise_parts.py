"""A header element larger than a piece (a registration of many declared tensors, an op of many
inputs) is validated in parts (``protocol/stepwise.py``): the result is what validating the
header whole gives, an invalid part is refused with the error naming it where it is in the
header, and no step validates more than about a piece, whatever one element holds."""

from __future__ import annotations

import gc
import time
from collections.abc import Iterator
from typing import Any

import pytest

import protocol.stepwise as stepwise
from protocol import CLIENT_ADAPTER, Batch, DecodeError
from protocol.codec import encode_header
from protocol.graphs import GraphDef, GraphTensor, RegisterGraph
from protocol.ops import Binary, Join, RunGraph, Unique


def _wide_graph(inputs: int, graph_id: int = 7) -> RegisterGraph:
    declared = [GraphTensor(name=f"x{i}", id=i, shape=(1,), dtype="float64") for i in range(inputs)]
    stack = Join(op="stack", out=inputs, xs=tuple(range(inputs)))
    out = GraphTensor(name="y", id=inputs, shape=(inputs, 1), dtype="float64")
    graph = GraphDef(inputs=declared, ops=[stack], outputs=[out])
    return RegisterGraph(graph_id=graph_id, graph=graph)


def _steps(header: bytes) -> tuple[Any, int]:
    """The message, and how many steps validating it took."""
    steps = stepwise.validate_stepwise(CLIENT_ADAPTER, header)
    count = 0
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value, count
        count += 1


@pytest.fixture
def small_pieces(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Pieces of 200 bytes and 4 elements: every element of a few hundred bytes is split."""
    monkeypatch.setattr(stepwise, "PIECE_BYTES", 200)
    monkeypatch.setattr(stepwise, "PIECE_ELEMENTS", 4)
    yield


BATCHES = [
    Batch(graphs=[_wide_graph(40), _wide_graph(3, 8)], ops=[Binary(op="add", out=1, x1=2, x2=3)]),
    Batch(ops=[Join(op="stack", out=1, xs=(2,) * 300), Join(op="concat", out=3, xs=(4, 5))]),
    Batch(ops=[RunGraph(graph=7, out=1, more=tuple(range(2, 200)), args=tuple(range(500, 900)))]),
    Batch(
        graphs=[
            RegisterGraph(
                graph_id=1,
                graph=GraphDef(
                    ops=[
                        Unique(op="unique_all", out=1, x=0, more=(2, 3, 4)),
                        RunGraph(graph=3, out=5, more=tuple(range(6, 90)), args=(0,) * 50),
                    ]
                ),
            )
        ]
    ),
]


@pytest.mark.parametrize("batch", BATCHES, ids=range(len(BATCHES)))
def test_parts_joined_are_the_header_validated_whole(small_pieces: None, batch: Batch) -> None:
    header = encode_header(batch)[4:]
    whole = CLIENT_ADAPTER.validate_json(header)
    parted, steps = _steps(header)
    assert parted == whole == batch
    assert steps > 10  # a large element: split


def _refused(header: bytes) -> str:
    with pytest.raises(DecodeError) as caught:
        _steps(header)
    with pytest.raises(Exception):  # noqa: B017 - and whole, pydantic's error
        CLIENT_ADAPTER.validate_json(header)
    return str(caught.value)


def test_a_bad_declared_tensor_deep_in_a_registration_is_named_where_it_is(
    small_pieces: None,
) -> None:
    header = encode_header(Batch(graphs=[_wide_graph(3, 1), _wide_graph(40)]))[4:]
    bad = header.replace(b'"name":"x33"', b'"name":"x\\u001b33"', 1)  # not printable
    assert bad != header
    assert "graphs.1.graph.inputs.33.name" in _refused(bad)


def test_a_bad_input_of_a_wide_op_is_named_where_it_is(small_pieces: None) -> None:
    ids = ",".join(str(i) for i in range(300))
    header = (
        '{"type":"batch","ops":[{"kind":"binary","op":"add","out":1,"x1":2,"x2":3},'
        '{"kind":"join","op":"stack","out":9,"xs":[' + ids.replace(",250,", ',"a",') + "]}]}"
    )
    assert "ops.1.join.xs.250" in _refused(header.encode())


def test_outputs_split_across_pieces_must_still_be_distinct(small_pieces: None) -> None:
    run = RunGraph(graph=7, out=1, more=tuple(range(2, 200)), args=(3,))
    header = encode_header(Batch(ops=[run]))[4:]
    bad = header.replace(b",199]", b",5]", 1)  # 5 twice, far apart
    assert bad != header
    assert "not distinct" in _refused(bad)


def test_a_missing_required_member_of_a_large_element_is_refused(small_pieces: None) -> None:
    ids = ",".join(str(i) for i in range(300))
    header = '{"type":"batch","ops":[{"kind":"join","op":"stack","xs":[' + ids + "]}]}"  # no out
    assert "ops.0.join.out" in _refused(header.encode())


def test_no_step_validates_much_more_than_a_piece() -> None:
    """A registration of 50,000 declared inputs (3 MiB, about 90 ms to validate whole) and a
    stack over a million inputs: each step a small part of the whole (CPU time of this thread,
    so that a loaded machine does not count)."""
    gc.disable()  # a collection's pause is not the validation's
    try:
        for batch in (
            Batch(graphs=[_wide_graph(50_000)]),
            Batch(ops=[Join(op="stack", out=10**12, xs=(3,) * 1_000_000)]),
        ):
            header = encode_header(batch)[4:]
            start = time.thread_time()
            whole = CLIENT_ADAPTER.validate_json(header)
            took = time.thread_time() - start
            steps = stepwise.validate_stepwise(CLIENT_ADAPTER, header)
            longest, parted = 0.0, None
            while parted is None:
                start = time.thread_time()
                try:
                    next(steps)
                except StopIteration as done:
                    parted = done.value
                longest = max(longest, time.thread_time() - start)
            assert parted == whole
            assert longest < took / 4, (longest, took)
    finally:
        gc.enable()
