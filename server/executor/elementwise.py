"""Element-wise ops: unary, binary (matmul included), where, astype."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from protocol import to_numpy
from protocol.codec import Buffer
from protocol.dtypes import DTYPES, is_complex
from protocol.ops import AsType, Binary, Unary, Where, elementwise_rule

Array = np.ndarray[Any, Any]


def _call(name: str, args: Sequence[Array]) -> Array:
    _, compute = elementwise_rule(name, tuple([_NAMES[a.dtype] for a in args]))  # hot path
    fn: Callable[..., Array] = getattr(np, name)
    if compute is not None:
        args = [a.astype(to_numpy(compute)) for a in args]
    return fn(*args)


_NAMES = {dt: name for name in DTYPES for dt in (to_numpy(name), to_numpy(name).newbyteorder("="))}


def _wire(a: Array) -> Any:
    return _NAMES[a.dtype]  # a dict lookup: dtype.name costs microseconds per op


def unary(op: Unary, args: Sequence[Array], buffers: Sequence[Buffer]) -> Array:
    return _call(op.op, args)


def binary(op: Binary, args: Sequence[Array], buffers: Sequence[Buffer]) -> Array:
    return _call(op.op, args)


def where(op: Where, args: Sequence[Array], buffers: Sequence[Buffer]) -> Array:
    condition, x1, x2 = args
    return np.where(condition, x1, x2)


def astype(op: AsType, args: Sequence[Array], buffers: Sequence[Buffer]) -> Array:
    (x,) = args
    if is_complex(_wire(x)) and not is_complex(op.dtype):
        x = x.real  # Note: numpy warns and drops the imaginary part; we drop it silently
    return x.astype(to_numpy(op.dtype))
