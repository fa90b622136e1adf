"""ONNX exports with a dynamic batch: a graph recorded at one batch size, exported once, runs
on onnxruntime at other batch sizes and gives what the server computes for the graph recorded
at each (``tests/onnx_graphs.py``), and for the MLP what numpy written out gives; the ops that
bake the recorded batch size in are refused, each by a DynamicBatchError naming the op and why.
A CNN and a transformer block are recorded from the namespace's functions on a record-only
``capture:`` device and compared with the same code run on numpy.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
import pytest

import client
from client.autodiff.extension import extension_of
from client.capture._onnx_batch import RULES
from client.capture.onnx import CONVERTERS, DynamicBatchError, OnnxExportError, to_onnx
from protocol.ops import (
    ArrayIndex,
    Axes,
    Binary,
    BinaryScalar,
    BroadcastTo,
    Cumulative,
    Full,
    GetItem,
    Join,
    MoveAxis,
    PermuteDims,
    Reduce,
    Repeat,
    Reshape,
    Roll,
    SetItem,
    SliceSpec,
    Softmax,
    Sort,
    Take,
    Tile,
    Triangle,
    Unary,
)

from .onnx_graphs import Builder, assert_same, floats, run_numpy, run_onnx

Make = Callable[[int], tuple[Builder, dict[str, int]]]


def _dims(value_info: onnx.ValueInfoProto) -> list[int | str]:
    return [d.dim_param or d.dim_value for d in value_info.type.tensor_type.shape.dim]


def export_at(make: Make, sizes: tuple[int, ...] = (4, 7, 1), **options: Any) -> onnx.ModelProto:
    """The graph ``make`` records for the first batch size, exported with a dynamic batch
    and run at each size against the server's runners on the graph recorded at that size."""
    b, outputs = make(sizes[0])
    model = to_onnx(b.graph(**outputs), b.arrays, dynamic_batch=options.pop("batch", True))
    for n in sizes:
        b, outputs = make(n)
        got = run_onnx(model, b.feeds)
        want = run_numpy(b.graph(**outputs), b.arrays, b.feeds)
        for name in outputs:
            assert_same(got[name], want[name], **options)
    return model


# --- graphs whose batch becomes dynamic -------------------------------------------------------


def _mlp(n: int) -> tuple[Builder, dict[str, int]]:
    weights = np.random.default_rng(3)  # the same weights at every batch size
    w1, b1 = weights.standard_normal((10, 16)), weights.standard_normal(16)
    w2 = weights.standard_normal((16, 4))
    b = Builder()
    x = b.input("x", floats(n, 10, dtype="float64"))
    c1, c2, c3 = (b.constant(a) for a in (w1, b1, w2))
    h = b.op(lambda o: Binary(op="matmul", out=o, x1=x, x2=c1))
    h = b.op(lambda o: Binary(op="add", out=o, x1=h, x2=c2))
    h = b.op(lambda o: BinaryScalar(op="maximum", out=o, x=h, scalar=0))
    z = b.op(lambda o: Binary(op="matmul", out=o, x1=h, x2=c3))
    log_probs = b.op(lambda o: Softmax(op="log_softmax", out=o, x=z, axis=-1))
    mean_loss = b.op(lambda o: Reduce(op="mean", out=o, x=log_probs))  # over the batch too
    return b, {"log_probs": log_probs, "mean": mean_loss}


def test_an_mlp_runs_at_any_batch_size() -> None:
    model = export_at(_mlp, scale=100)
    assert _dims(model.graph.input[0]) == ["batch", 10]
    assert [_dims(o) for o in model.graph.output] == [["batch", 4], []]
    weights = np.random.default_rng(3)
    w1, b1 = weights.standard_normal((10, 16)), weights.standard_normal(16)
    w2 = weights.standard_normal((16, 4))
    x = floats(13, 10, dtype="float64")  # numpy, written out
    z = np.maximum(x @ w1 + b1, 0) @ w2
    shifted = z - z.max(axis=-1, keepdims=True)
    expected = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    # the last subtraction cancels: its rounding is relative to the logits
    assert_same(run_onnx(model, {"x": x})["log_probs"], expected, scale=float(np.abs(z).max()))


def _shapes(n: int) -> tuple[Builder, dict[str, int]]:
    """Every shape op with the batch in it, where each leaves it whole."""
    b = Builder()
    x = b.input("x", floats(n, 3, 4))
    index = b.input("index", np.array([2, 0, 3, 3, 1], dtype=np.int64))
    flat = b.op(lambda o: Reshape(out=o, x=x, shape=(-1, 4)))  # (3n, 4): factor 3
    back = b.op(lambda o: Reshape(out=o, x=flat, shape=(n, 12)))
    picked = b.op(lambda o: Take(op="take", out=o, x=x, indices=index, axis=2))
    moved = b.op(lambda o: MoveAxis(out=o, x=picked, source=(0,), destination=(-1,)))
    turned = b.op(lambda o: PermuteDims(out=o, x=moved, axes=(2, 0, 1)))
    wide = b.op(lambda o: Axes(op="expand_dims", out=o, x=turned, axis=(0, 2)))
    column = b.op(lambda o: Axes(op="squeeze", out=o, x=wide, axis=(0,)))
    spread = b.op(lambda o: BroadcastTo(out=o, x=column, shape=(2, n, 5, 3, 5)))
    tiled = b.op(lambda o: Tile(out=o, x=x, reps=(2, 1, 1, 3)))
    repeated = b.op(lambda o: Repeat(out=o, x=x, repeats=2, axis=0))  # each row twice
    rolled = b.op(lambda o: Roll(out=o, x=x, shift=(1, -1), axis=(1, 2)))
    joined = b.op(lambda o: Join(op="concat", out=o, xs=(x, rolled), axis=-1))
    stacked = b.op(lambda o: Join(op="stack", out=o, xs=(x, x), axis=1))
    flipped = b.op(lambda o: Axes(op="flip", out=o, x=x))
    sorted_ = b.op(lambda o: Sort(op="sort", out=o, x=x, axis=0))
    sums = b.op(lambda o: Cumulative(op="cumulative_sum", out=o, x=x, axis=0))
    firsts = b.op(
        lambda o: Cumulative(op="cumulative_sum", out=o, x=x, axis=2, include_initial=True)
    )
    lower = b.op(lambda o: Triangle(op="tril", out=o, x=flat))
    outputs = dict(back=back, spread=spread, tiled=tiled, repeated=repeated, joined=joined)
    outputs |= dict(stacked=stacked, flipped=flipped, sorted=sorted_, sums=sums, firsts=firsts)
    return b, {**outputs, "flat": flat, "lower": lower}


def test_shape_ops_keep_the_batch_whole() -> None:
    model = export_at(_shapes)
    dims = {o.name: _dims(o) for o in model.graph.output}
    assert dims["flat"] == ["3*batch", 4] and dims["repeated"] == ["2*batch", 3, 4]
    assert dims["spread"] == [2, "batch", 5, 3, 5] and dims["tiled"] == [2, "batch", 3, 12]


def _indexing(n: int) -> tuple[Builder, dict[str, int]]:
    """Keys that take the whole batch (one reaching past its end, as ``x[:n]`` does), or
    one element of it; an embedding's lookup; take_along_axis with batched indices."""
    table = np.random.default_rng(4).standard_normal((6, 3)).astype(np.float32)
    b = Builder()
    x = b.input("x", floats(n, 5))
    tokens = b.input("tokens", np.random.default_rng(n).integers(0, 6, (n, 2)))
    column = b.input("column", np.random.default_rng(n).integers(0, 5, (n, 1)))
    c = b.constant(table)
    whole = b.op(lambda o: GetItem(out=o, x=x, key=(SliceSpec(stop=n), SliceSpec(start=1))))
    reached = b.op(lambda o: GetItem(out=o, x=x, key=(SliceSpec(stop=n + 5), None, 2)))
    backwards = b.op(lambda o: GetItem(out=o, x=x, key=(SliceSpec(step=-1), SliceSpec(step=2))))
    last = b.op(lambda o: GetItem(out=o, x=x, key=(-1,)))
    first = b.op(lambda o: GetItem(out=o, x=x, key=(0, SliceSpec(stop=2))))
    flat = b.op(lambda o: Reshape(out=o, x=tokens, shape=(-1,)))
    rows = b.op(lambda o: Take(op="take", out=o, x=c, indices=flat, axis=0))
    embedded = b.op(lambda o: Reshape(out=o, x=rows, shape=(n, 2, 3)))
    gathered = b.op(lambda o: GetItem(out=o, x=c, key=(ArrayIndex(tensor=tokens), SliceSpec())))
    along = b.op(lambda o: Take(op="take_along_axis", out=o, x=x, indices=column, axis=1))
    pairs = b.constant(np.array([[4, 0]]))  # broadcast to the batch: (1, 2) -> (n, 2)
    spread = b.op(lambda o: Take(op="take_along_axis", out=o, x=x, indices=pairs, axis=1))
    row = b.constant(table.reshape(-1)[None, :5])  # (1, 5) -> (n, 5) for batched indices
    looked = b.op(lambda o: Take(op="take_along_axis", out=o, x=row, indices=column, axis=1))
    outputs = dict(whole=whole, reached=reached, backwards=backwards, last=last, first=first)
    outputs |= dict(embedded=embedded, gathered=gathered, along=along)
    return b, {**outputs, "spread": spread, "looked": looked}


def test_keys_and_lookups_that_keep_the_batch_whole() -> None:
    export_at(_indexing, batch=["x", "tokens", "column"])


def _contractions(n: int) -> tuple[Builder, dict[str, int]]:
    """matmul and reductions over the batch: a result without it."""
    b = Builder()
    x = b.input("x", floats(n, 3, dtype="float64"))
    gram = b.op(lambda o: PermuteDims(out=o, x=x, axes=(1, 0)))
    gram = b.op(lambda o: Binary(op="matmul", out=o, x1=gram, x2=x))
    vector = b.op(lambda o: Reduce(op="sum", out=o, x=x, axis=(1,)))
    dot = b.op(lambda o: Binary(op="matmul", out=o, x1=vector, x2=vector))
    top = b.op(lambda o: Reduce(op="argmax", out=o, x=x))
    deepest = b.op(lambda o: Reduce(op="max", out=o, x=x, axis=(0,), keepdims=True))
    return b, dict(gram=gram, dot=dot, top=top, deepest=deepest)


def test_contractions_over_the_batch() -> None:
    model = export_at(_contractions, scale=10)
    assert [_dims(o) for o in model.graph.output] == [[3, 3], [], [], [1, 3]]


def _cnn(xp: Any, x: Any, p: dict[str, Any]) -> Any:
    """A CNN from the extension's functions, in eval mode: no dropout, batch norm with its
    running statistics."""
    ext = extension_of(xp)
    same = {"stride": (1, 1), "padding": ((1, 1), (1, 1)), "dilation": (1, 1)}
    h = ext.conv(x, p["w1"], **same, groups=1) + xp.reshape(p["b1"], (4, 1, 1))
    h = ext.pool("max", xp.maximum(h, 0.0), kernel=(2, 2), stride=(2, 2), padding=(0, 0))
    h = ext.conv(h, p["w2"], **same, groups=2)
    h = ext.batch_norm(h, p["mean"], p["var"], p["gamma"], p["beta"], eps=1e-5)
    h = ext.conv_transpose(h, p["wt"], **same, groups=1, output_padding=(0, 0))
    h = ext.pool("avg", h, kernel=(2, 2), stride=(2, 2), padding=(1, 1), count_include_pad=False)
    logits = xp.reshape(h, (h.shape[0], -1)) @ p["w3"]
    return ext.softmax("log_softmax", logits, axis=-1)


def _cnn_parameters() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    shapes = {"w1": (4, 1, 3, 3), "b1": (4,), "w2": (6, 2, 3, 3), "wt": (6, 3, 3, 3)}
    shapes |= {"mean": (6,), "gamma": (6,), "beta": (6,), "w3": (12, 5)}
    p = {k: (rng.standard_normal(s) * 0.4).astype(np.float32) for k, s in shapes.items()}
    p["var"] = rng.uniform(0.5, 2, 6).astype(np.float32)
    return p


def _recorded(forward: Callable[..., Any], inputs: dict[str, np.ndarray]) -> Any:
    """``forward``'s graph on a record-only capture: device, the parameters its constants."""
    dev = client.open_device("capture:")
    xp = client.namespace(dev)
    with dev.capture() as cap:
        declared = [cap.input(k, shape=v.shape, dtype=v.dtype) for k, v in inputs.items()]
        cap.output("y", forward(xp, *declared))
    return cap.graph


def test_a_cnn_runs_at_any_batch_size() -> None:
    p = _cnn_parameters()
    images = {"x": floats(4, 1, 6, 6)}
    graph = _recorded(lambda xp, x: _cnn(xp, x, {k: xp.asarray(v) for k, v in p.items()}), images)
    model = graph.to_onnx(dynamic_batch=True)
    ops = {node.op_type for node in model.graph.node}
    assert {"Conv", "ConvTranspose", "MaxPool", "AveragePool", "BatchNormalization"} <= ops
    for n in (4, 9, 1):
        x = floats(n, 1, 6, 6)
        want = _cnn(np, x, p)
        got = run_onnx(model, {"x": x})["y"]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def _transformer_block(xp: Any, tokens: Any, p: dict[str, Any]) -> Any:
    """Token and position embeddings, causal self-attention over two heads, a residual and a
    layer norm, then the logits' softmax, written as client.nn writes them."""
    ext = extension_of(xp)
    n, length = tokens.shape
    heads, width = 2, p["embed"].shape[1]
    size = width // heads
    rows = xp.take(p["embed"], xp.reshape(tokens, (-1,)), axis=0)
    h = xp.reshape(rows, (n, length, width)) + p["position"][:length]

    def split(w: Any) -> Any:  # (n, T, E) -> (n, heads, T, size)
        return xp.permute_dims(xp.reshape(h @ w, (n, length, heads, size)), (0, 2, 1, 3))

    q, k, v = split(p["wq"]), split(p["wk"]), split(p["wv"])
    scores = q @ xp.permute_dims(k, (0, 1, 3, 2)) * (1 / math.sqrt(size)) + p["causal"]
    attended = ext.softmax("softmax", scores, axis=-1) @ v
    h = h + xp.reshape(xp.permute_dims(attended, (0, 2, 1, 3)), (n, length, width))
    centred = h - xp.mean(h, axis=-1, keepdims=True)
    h = centred / xp.sqrt(xp.var(h, axis=-1, keepdims=True) + 1e-5)
    return ext.softmax("softmax", h @ p["out"], axis=-1)


def test_a_transformer_block_runs_at_any_batch_size() -> None:
    rng = np.random.default_rng(11)
    length, width, vocab = 5, 8, 7
    shapes = {"embed": (vocab, width), "position": (6, width), "out": (width, vocab)}
    shapes |= dict.fromkeys(("wq", "wk", "wv"), (width, width))
    p = {k: (rng.standard_normal(s) * 0.5).astype(np.float32) for k, s in shapes.items()}
    p["causal"] = np.triu(np.full((length, length), -1e9, dtype=np.float32), k=1)
    tokens = {"tokens": rng.integers(0, vocab, (3, length))}
    graph = _recorded(
        lambda xp, t: _transformer_block(xp, t, {k: xp.asarray(v) for k, v in p.items()}), tokens
    )
    model = graph.to_onnx(dynamic_batch=True)
    assert _dims(model.graph.output[0]) == ["batch", length, vocab]
    for n in (3, 8, 1):
        t = rng.integers(0, vocab, (n, length))
        want = _transformer_block(np, t, p)
        np.testing.assert_allclose(run_onnx(model, {"tokens": t})["y"], want, atol=1e-5)


# --- what bakes the batch size in -------------------------------------------------------------


def _refused(make: Callable[[Builder, int], int], message: str) -> None:
    b = Builder()
    y = make(b, b.input("x", floats(4, 6)))
    graph = b.graph(y=y)
    with pytest.raises(DynamicBatchError, match=message):
        to_onnx(graph, b.arrays, dynamic_batch=True)
    to_onnx(graph, b.arrays)  # what has one batch size exports


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (
            lambda b, x: b.op(lambda o: Reshape(out=o, x=x, shape=(2, 12))),
            r"op 0 \(reshape\(#0\) -> #1\) with a dynamic batch: it reshapes \(4, 6\) to "
            r"\(2, 12\), splitting the batch's axis 0",
        ),
        (
            lambda b, x: b.op(
                lambda o: Reshape(
                    out=o, x=b.op(lambda t: PermuteDims(out=t, x=x, axes=(1, 0))), shape=(24,)
                )
            ),
            "op 1 .* merging it with the axes before it",
        ),
        (
            lambda b, x: b.op(lambda o: Binary(op="add", out=o, x1=x, x2=b.constant(floats(4, 6)))),
            r"op 0 .* it broadcasts #2 \(a constant, shape \(4, 6\)\), which does not hold the "
            "batch, against the batch along its axis 0, of fixed size 4",
        ),
        (
            lambda b, x: b.op(
                lambda o: Binary(
                    op="multiply",
                    out=o,
                    x1=b.op(lambda t: Full(out=t, shape=(4, 1), dtype="float32", value=2.0)),
                    x2=x,
                )
            ),
            r"op 1 .* #2 \(made by op 0, full, shape \(4, 1\)\)",
        ),
        (
            lambda b, x: b.op(lambda o: Reduce(op="var", out=o, x=x, axis=(0,))),
            "its var over the batch divides by the batch's size",
        ),
        (
            lambda b, x: b.op(lambda o: Join(op="concat", out=o, xs=(x, x), axis=0)),
            "it concatenates along the batch",
        ),
        (
            lambda b, x: b.op(lambda o: Join(op="concat", out=o, xs=(x, x), axis=None)),
            "it flattens the batch",
        ),
        (
            lambda b, x: b.op(lambda o: GetItem(out=o, x=x, key=(SliceSpec(start=1),))),
            r"it takes part of the batch \(slice\(1, None, None\) of axis 0\)",
        ),
        (
            lambda b, x: b.op(lambda o: GetItem(out=o, x=x, key=(SliceSpec(stop=-1, step=2),))),
            r"it takes part of the batch \(slice\(None, -1, 2\) of axis 0\)",
        ),
        (
            lambda b, x: b.op(lambda o: Tile(out=o, x=x, reps=(2, 1))),
            "it tiles the batch 2 times",
        ),
        (
            lambda b, x: b.op(lambda o: Roll(out=o, x=x, shift=(1,), axis=(0,))),
            "it rolls along the batch",
        ),
        (
            lambda b, x: b.op(
                lambda o: Cumulative(op="cumulative_sum", out=o, x=x, axis=0, include_initial=True)
            ),
            "it prepends a zero to the batch",
        ),
        (
            lambda b, x: b.op(
                lambda o: Binary(op="matmul", out=o, x1=b.constant(floats(3, 4)), x2=x)
            ),
            "it contracts the batch with an axis of fixed size",
        ),
        (
            lambda b, x: b.op(
                lambda o: Binary(
                    op="add",
                    out=o,
                    x1=b.op(lambda t: Axes(op="expand_dims", out=t, x=x, axis=(0,))),
                    x2=b.op(lambda t: Axes(op="expand_dims", out=t, x=x, axis=(1,))),
                )
            ),
            r"it broadcasts the batch of #3 \(axis 0 of the result\) against another's \(axis 1\)",
        ),
    ],
)
def test_what_bakes_the_batch_size_in_is_named(
    make: Callable[[Builder, int], int], message: str
) -> None:
    _refused(make, message)


def test_an_assignment_into_the_batch_is_refused() -> None:
    b = Builder()
    x = b.input("x", floats(4, 6))
    t = b.op(lambda o: Unary(op="exp", out=o, x=x))
    b.inplace(SetItem(out=t, key=(0,), value=b.constant(floats(6))))
    with pytest.raises(DynamicBatchError, match=r"op 1 .*positions fixed for one batch size"):
        to_onnx(b.graph(t=t), b.arrays, dynamic_batch=True)


def test_an_input_holding_the_batch_must_be_declared() -> None:
    """Labels of the batch's size: refused until named as a batch input too."""
    b = Builder()
    x = b.input("x", floats(4, 3))
    labels = b.input("labels", np.array([0, 2, 1, 1]))
    picked = b.op(lambda o: Axes(op="expand_dims", out=o, x=labels, axis=(1,)))
    y = b.op(lambda o: Take(op="take_along_axis", out=o, x=x, indices=picked, axis=1))
    graph = b.graph(y=y)
    with pytest.raises(
        DynamicBatchError, match=r"#2 \(made by op 0, expand_dims, shape \(4, 1\)\)"
    ):
        to_onnx(graph, b.arrays, dynamic_batch=True)
    model = to_onnx(graph, b.arrays, dynamic_batch=("x", "labels"))
    assert [_dims(i) for i in model.graph.input] == [["batch", 3], ["batch"]]
    feeds = {"x": floats(6, 3), "labels": np.array([2, 0, 0, 1, 2, 1])}
    got = run_onnx(model, feeds)["y"]
    np.testing.assert_array_equal(got[:, 0], feeds["x"][np.arange(6), feeds["labels"]])


@pytest.mark.parametrize(
    ("inputs", "batch", "message"),
    [
        (
            {"x": (1, 3)},
            True,
            "input 'x' was recorded with a batch of 1: record it with a batch of 2",
        ),
        (
            {"x": (4, 3), "y": (5, 3)},
            ["x", "y"],
            "inputs 'x' and 'y' were recorded with batches of 4 and 5",
        ),
        ({"x": (4, 3)}, ["z"], "the graph has no input 'z'"),
        ({"x": ()}, "x", "input 'x' is 0-dimensional"),
        ({}, True, "the graph has no input to hold the batch"),
    ],
)
def test_batch_inputs_that_do_not_fit_are_refused(
    inputs: dict[str, tuple[int, ...]], batch: Any, message: str
) -> None:
    b = Builder()
    ids = [b.input(name, floats(*shape)) for name, shape in inputs.items()]
    y = b.op(lambda o: Full(out=o, shape=(2,), dtype="float32", value=1.0))
    for i in ids:
        y = b.op(lambda o, i=i: Reduce(op="sum", out=o, x=i))
    with pytest.raises(DynamicBatchError, match=f"cannot export with a dynamic batch: {message}"):
        to_onnx(b.graph(y=y), b.arrays, dynamic_batch=batch)


def test_a_dynamic_batch_error_is_an_export_error() -> None:
    assert issubclass(DynamicBatchError, OnnxExportError)


def test_every_exported_op_has_a_batch_rule() -> None:
    assert set(RULES) == set(CONVERTERS)
