"""The convolutions and poolings that ``bench.conv_formulations`` and ``bench.nn_costs`` time:
the digits CNN of ``examples/train_cnn.py``, a larger one, and one case of each parameter
(stride, groups, depthwise, dilation, 1-D); ``everything`` adds MNIST- and CIFAR-like shapes,
one whose window matrix is over the executor's chunk."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from protocol.ops import Conv
from server.executor import convolution

Array = np.ndarray[Any, Any]

# (name, N, C_in, spatial, C_out, kernel, stride, padding, dilation, groups, in the short run)
CONVS = (
    ("digits 1", 64, 1, (8, 8), 16, 3, 1, 1, 1, 1, True),  # examples/train_cnn.py's two
    ("digits 2", 64, 16, (4, 4), 32, 3, 1, 1, 1, 1, True),
    ("digits 2 N128", 128, 16, (4, 4), 32, 3, 1, 1, 1, 1, True),
    ("32x32x64", 8, 64, (32, 32), 64, 3, 1, 1, 1, 1, True),
    ("stride 2", 16, 32, (32, 32), 64, 3, 2, 1, 1, 1, True),
    ("groups 4", 32, 32, (16, 16), 32, 3, 1, 1, 1, 4, True),
    ("depthwise", 32, 32, (16, 16), 32, 3, 1, 1, 1, 32, True),
    ("dilation 2", 32, 16, (16, 16), 32, 3, 1, 2, 2, 1, True),
    ("1-D k5", 64, 16, (128,), 32, 5, 1, 2, 1, 1, True),
    ("mnist 1 k5", 64, 1, (28, 28), 32, 5, 1, 2, 1, 1, False),
    ("mnist 2", 64, 32, (14, 14), 64, 3, 1, 1, 1, 1, False),
    ("cifar 1", 64, 3, (32, 32), 32, 3, 1, 1, 1, 1, False),
    ("32x32 N128", 128, 32, (32, 32), 64, 3, 1, 1, 1, 1, False),  # a window matrix of 144 MiB
)
# (name, N, C, spatial, kernel, stride, padding, in the short run)
POOLS = (
    ("digits 8x8", 64, 16, (8, 8), 2, 2, 0, True),
    ("digits 4x4", 64, 32, (4, 4), 2, 2, 0, True),
    ("k3 s2 p1", 32, 32, (32, 32), 3, 2, 1, True),
    ("1-D k2", 64, 32, (128,), 2, 2, 0, True),
    ("mnist 28x28", 64, 32, (28, 28), 2, 2, 0, False),
    ("mnist 14x14", 64, 64, (14, 14), 2, 2, 0, False),
)


@dataclass(frozen=True)
class ConvProblem:
    """One convolution's inputs and output, and its three ops: ``forward`` of ``x`` and ``w``
    (giving ``y``), ``weight_grad`` of ``x`` and ``y``, ``transpose`` of ``y`` and ``w`` back
    to ``x``'s shape (x's gradient)."""

    name: str
    dtype: str
    x: Array
    w: Array
    y: Array
    forward: Conv
    weight_grad: Conv
    transpose: Conv


def conv_problems(everything: bool, dtypes: Sequence[str]) -> Iterator[ConvProblem]:
    rng = np.random.default_rng(0)
    for name, n, ci, spatial, co, k, s, p, d, g, short in CONVS:
        if not (short or everything):
            continue
        dims, kernel = len(spatial), (k,) * len(spatial)
        fields: Any = {"stride": (s,) * dims, "padding": ((p, p),) * dims, "dilation": (d,) * dims}
        for dtype in dtypes:
            x = rng.standard_normal((n, ci, *spatial)).astype(dtype)
            w = rng.standard_normal((co, ci // g, *kernel)).astype(dtype)
            forward = Conv(out=0, x=1, w=2, groups=g, **fields)
            y = convolution.conv(x, w, forward)
            extra = tuple(
                m - ((o - 1) * s - 2 * p + d * (k - 1) + 1)
                for m, o in zip(spatial, y.shape[2:], strict=True)
            )
            yield ConvProblem(
                name,
                dtype,
                x,
                w,
                y,
                forward,
                Conv(out=0, x=1, w=2, op="conv_weight_grad", groups=g, kernel=kernel, **fields),
                Conv(
                    out=0, x=1, w=2, op="conv_transpose", groups=g, output_padding=extra, **fields
                ),
            )


def pool_problems(everything: bool, dtypes: Sequence[str]) -> Iterator[tuple[str, Array, Any]]:
    """Each pooling's name, input and window (``kernel``, ``stride``, ``padding``)."""
    rng = np.random.default_rng(0)
    for name, n, c, spatial, k, s, p, short in POOLS:
        if not (short or everything):
            continue
        dims = len(spatial)
        window = {"kernel": (k,) * dims, "stride": (s,) * dims, "padding": (p,) * dims}
        for dtype in dtypes:
            yield name, rng.standard_normal((n, c, *spatial)).astype(dtype), window
