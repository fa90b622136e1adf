"""The neural-network extension's ops exported to ONNX compute what the server computes
(``tests/onnx_graphs.py`` builds, exports, runs and compares): convolutions and their
transpose, pooling, batch normalization, softmax, and attention as matmuls and a softmax; the
ops only training makes are refused with the reason. A CNN and a transformer block of
client.nn's layers, exported with a dynamic batch, give what they give on numpy.

onnxruntime's CPU kernels of Conv, ConvTranspose and AveragePool are float32 only: those run
in float32 here (the exported model is the same for float64, and passes ONNX's checker)."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import onnx
import pytest

import client
from client import nn
from client.autodiff import Autodiff, Tensor
from client.capture.onnx import OnnxExportError, to_onnx
from protocol.dtypes import DType
from protocol.ops import (
    AdamDirection,
    BatchNorm,
    Binary,
    BinaryScalar,
    Conv,
    MomentUpdate,
    PermuteDims,
    Pool,
    PoolBackward,
    Random,
    Softmax,
)
from protocol.ops.base import BaseOp

from .onnx_graphs import Builder, export_and_compare, floats, run_onnx

Pairs = tuple[tuple[int, int], ...]


def _op_types(model: onnx.ModelProto) -> set[str]:
    return {node.op_type for node in model.graph.node}


@pytest.mark.parametrize(
    ("x_shape", "w_shape", "stride", "padding", "dilation", "groups"),
    [
        ((2, 3, 9, 8), (4, 3, 3, 3), (1, 1), ((1, 1), (1, 1)), (1, 1), 1),
        ((2, 4, 9, 8), (6, 2, 3, 2), (2, 1), ((0, 2), (1, 0)), (1, 2), 2),  # uneven padding
        ((1, 6, 7, 7), (6, 1, 3, 3), (2, 2), ((1, 1), (1, 1)), (2, 1), 6),  # depthwise
        ((3, 2, 11), (5, 2, 4), (3,), ((2, 1),), (2,), 1),  # 1-D
        ((1, 2, 5, 6, 4), (3, 2, 2, 3, 2), (1, 2, 1), ((1, 0), (0, 1), (1, 1)), (1, 1, 2), 1),
    ],
)
def test_convolutions_match_numpy(
    x_shape: tuple[int, ...],
    w_shape: tuple[int, ...],
    stride: tuple[int, ...],
    padding: Pairs,
    dilation: tuple[int, ...],
    groups: int,
) -> None:
    b = Builder()
    x, w = b.input("x", floats(*x_shape)), b.input("w", floats(*w_shape))
    params = {"stride": stride, "padding": padding, "dilation": dilation, "groups": groups}
    y = b.op(lambda o: Conv(out=o, x=x, w=w, **params))
    # each output sums this many products: their rounding is relative to them, not to the sum
    model = export_and_compare(b, scale=math.prod(w_shape[1:]), y=y)
    assert _op_types(model) == {"Conv", "Identity"}


@pytest.mark.parametrize(
    ("x_shape", "w_shape", "stride", "padding", "output_padding", "dilation", "groups"),
    [
        ((2, 3, 5, 4), (3, 2, 3, 3), (2, 2), ((1, 1), (0, 0)), (1, 0), (1, 1), 1),
        ((1, 4, 4, 5), (4, 3, 2, 3), (3, 1), ((0, 2), (1, 1)), (2, 0), (1, 2), 2),
        ((2, 2, 6), (2, 3, 3), (1,), ((0, 0),), (2,), (1,), 1),  # past the stride: zeros
        ((2, 2, 6), (2, 3, 3), (2,), ((1, 1),), (3,), (1,), 1),  # past both padding and stride
    ],
)
def test_transposed_convolutions_match_numpy(
    x_shape: tuple[int, ...],
    w_shape: tuple[int, ...],
    stride: tuple[int, ...],
    padding: Pairs,
    output_padding: tuple[int, ...],
    dilation: tuple[int, ...],
    groups: int,
) -> None:
    """ONNX's weight layout is the protocol's; an output padding at or past the stride (the
    protocol takes it, onnxruntime does not) becomes padding cropped less, then zeros."""
    b = Builder()
    x, w = b.input("x", floats(*x_shape)), b.input("w", floats(*w_shape))
    y = b.op(
        lambda o: Conv(
            op="conv_transpose",
            out=o,
            x=x,
            w=w,
            stride=stride,
            padding=padding,
            dilation=dilation,
            groups=groups,
            output_padding=output_padding,
        )
    )
    model = export_and_compare(b, scale=math.prod(w_shape), y=y)  # as for the convolutions
    assert "ConvTranspose" in _op_types(model)


@pytest.mark.parametrize(
    ("name", "kernel", "stride", "padding", "count_include_pad"),
    [
        ("max", (2, 2), (2, 2), (0, 0), True),
        ("max", (3, 2), (1, 2), (1, 1), True),
        ("avg", (3, 3), (2, 1), (1, 1), True),
        ("avg", (3, 3), (2, 1), (1, 1), False),
        ("avg", (2,), (1,), (1,), False),
        ("max", (3,), (2,), (1,), True),
    ],
)
def test_pooling_matches_numpy(
    name: str,
    kernel: tuple[int, ...],
    stride: tuple[int, ...],
    padding: tuple[int, ...],
    count_include_pad: bool,
) -> None:
    b = Builder()
    x = b.input("x", floats(2, 3, *(7 for _ in kernel)))
    window = {"kernel": kernel, "stride": stride, "padding": padding}
    y = b.op(lambda o: Pool(op=name, out=o, x=x, **window, count_include_pad=count_include_pad))
    model = export_and_compare(b, scale=2, y=y)  # a mean's rounding: relative to its terms
    assert ("MaxPool" if name == "max" else "AveragePool") in _op_types(model)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_max_pooling_sees_nan_as_numpy_does(dtype: DType) -> None:
    """numpy's maximum of a window with a NaN is NaN; onnxruntime's MaxPool skips NaNs."""
    value = floats(1, 2, 4, 5, dtype=dtype)
    value[0, 0, 1, 1] = value[0, 1, 3, 4] = np.nan
    b = Builder()
    x = b.input("x", value)
    y = b.op(lambda o: Pool(op="max", out=o, x=x, kernel=(2, 2), stride=(1, 2), padding=(1, 1)))
    export_and_compare(b, y=y)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("affine", [True, False])
def test_batch_norm_matches_numpy(dtype: DType, affine: bool) -> None:
    """The inference form; without weight and bias, ones and zeros; float64's epsilon whole
    (ONNX's attribute is a float32)."""
    b = Builder()
    x = b.input("x", floats(3, 4, 5, 2, dtype=dtype))
    mean = b.input("mean", floats(4, dtype=dtype))
    var = b.input("var", floats(4, dtype=dtype, low=1e-4, high=2e-3))
    weight, bias = (
        (b.input("weight", floats(4, dtype=dtype)), b.input("bias", floats(4, dtype=dtype)))
        if affine
        else (None, None)
    )
    y = b.op(
        lambda o: BatchNorm(out=o, x=x, mean=mean, var=var, weight=weight, bias=bias, eps=1e-5)
    )
    flat = b.input("flat", floats(6, 4, dtype=dtype))  # (N, C): a BatchNorm1d's input
    z = b.op(lambda o: BatchNorm(out=o, x=flat, mean=mean, var=var, eps=0.1))
    # x - mean cancels: its rounding, scaled, is relative to the terms (up to 4, times 100)
    model = export_and_compare(b, scale=4 / math.sqrt(1e-4) * 2, y=y, z=z)
    assert "BatchNormalization" in _op_types(model)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_softmax_and_log_softmax_match_numpy(dtype: DType, axis: int) -> None:
    b = Builder()
    x = b.input("x", floats(3, 4, 5, dtype=dtype, low=-30, high=30))
    y = b.op(lambda o: Softmax(out=o, x=x, axis=axis))
    z = b.op(lambda o: Softmax(op="log_softmax", out=o, x=x, axis=axis))
    model = export_and_compare(b, scale=30, y=y, z=z)
    assert {"Softmax", "LogSoftmax"} <= _op_types(model)


def test_attention_exports_as_matmuls_and_a_softmax() -> None:
    """``softmax(q @ k.T / sqrt(d)) @ v`` over heads, as the extension records it."""
    batch, heads, length, d = 2, 3, 5, 4
    b = Builder()
    q, k, v = (b.input(n, floats(batch, heads, length, d)) for n in "qkv")
    k_t = b.op(lambda o: PermuteDims(out=o, x=k, axes=(0, 1, 3, 2)))
    scores = b.op(lambda o: Binary(op="matmul", out=o, x1=q, x2=k_t))
    scaled = b.op(lambda o: BinaryScalar(op="multiply", out=o, x=scores, scalar=1 / math.sqrt(d)))
    weights = b.op(lambda o: Softmax(out=o, x=scaled, axis=-1))
    y = b.op(lambda o: Binary(op="matmul", out=o, x1=weights, x2=v))
    model = export_and_compare(b, scale=2 * d, y=y)  # sums of d and of `length` products
    assert _op_types(model) == {"Transpose", "MatMul", "Mul", "Softmax", "Identity"}


@pytest.mark.parametrize(
    ("op", "why"),
    [
        (
            lambda x, w, s, o: Conv(
                op="conv_weight_grad",
                out=o,
                x=x,
                w=w,
                stride=(1, 1),
                padding=((0, 0), (0, 0)),
                dilation=(1, 1),
                kernel=(3, 3),
            ),
            "it is part of a backward pass",
        ),
        (
            lambda x, w, s, o: PoolBackward(
                op="max", out=o, x=x, grad=x, kernel=(1, 1), stride=(1, 1), padding=(0, 0)
            ),
            "max pooling's gradient: it is part of a backward pass",
        ),
        (
            lambda x, w, s, o: Random(op="normal", out=o, state=s, shape=(2, 3)),
            r"random numbers are drawn on the device by numpy's Philox .* export it in eval mode",
        ),
    ],
)
def test_training_ops_are_refused_with_the_reason(
    op: Callable[[int, int, int, int], BaseOp], why: str
) -> None:
    b = Builder()
    x = b.input("x", floats(1, 2, 5, 5))
    w = b.input("w", floats(1, 2, 3, 3))
    state = b.input("state", np.array([7, 0], dtype=np.uint64))
    y = b.op(lambda o: op(x, w, state, o))
    with pytest.raises(OnnxExportError, match=rf"cannot export op 0 \(.*\) to ONNX: {why}"):
        to_onnx(b.graph(y=y), b.arrays)


def test_optimizer_updates_are_refused_with_the_reason() -> None:
    """Adam's update (a jitted training step holds it) is no part of an exported model."""
    why = r"it is part of an optimizer's update .* export the forward pass"
    b = Builder()
    m, g = (b.input(n, floats(2, 3)) for n in "mg")
    b.inplace(MomentUpdate(out=m, grad=g, decay=0.9, scale=0.1))
    y = b.op(lambda o: BinaryScalar(op="multiply", out=o, x=m, scalar=1.0))
    with pytest.raises(OnnxExportError, match=rf"cannot export op 0 \(moment_update.*: {why}"):
        to_onnx(b.graph(y=y), b.arrays)
    b = Builder()
    m, v = (b.input(n, floats(2, 3)) for n in "mv")
    term = b.input("term", np.asarray(1e-3, dtype=np.float32))
    y = b.op(lambda o: AdamDirection(out=o, exp_avg=m, exp_avg_sq=v, step_size=term, eps_term=term))
    with pytest.raises(OnnxExportError, match=rf"cannot export op 0 \(.*\) to ONNX: {why}"):
        to_onnx(b.graph(y=y), b.arrays)


def test_float64_convolutions_pass_the_checker() -> None:
    """What onnxruntime's CPU kernels lack is the runtime's: the model is valid ONNX."""
    b = Builder()
    x, w = (
        b.input("x", floats(1, 2, 6, 6, dtype="float64")),
        b.input("w", floats(2, 2, 3, 3, dtype="float64")),
    )
    window = {"stride": (1, 1), "padding": ((1, 1), (1, 1)), "dilation": (1, 1)}
    y = b.op(lambda o: Conv(out=o, x=x, w=w, **window))
    t = b.op(lambda o: Conv(op="conv_transpose", out=o, x=y, w=w, **window))
    p = b.op(lambda o: Pool(op="avg", out=o, x=t, kernel=(2, 2), stride=(2, 2), padding=(0, 0)))
    to_onnx(b.graph(p=p), b.arrays)  # onnx.checker's full check, with shape inference


# --- models of client.nn's layers, in eval mode, with a dynamic batch -------------------------


class Block(nn.Module):
    """A decoder block: token and position embeddings, causal self-attention, a residual and a
    layer norm, an MLP with dropout."""

    def __init__(self, ad: Autodiff, vocab: int = 11, width: int = 8, length: int = 6) -> None:
        super().__init__()
        self.ad = ad
        self.tokens, self.positions = (
            nn.Embedding(vocab, width, ad=ad),
            nn.Embedding(length, width, ad=ad),
        )
        self.attention = nn.MultiheadAttention(width, 2, dropout=0.1, batch_first=True, ad=ad)
        self.norm = nn.LayerNorm(width, ad=ad)
        self.mlp = nn.Sequential(
            nn.Linear(width, 16, ad=ad), nn.GELU(), nn.Dropout(0.2), nn.Linear(16, vocab, ad=ad)
        )

    def forward(self, tokens: Tensor) -> Tensor:
        h = self.tokens(tokens) + self.positions(self.ad.arange(tokens.shape[1]))
        attended, _ = self.attention(h, h, h, need_weights=False, is_causal=True)
        return self.mlp(self.norm(h + attended))


def _cnn(ad: Autodiff) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1, ad=ad),
        nn.BatchNorm2d(4, ad=ad),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(4, 6, 3, padding="same", groups=2, ad=ad),
        nn.ConvTranspose2d(6, 4, 2, stride=2, ad=ad),
        nn.AvgPool2d(2, padding=1),
        nn.Flatten(),
        nn.Dropout(0.3),
        nn.Linear(4 * 5 * 5, 5, ad=ad),
    )


@pytest.mark.parametrize(
    ("build", "shape", "sample"),
    [
        (_cnn, (4, 1, 8, 8), lambda rng, n: rng.standard_normal((n, 1, 8, 8)).astype("float32")),
        (Block, (3, 6), lambda rng, n: rng.integers(0, 11, (n, 6))),
    ],
)
def test_a_model_of_layers_exports_and_runs_at_any_batch_size(
    build: Callable[[Autodiff], nn.Module],
    shape: tuple[int, ...],
    sample: Callable[[np.random.Generator, int], np.ndarray],
) -> None:
    """Built on a record-only capture: device (its parameters the graph's constants) and on
    numpy from the same seed; the export, run at three batch sizes, gives numpy's outputs."""
    rng = np.random.default_rng(5)
    nn.manual_seed(3)
    local = build(nn.local_autodiff()).eval()
    dev = client.open_device("capture:")
    ad = Autodiff(client.namespace(dev))
    with dev.capture() as cap:
        nn.manual_seed(3)
        model = build(ad).eval()
        x = cap.input("x", shape=shape, dtype=sample(rng, 1).dtype)
        cap.output("y", model(ad.tensor(x)).array)
    exported = cap.graph.to_onnx(dynamic_batch=True)
    for n in (shape[0], 9, 1):
        x = sample(rng, n)
        want = np.asarray(local(nn.local_autodiff().asarray(x)).array)
        got = run_onnx(exported, {"x": x})["y"]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
