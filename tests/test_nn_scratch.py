"""The executor's convolutions and poolings in this process: taken a chunk of the batch at a
time they give the whole batch's numbers, and ``executor.scratch``, counted from shapes alone
before an op runs (the memory limits reserve it with the result: tests/test_limits_nn.py),
holds at least what numpy allocates beside the result while it runs, traced by tracemalloc."""

from __future__ import annotations

import tracemalloc
from typing import Any

import numpy as np
import pytest

from protocol import TensorMeta, from_numpy
from protocol.ops import AnyOp, Conv, Pool, PoolBackward
from server import executor
from server.executor import convolution

from .test_nn_ops import SPATIAL, TOL, WINDOW

Array = np.ndarray[Any, Any]
SLACK = 1 << 14  # the Python objects tracemalloc also counts (slices, tuples, frames)
TRANSPOSE = {"op": "conv_transpose", "stride": (2, 2), "padding": ((1, 1),) * 2}
CONVS: dict[str, tuple[Conv, tuple[int, ...], tuple[int, ...]]] = {
    "conv, padded": (Conv(out=0, x=1, w=2, **SPATIAL), (7, 4, 12, 11), (6, 2, 3, 2)),
    "conv, unpadded 1-D": (
        Conv(out=0, x=1, w=2, stride=(3,), padding=((0, 0),), dilation=(2,)),
        (9, 5, 40),
        (7, 5, 4),
    ),
    "weight gradient": (
        Conv(out=0, x=1, w=2, op="conv_weight_grad", kernel=(3, 2), **SPATIAL),
        (7, 4, 12, 11),
        (7, 6, 6, 11),
    ),
    "transpose": (
        Conv(out=0, x=1, w=2, op="conv_transpose", output_padding=(1, 0), **SPATIAL),
        (7, 6, 6, 10),
        (6, 2, 3, 2),
    ),
    "depthwise transpose": (
        Conv(out=0, x=1, w=2, **TRANSPOSE, dilation=(1, 1), groups=6),
        (7, 6, 9, 9),
        (6, 1, 3, 3),
    ),
}
POOLS = {
    "max, padded": Pool(out=0, op="max", x=1, **WINDOW),
    "avg, padding excluded": Pool(out=0, op="avg", x=1, **WINDOW, count_include_pad=False),
    "max, unpadded": Pool(out=0, op="max", x=1, kernel=(2, 2), stride=(2, 2), padding=(0, 0)),
}


def _run(op: AnyOp, *arrays: Array) -> Array:
    metas = op.infer_all(*(TensorMeta(a.shape, from_numpy(a.dtype)) for a in arrays))
    result: Array = executor.run(op, list(arrays), (), metas)[0]
    return result


def _shaped(*arrays: Array) -> list[Array]:
    """Arrays of ``arrays``' shapes and dtypes that hold no memory, as the session counts."""
    return [np.broadcast_to(np.zeros((), a.dtype), a.shape) for a in arrays]


@pytest.mark.parametrize("name", CONVS)
def test_the_batch_s_chunks_give_the_whole_batch_s_numbers(
    monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    """With a chunk of one sample, every op gives the numbers it gives on the whole batch
    at once (to rounding: the weight gradient sums the chunks), and its scratch is one
    sample's."""
    op, x_shape, w_shape = CONVS[name]
    rng = np.random.default_rng(5)
    x, w = rng.standard_normal(x_shape), rng.standard_normal(w_shape)
    whole = _run(op, x, w)
    meta = TensorMeta(whole.shape, "float64")
    one_sample = executor.scratch(op, meta, _shaped(x[:1], w))
    monkeypatch.setattr(convolution, "CHUNK_BYTES", 1)
    np.testing.assert_allclose(_run(op, x, w), whole, **TOL)
    if op.op != "conv_weight_grad":  # whose output gradient holds the batch too
        assert executor.scratch(op, meta, _shaped(x, w)) == one_sample


def _arrays(name: str) -> tuple[AnyOp, list[Array]]:
    rng = np.random.default_rng(7)
    if name in CONVS:
        op, x_shape, w_shape = CONVS[name]
        return op, [rng.standard_normal(x_shape), rng.standard_normal(w_shape)]
    pool = POOLS[name.removesuffix(", gradient")]
    x = rng.standard_normal((8, 6, 20, 21))
    if not name.endswith(", gradient"):
        return pool, [x]
    grad = rng.standard_normal(_run(pool, x).shape)
    fields = pool.model_dump(exclude={"kind", "out", "x"})
    return PoolBackward(out=0, x=1, grad=2, **fields), [x, grad]


@pytest.mark.parametrize("name", [*CONVS, *POOLS, *(f"{p}, gradient" for p in POOLS)])
def test_the_scratch_count_holds_what_numpy_allocates(name: str) -> None:
    """``executor.scratch``, counted from shapes alone, is at least the most numpy holds
    beside the result while the op runs, and within a few times of it (numpy's own buffers
    for strided operands aside)."""
    op, arrays = _arrays(name)
    meta = op.infer_all(*(TensorMeta(a.shape, from_numpy(a.dtype)) for a in arrays))[0]
    counted = executor.scratch(op, meta, _shaped(*arrays))
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        result = _run(op, *arrays)
        peak = tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()
    beside = peak - result.nbytes
    buffers = convolution.ufunc_buffers() * arrays[0].itemsize
    assert beside <= counted + SLACK, (beside, counted)
    assert counted <= 4 * beside + buffers, (beside, counted)
