"""Element-wise ops: unary, binary (matmul included; an operand may be a Python scalar in the
op), in-place binary (by array or scalar), where, astype."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, get_args

import numpy as np

from protocol import to_numpy
from protocol.codec import Buffer
from protocol.dtypes import DTYPES, DType, is_bool, is_complex, is_floating, is_integer
from protocol.ops import (
    AnyOp,
    AsType,
    Binary,
    BinaryScalar,
    InPlaceBinary,
    InPlaceBinaryScalar,
    Unary,
    Where,
)
from protocol.ops.elementwise import UnaryName
from protocol.ops.rules import elementwise_rule
from protocol.scalars import Scalar, scalar_dtype, scalar_to_python

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
    return _binary(op.op, args)


def _binary(name: str, args: Sequence[Array]) -> Array:
    result = _call(name, args)
    if name == "floor_divide" and result.dtype.kind == "f":
        # Note: numpy's floor_divide gives NaN for inf // finite and -1 for -finite // inf;
        # the standard asks for floor(x1 / x2) there (+-inf, -0).
        x1, x2 = args
        bad = np.isinf(x1) | np.isinf(x2)
        if bad.any():
            result = np.where(bad, np.floor(np.divide(x1, x2)), result).astype(result.dtype)
    return result


def binary_scalar(op: BinaryScalar, args: Sequence[Array], buffers: Sequence[Buffer]) -> Array:
    (x,) = args
    scalar = scalar_array(op.scalar, x)
    return _binary(op.op, (scalar, x) if op.scalar_first else (x, scalar))


def scalar_array(scalar: Scalar, like: Array) -> Array:
    """The 0-d array a Python scalar becomes beside ``like`` (``operand_dtype``): the
    op then computes exactly what a scalar sent as its own ``full`` op computed."""
    value = scalar_to_python(scalar)
    return np.asarray(value, dtype=to_numpy(scalar_dtype(value, _wire(like))))


def binary_inplace(
    op: InPlaceBinary | InPlaceBinaryScalar,
    args: Sequence[Array],
    buffers: Sequence[Buffer],
    in_place: bool = False,
) -> Array:
    """``target op= other`` (or ``op= scalar``): written into ``target`` when ``in_place`` (the
    store made its memory safe to write), else into a copy (a read-only view). numpy's ``out=``
    where the ufunc's own loop is the whole op (no temporary); through the op's result
    otherwise."""
    if isinstance(op, InPlaceBinaryScalar):
        (target,) = args
        other = scalar_array(op.scalar, target)
    else:
        target, other = args
    out = target if in_place and target.flags.writeable else target.copy()
    name = op.op
    dtypes = (_wire(out), _wire(other))
    if name in _OUT_SAFE and not _needs_temporary(name, dtypes[0], dtypes):
        if elementwise_rule(name, dtypes)[1] is None:
            fn: Callable[..., Array] = getattr(np, name)
            fn(out, other, out=out, casting="same_kind")  # numpy buffers overlapping inputs
            return out
    out[...] = _binary(name, (out, other))
    return out


def inplace_call(op: AnyOp, dtypes: Sequence[DType]) -> Runner | None:
    """:func:`binary_inplace` of ``op`` on a writeable target of ``dtypes[0]`` (and an operand
    array of ``dtypes[1]``), written in place, as one prepared runner where numpy's ``out=``
    is the whole op: for a caller that caches it per op name, input metas and a scalar's type,
    so that each op skips the dtype rules. None: call :func:`binary_inplace`."""
    if type(op) is InPlaceBinaryScalar:
        if type(op.scalar) not in (bool, int, float):  # a complex one travels as ComplexValue
            return None
        scalar = scalar_dtype(scalar_to_python(op.scalar), dtypes[0])  # by its type, not value
        pair = (dtypes[0], scalar)
    elif type(op) is InPlaceBinary:
        pair = (dtypes[0], dtypes[1])
    else:
        return None
    name = op.op
    if name not in _OUT_SAFE or _needs_temporary(name, pair[0], pair):
        return None
    if elementwise_rule(name, pair)[1] is not None:
        return None
    fn: Callable[..., Array] = getattr(np, name)
    if type(op) is InPlaceBinary:

        def with_array(o: Any, args: Sequence[Array], buffers: Sequence[Buffer]) -> Array:
            fn(args[0], args[1], out=args[0], casting="same_kind")
            return args[0]

        return with_array
    value_type = to_numpy(scalar)

    def with_scalar(o: Any, args: Sequence[Array], buffers: Sequence[Buffer]) -> Array:
        fn(args[0], np.asarray(o.scalar, value_type), out=args[0], casting="same_kind")
        return args[0]

    return with_scalar


def writes_into(op: AnyOp, dtypes: Sequence[DType]) -> bool:
    """Whether :func:`into_input` computes ``op`` on inputs of ``dtypes`` bit for bit as its
    runner does: a unary, binary (not matmul) or scalar op that is one ufunc call on the
    inputs as they are (no cast to a compute dtype, no fix-up after it), so numpy's ``out=``
    changes where the result lands and nothing else."""
    if type(op) is BinaryScalar:
        (x,) = dtypes
        scalar = scalar_dtype(scalar_to_python(op.scalar), x)
        dtypes = (scalar, x) if op.scalar_first else (x, scalar)
    elif type(op) is Unary:
        if op.op not in UNARY_UFUNCS:
            return False
    elif type(op) is not Binary or op.op == "matmul":
        return False
    result, compute = elementwise_rule(op.op, tuple(dtypes))
    if compute is not None or is_complex(result):  # complex results have unary fix-ups
        return False
    if len(dtypes) == 1:
        return True
    return op.op in _OUT_SAFE and not _needs_temporary(op.op, result, dtypes)


def one_call(op: AnyOp, dtypes: Sequence[DType]) -> Callable[[Any, Sequence[Array]], Array] | None:
    """``op``'s computation on inputs of ``dtypes`` as one prepared call, taking ``(op, args)``,
    where :func:`writes_into` holds (the op is one ufunc call): for a caller that caches it per
    (op name, input metas; a scalar's type and side), so that each op skips the dtype rules,
    and a scalar operand's dtype is found once. None: call the runner."""
    if not writes_into(op, dtypes):
        return None
    assert isinstance(op, Unary | Binary | BinaryScalar)  # all writes_into takes
    fn: Callable[..., Array] = getattr(np, op.op)
    if type(op) is Unary:
        return lambda _, args: fn(args[0])
    if type(op) is Binary:
        return lambda _, args: fn(args[0], args[1])
    assert type(op) is BinaryScalar
    if type(op.scalar) not in (bool, int, float):  # a complex one travels as ComplexValue
        return None
    value_type = to_numpy(scalar_dtype(scalar_to_python(op.scalar), dtypes[0]))
    if op.scalar_first:
        return lambda o, args: fn(np.asarray(o.scalar, value_type), args[0])
    return lambda o, args: fn(args[0], np.asarray(o.scalar, value_type))


def into_input(
    op: Unary | Binary | BinaryScalar,
    args: Sequence[Array],
    buffers: Sequence[Buffer],
    position: int,
) -> Array:
    """``op``'s result written into ``args[position]`` (numpy's ``out=``), where
    :func:`writes_into` holds and that input is the caller's to overwrite: a replay binds this
    runner only to a step at which the input dies and whose memory nothing else sees
    (``server/elision.py``). numpy handles an output that is also an input.

    Only where every input is C-contiguous, so that numpy's own result would be C-ordered as the
    input is: a Fortran-ordered temporary plus a C-ordered array is C-ordered in numpy, and a
    reduction of it sums in memory order, so its bits follow the layout. Else the runner's new
    array."""
    if not all(a.flags.c_contiguous for a in args):
        if isinstance(op, Unary):
            return unary(op, args, buffers)
        if isinstance(op, Binary):
            return binary(op, args, buffers)
        return binary_scalar(op, args, buffers)
    out = args[position]
    if type(op) is BinaryScalar:
        (x,) = args
        scalar = scalar_array(op.scalar, x)
        args = (scalar, x) if op.scalar_first else (x, scalar)
    fn: Callable[..., Array] = getattr(np, op.op)
    return fn(*args, out=out)


UNARY_UFUNCS = frozenset(n for n in get_args(UnaryName) if isinstance(getattr(np, n), np.ufunc))


def _needs_temporary(name: str, result: DType, dtypes: Sequence[DType]) -> bool:
    """Whether ``name`` on inputs of ``dtypes`` giving ``result`` must run into a temporary
    rather than ``out=``: floor_divide on floats (a Note: fix follows the ufunc) and integer
    pow, whose loop can raise part-way (negative exponents), when numpy has already copied its
    buffered garbage into ``out``."""
    if name == "floor_divide":
        return is_floating(result)
    return name == "pow" and any(is_integer(d) or is_bool(d) for d in (result, *dtypes))


# The binary ops whose ufunc alone computes them (no Note: fix after it), so out= is exact.
_OUT_SAFE = frozenset(
    (
        "add",
        "subtract",
        "multiply",
        "divide",
        "floor_divide",
        "remainder",
        "pow",
        "maximum",
        "minimum",
        "bitwise_and",
        "bitwise_or",
        "bitwise_xor",
        "bitwise_left_shift",
        "bitwise_right_shift",
        "logical_and",
        "logical_or",
        "logical_xor",
        "atan2",
        "hypot",
        "copysign",
        "logaddexp",
        "nextafter",
    )
)


def where(op: Where, args: Sequence[Array], buffers: Sequence[Buffer]) -> Array:
    condition, x1, x2 = args
    return np.where(condition, x1, x2)


def astype(op: AsType, args: Sequence[Array], buffers: Sequence[Buffer]) -> Array:
    (x,) = args
    if is_complex(_wire(x)) and not is_complex(op.dtype):
        x = x.real  # Note: numpy warns and drops the imaginary part; we drop it silently
    return x.astype(to_numpy(op.dtype))


RUNNERS: dict[type, Runner] = {
    Unary: unary,
    Binary: binary,
    BinaryScalar: binary_scalar,
    Where: where,
    AsType: astype,
}
# binary_inplace is called by executor.run itself, with in_place (as indexing.setitem is)
