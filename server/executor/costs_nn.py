"""What the neural-network extension's ops cost numpy: the families of
:func:`~server.executor.costs.cost` for them, in the same element operations (bench/REASONS.md,
'The op cost model', its nn rows; ``python -m bench.nn_costs``).

A convolution counts its multiply-adds in sixty-fourths, by dtype (BLAS on large, well-shaped
products); a call's own time (a few dozen numpy calls), a pooling's and each of its taps';
per window element of the gradients; per element of batch norm, softmax and random draws.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from protocol import TensorMeta
from protocol.ops import Conv, Pool, PoolBackward, Random

from .base import Array
from .costs_extensions import LOOP_MADD_16THS

_CONV_MADD_64THS = {"float32": 2, "float64": 4}
CONV_CALL, POOL_CALL, POOL_TAP = 1 << 16, 1 << 15, 1 << 10
TRANSPOSE_MOVED = 2  # a tap's product written, then added into a strided slice
POOL_MAX_BACKWARD, POOL_AVG_BACKWARD = 8, 2
BATCH_NORM_ELEMENT, SOFTMAX_ELEMENT, RANDOM_UNIFORM, RANDOM_NORMAL = 3, 8, 6, 16


def conv(op: Conv, meta: TensorMeta, args: Sequence[Array], size: int) -> int:
    """A call's own time, the multiply-adds at the rate BLAS keeps on a convolution's large
    products, each element the windows put in a matrix (im2col) or each tap's product added
    into the output (the transpose) once, and the result written twice."""
    x, w = args
    taps = math.prod(op.kernel if op.op == "conv_weight_grad" else w.shape[2:])
    if op.op == "conv":
        madds = max(0, math.prod(meta.shape)) * (int(x.shape[1]) // op.groups) * taps
        moved = max(0, math.prod(meta.shape)) // max(1, meta.shape[1]) * int(x.shape[1]) * taps
    elif op.op == "conv_transpose":
        madds = x.size * (meta.shape[1] // op.groups) * taps
        moved = TRANSPOSE_MOVED * madds // max(1, int(x.shape[1]) // op.groups)
    else:
        madds = w.size * (int(x.shape[1]) // op.groups) * taps
        moved = w.size // max(1, int(w.shape[1])) * int(x.shape[1]) * taps
    madd = _CONV_MADD_64THS.get(meta.dtype, LOOP_MADD_16THS * 4)
    return CONV_CALL + madds * madd // 64 + moved + 2 * size


def pool(op: Pool | PoolBackward, meta: TensorMeta, args: Sequence[Array], size: int) -> int:
    """A call's own time and each tap's (a few numpy calls a tap), each window's elements
    read once, for the gradient of max pooling a few passes each (compared with the maximum,
    masked, added back), and the input and result written twice."""
    taps = math.prod(op.kernel)
    if isinstance(op, Pool):
        return POOL_CALL + taps * POOL_TAP + max(0, math.prod(meta.shape)) * taps + 2 * size
    per_window = POOL_MAX_BACKWARD if op.op == "max" else POOL_AVG_BACKWARD
    calls = POOL_CALL + taps * 4 * POOL_TAP
    return calls + args[1].size * taps * per_window + 2 * size


def random(op: Random, meta: TensorMeta, args: Sequence[Array], size: int) -> int:
    return size * (RANDOM_NORMAL if op.op == "normal" else RANDOM_UNIFORM)
