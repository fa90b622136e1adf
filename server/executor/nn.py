"""The neural-network extension, with numpy: convolutions (``convolution.py``), pooling
(``pooling.py``), batch normalization, softmax and random numbers (``protocol/ops/nn.py`` says
what each computes).

These functions are also the ``ndarray``'s and local numpy's definition of the ops: the
client's numpy extension (``client/extension.py``) calls them, so that a model gives the same
numbers locally, on the ``ndarray`` device and on a server.

What a runner allocates beside its result, where that can be far more than the result, is
counted by its entry in :data:`SCRATCH` (``executor.scratch``), before it runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from protocol.codec import Buffer
from protocol.ops import BatchNorm, Conv, Pool, PoolBackward, Random, Softmax

from .base import Array, Runner, Scratch
from .convolution import conv_scratch, run_conv
from .pooling import pool_scratch, run_pool, run_pool_backward


def run_batch_norm(op: BatchNorm, args: Sequence[Array], buffers: Sequence[Buffer]) -> Array:
    x, mean, var, *affine = args
    shape = (1, x.shape[1]) + (1,) * (x.ndim - 2)
    scale = 1.0 / np.sqrt(var + x.dtype.type(op.eps))
    if op.weight is not None:
        scale = scale * affine[0]
    y = (x - mean.reshape(shape)) * scale.reshape(shape)
    if op.bias is not None:
        y += affine[-1].reshape(shape)
    return np.asarray(y, dtype=x.dtype)


def run_softmax(op: Softmax, args: Sequence[Array], buffers: Sequence[Buffer]) -> Array:
    (x,) = args
    shifted = x - x.max(axis=op.axis, keepdims=True) if x.size else x
    if op.op == "log_softmax":
        return np.asarray(shifted - np.log(np.exp(shifted).sum(axis=op.axis, keepdims=True)))
    e = np.exp(shifted)
    e /= e.sum(axis=op.axis, keepdims=True)
    return np.asarray(e)


def generator(state: Array) -> np.random.Generator:
    """The numpy generator a ``random`` op draws from: Philox keyed by ``[seed, offset]``."""
    seed, offset = (int(v) for v in state)
    return np.random.Generator(np.random.Philox(key=np.array([seed, offset], dtype=np.uint64)))


def run_random(op: Random, args: Sequence[Array], buffers: Sequence[Buffer]) -> Array:
    gen = generator(args[0])
    dtype: Any = np.dtype(op.dtype)
    if op.op == "uniform":
        return np.asarray(gen.random(op.shape, dtype=dtype))
    return np.asarray(gen.standard_normal(op.shape, dtype=dtype))


RUNNERS: dict[type, Runner] = {
    Conv: run_conv,
    Pool: run_pool,
    PoolBackward: run_pool_backward,
    BatchNorm: run_batch_norm,
    Softmax: run_softmax,
    Random: run_random,
}

SCRATCH: dict[type, Scratch] = {Conv: conv_scratch, Pool: pool_scratch, PoolBackward: pool_scratch}
