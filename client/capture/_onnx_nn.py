"""The ONNX counterparts of the neural-network extension's ops (``protocol/ops/nn.py``), for
:func:`client.capture.onnx.to_onnx`: ``Conv``, ``ConvTranspose``, ``MaxPool``, ``AveragePool``,
``BatchNormalization`` (its inference form), ``Softmax`` and ``LogSoftmax``. Attention needs
nothing here: it is recorded as matmuls and a softmax.

The ops that only training makes are refused, with the reason: the gradients
(``conv_weight_grad``, ``pool_backward``) belong to a backward pass, and ``random`` draws from
numpy's Philox generator, whose numbers ONNX's ``RandomUniform`` cannot reproduce; a model in
eval mode draws none (dropout is the identity there).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from protocol.dtypes import to_numpy
from protocol.ops import (
    AdamDirection,
    BatchNorm,
    Conv,
    MomentUpdate,
    Pool,
    PoolBackward,
    Random,
    Softmax,
)

from ._onnx_builder import Converter, Export, NoCounterpart

TRAINING = (
    "it is part of a backward pass (a gradient), which an exported model does not run: export "
    "the forward pass (the model in eval mode)"
)


def conv(ex: Export, op: Conv) -> None:
    """Conv, or ConvTranspose (whose weight layout, (C_in, C_out / groups, *kernel), is the
    protocol's). An ``output_padding`` is folded into the end padding (the rows it reveals
    were cropped by it) and, past it, a Pad of zeros: onnxruntime takes an output padding only
    below the stride or the dilation, the protocol any."""
    if op.op == "conv_weight_grad":
        raise NoCounterpart(TRAINING)
    kernel = ex.metas[op.w].shape[2:]
    begins = [lo for lo, _ in op.padding]
    attrs: dict[str, Any] = {
        "kernel_shape": list(kernel),
        "strides": list(op.stride),
        "dilations": list(op.dilation),
        "group": op.groups,
    }
    x, w = ex.value(op.x), ex.value(op.w)
    if op.op == "conv":
        ends = [hi for _, hi in op.padding]
        ex.names[op.out] = ex.node("Conv", [x, w], pads=begins + ends, **attrs)
        return
    extra = op.output_padding or (0,) * len(op.stride)
    ends = [max(hi - e, 0) for (_, hi), e in zip(op.padding, extra, strict=True)]
    grow = [max(e - hi, 0) for (_, hi), e in zip(op.padding, extra, strict=True)]
    y = ex.node("ConvTranspose", [x, w], pads=begins + ends, **attrs)
    if any(grow):
        zeros = [0] * (2 + len(grow))
        y = ex.node("Pad", [y, ex.ints(zeros + [0, 0, *grow])], mode="constant")
    ex.names[op.out] = y


def pool(ex: Export, op: Pool) -> None:
    """MaxPool or AveragePool. numpy's maximum of a window holding a NaN is NaN, where
    onnxruntime's MaxPool skips it: the NaNs are pooled too, and put back."""
    attrs: dict[str, Any] = {
        "kernel_shape": list(op.kernel),
        "strides": list(op.stride),
        "pads": list(op.padding) * 2,
    }
    x = ex.value(op.x)
    if op.op == "avg":
        include = int(op.count_include_pad)
        ex.names[op.out] = ex.node("AveragePool", [x], count_include_pad=include, **attrs)
        return
    dtype = ex.metas[op.x].dtype
    flags = ex.cast(ex.node("IsNaN", [x]), "bool", dtype)
    seen = ex.node("Greater", [ex.node("MaxPool", [flags], **attrs), ex.scalar(0, dtype)])
    pooled = ex.node("MaxPool", [x], **attrs)
    ex.names[op.out] = ex.node("Where", [seen, ex.scalar(math.nan, dtype), pooled])


def batch_norm(ex: Export, op: BatchNorm) -> None:
    """BatchNormalization in its inference form (the statistics given); an affine-free batch
    norm scales by ones and shifts by zeros."""
    meta = ex.metas[op.x]
    ones = np.ones(meta.shape[1], dtype=to_numpy(meta.dtype))
    scale = ex.constant(ones) if op.weight is None else ex.value(op.weight)
    bias = ex.constant(ones * 0) if op.bias is None else ex.value(op.bias)
    var = ex.value(op.var)
    rounded = float(np.float32(op.eps))  # ONNX's epsilon is a float32 attribute
    if meta.dtype == "float64" and rounded != op.eps:  # the rest of a float64 eps: in the var
        var = ex.node("Add", [var, ex.scalar(op.eps - rounded, "float64")])
    inputs = [ex.value(op.x), scale, bias, ex.value(op.mean), var]
    ex.names[op.out] = ex.node("BatchNormalization", inputs, epsilon=rounded, training_mode=0)


def softmax(ex: Export, op: Softmax) -> None:
    """Softmax or LogSoftmax along one axis (their form from opset 13 on, the exporter's
    floor being 18)."""
    op_type = "Softmax" if op.op == "softmax" else "LogSoftmax"
    ex.names[op.out] = ex.node(op_type, [ex.value(op.x)], axis=op.axis)


def pool_backward(ex: Export, op: PoolBackward) -> None:
    raise NoCounterpart(f"{op.op} pooling's gradient: {TRAINING}")


def random(ex: Export, op: Random) -> None:
    raise NoCounterpart(
        "random numbers are drawn on the device by numpy's Philox generator, whose numbers "
        "ONNX's RandomUniform and RandomNormal cannot reproduce; a model in eval mode draws "
        "none (dropout is the identity there): export it in eval mode"
    )


def optimizer_update(ex: Export, op: MomentUpdate | AdamDirection) -> None:
    raise NoCounterpart(
        "it is part of an optimizer's update (protocol/ops/optim.py), which an exported model "
        "does not run: export the forward pass (the model in eval mode)"
    )


NN: dict[type, Converter] = {
    Conv: conv,
    Pool: pool,
    PoolBackward: pool_backward,
    BatchNorm: batch_norm,
    Softmax: softmax,
    Random: random,
    MomentUpdate: optimizer_update,
    AdamDirection: optimizer_update,
}
