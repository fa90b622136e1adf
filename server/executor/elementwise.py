"""Element-wise ops: unary, binary (matmul included), where, astype."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from protocol import to_numpy
from protocol.codec import Buffer
from protocol.dtypes import DTYPES, is_complex
from protocol.ops import AsType, Binary, Unary, Where
from protocol.ops.rules import elementwise_rule

from .base import Array, Runner


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
    result = _call(op.op, args)
    if result.dtype.kind != "c":
        return result
    if op.op == "tanh":
        # Note: the standard asks tanh(+-inf + yj) = +-1 + 0j (the zero's sign that of y) for a
        # finite y; numpy can give NaN parts there.
        (x,) = args
        bad = np.isinf(x.real) & np.isfinite(x.imag)
        if bad.any():
            fixed = np.copysign(1.0, x.real) + 1j * np.copysign(0.0, x.imag)
            result = np.where(bad, fixed.astype(result.dtype), result)
    if op.op == "expm1":
        # Note: numpy's complex expm1 misses the standard's special cases at infinities and
        # NaNs; exp(x) - 1 has them right there.
        (x,) = args
        bad = ~np.isfinite(x)
        if bad.any():
            result = np.where(bad, np.exp(x) - 1, result)
        zero = (x == 0) & ~np.signbit(x.imag)  # expm1(+-0 + 0j) is +0 + 0j
        if zero.any():
            result = np.where(zero, np.zeros((), result.dtype), result)
    return result


def binary(op: Binary, args: Sequence[Array], buffers: Sequence[Buffer]) -> Array:
    result = _call(op.op, args)
    if op.op == "floor_divide" and result.dtype.kind == "f":
        # Note: numpy's floor_divide gives NaN for inf // finite and -1 for -finite // inf;
        # the standard asks for floor(x1 / x2) there (+-inf, -0).
        x1, x2 = args
        bad = np.isinf(x1) | np.isinf(x2)
        if bad.any():
            result = np.where(bad, np.floor(np.divide(x1, x2)), result).astype(result.dtype)
    return result


def where(op: Where, args: Sequence[Array], buffers: Sequence[Buffer]) -> Array:
    condition, x1, x2 = args
    return np.where(condition, x1, x2)


def astype(op: AsType, args: Sequence[Array], buffers: Sequence[Buffer]) -> Array:
    (x,) = args
    if is_complex(_wire(x)) and not is_complex(op.dtype):
        x = x.real  # Note: numpy warns and drops the imaginary part; we drop it silently
    return x.astype(to_numpy(op.dtype))


RUNNERS: dict[type, Runner] = {Unary: unary, Binary: binary, Where: where, AsType: astype}
