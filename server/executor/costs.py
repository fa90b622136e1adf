"""What an op costs numpy, counted before it runs: :func:`cost`, in element operations.

An element operation is about a nanosecond of numpy's time on the machine the factors were
measured on (a 2-core Xeon VM, numpy 2.4 with OpenBLAS, its default threads); ``add`` counts 1
an element. Each family's factor is about the most measured per unit of its work, rounded up,
so on a quiet machine the count errs high, within a few times of the truth; on a busy one,
BLAS and LAPACK (which use every core) run slower than counted. The figures the factors rest
on are in bench/REASONS.md, 'The op cost model'.

The session uses it twice (``server/session.py``): an op that costs more than ``INLINE_COST``
runs in a worker thread, never on the event loop, and one that costs more than
``Limits.max_op_cost`` (``--max-op-cost``) is refused before numpy runs (``limit_exceeded``).

What each family counts:

- element-wise: 1 an element for most ops, more for the transcendental functions and integer
  division (``uint64`` inputs, converted to float first, are the slowest) and for complex
  inputs;
- ``unique_*`` (``np.unique_all``) and sorting: per n log2 n, plus a call's own time for
  ``unique_*``; ``searchsorted`` per query and log2 n;
- ``fft``: per n log2 n, more where n has a prime factor above 11 (numpy's FFT has its own
  passes for 2, 3, 5, 7 and 11; any other factor takes a generic pass or Bluestein's
  algorithm), plus a call's own time;
- ``matmul``: per multiply-add, least for float32 and float64 (BLAS, which numpy uses for any
  layout, copying a strided operand first), more for complex, most for integer and bool dtypes
  (numpy's own loop); a matrix-vector product reads its matrix once (about 1 an element read);
- ``linalg`` factorizations: per m n max(m, n) (``svd``, ``pinv`` the most), plus a call's own
  time, which dominates for tiny matrices;
- the neural-network extension: a convolution per multiply-add at the rate BLAS keeps on its
  large products (half matmul's), plus the elements it moves (its window matrix, or each
  tap's product scattered) and a call's own time; pooling per window element (several for
  max pooling's gradient), plus its calls, one a tap; batch norm, softmax and random draws
  per element.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from protocol import TensorMeta
from protocol.ops import (
    FFT,
    AnyOp,
    BatchNorm,
    Binary,
    BinaryScalar,
    Conv,
    Cumulative,
    FromBuffer,
    GetItem,
    InPlaceBinary,
    InPlaceBinaryScalar,
    Linalg,
    Linspace,
    Nonzero,
    Pool,
    PoolBackward,
    Random,
    Reduce,
    Repeat,
    SearchSorted,
    SetItem,
    Softmax,
    Sort,
    Take,
    Tile,
    Unary,
    Unique,
    Where,
)

from .base import Array

# Element-wise ops by what one element costs (the most over the real dtypes): 1 unless named.
# The slowest: transcendental functions and integer division.
_SLOW = frozenset(
    (
        "acosh",
        "atanh",
        "cos",
        "sin",
        "log",
        "log2",
        "log10",
        "pow",
        "floor_divide",
        "remainder",
        "logaddexp",
        "hypot",
        "nextafter",
    )
)
# The next: the other transcendental functions, roots and float division.
_MEDIUM = frozenset(
    (
        "asin",
        "acos",
        "asinh",
        "atan",
        "tan",
        "tanh",
        "sinh",
        "cosh",
        "exp",
        "expm1",
        "log1p",
        "sqrt",
        "signbit",
        "atan2",
        "copysign",
        "divide",
        "reciprocal",
    )
)
# ... of which these are cheap on float inputs (SIMD loops; integers convert first)
_FAST_ON_FLOATS = _MEDIUM - {"asin", "acos", "log1p"}
SLOW_ELEMENT, MEDIUM_ELEMENT, FLOAT_ELEMENT = 32, 8, 2
COMPLEX_ELEMENT, COMPLEX_SLOW_ELEMENT = 16, 192  # complex operands: plain ops, the others
_COMPLEX_SLOW = (_SLOW | _MEDIUM) - {"divide", "reciprocal"}  # complex divide: a plain op

# A multiply-add of matmul (and tensordot), in sixteenths of an element operation, by the
# result's dtype: BLAS for float and complex, numpy's loop for the rest.
_MADD_16THS = {"float32": 1, "float64": 2, "complex64": 4, "complex128": 4}
LOOP_MADD_16THS = 32

UNIQUE_CALL = 1 << 15  # np.unique_all's own time, even for one element
# per element and log2 of the length; unique_* as it runs on a loaded machine
UNIQUE_FACTOR, SORT_FACTOR, SEARCH_FACTOR = 16, 8, 16
FFT_CALL, FFT_ELEMENT = 1 << 14, 16  # a call's own time; each element's
# per element and log2 of the length (see _smooth); a prime length as it runs on a loaded
# machine
FFT_SMOOTH, FFT_GENERIC = 2, 24
CROSS_ELEMENT = 16  # numpy's cross is a dozen small ops
GATHER_FACTOR = 4  # an element read at an index (take, integer-array and mask indexing, where)
LINALG_CALL, LINALG_MATRIX = 1 << 16, 1 << 12  # a call's own time; a matrix's
_SVD_LIKE = frozenset(("svd", "svdvals", "pinv", "matrix_rank"))
# per m n max(m, n): twice the most measured on a quiet machine (n = 32 to 1024)
SVD_FACTOR, FACTORIZATION_FACTOR = 4, 2
_FACTORIZATIONS = frozenset(
    ("cholesky", "det", "slogdet", "inv", "eigh", "eigvalsh", "qr", "solve", *_SVD_LIKE)
)
# The neural-network extension (bench/REASONS.md, 'The op cost model', its nn rows): a
# convolution's multiply-add in sixty-fourths, by dtype (BLAS on large, well-shaped products);
# a call's own time (a few dozen numpy calls), a pooling's and each of its taps'; per window
# element of the gradients; per element of batch norm and of random draws.
_CONV_MADD_64THS = {"float32": 2, "float64": 4}
CONV_CALL, POOL_CALL, POOL_TAP = 1 << 16, 1 << 15, 1 << 10
TRANSPOSE_MOVED = 2  # a tap's product written, then added into a strided slice
POOL_MAX_BACKWARD, POOL_AVG_BACKWARD = 8, 2
BATCH_NORM_ELEMENT, RANDOM_UNIFORM, RANDOM_NORMAL = 3, 6, 16


def cost(op: AnyOp, meta: TensorMeta, args: Sequence[Array]) -> int:
    """The element operations numpy will do for ``op`` on ``args`` (arrays of its inputs, or of
    their shapes and dtypes: only ``shape``, ``size``, ``ndim`` and ``dtype`` are read), whose
    first output is ``meta`` (an ``UNKNOWN`` dim counts as none). At least the elements of its
    largest input or output, which every op reads or writes.

    An upload costs nothing: the decoder received its bytes into the array it becomes (a
    message of one frame, at most 256 KiB, is copied once), and a worker thread would cost
    a thread hop per uploaded tensor (bench/REASONS.md, 'The op cost model')."""
    if type(op) is FromBuffer:
        return 0
    size = max(0, math.prod(meta.shape))  # not np.prod: this runs per op, and np.prod is slower
    for a in args:
        size = max(size, a.size)
    family = _FAMILIES.get(type(op))
    return size if family is None else family(op, meta, args, size)


def _log2(n: int) -> int:
    """log2 ``n`` rounded up, at least 1."""
    return max(1, (n - 1).bit_length())


def _elementwise(op: Any, meta: TensorMeta, args: Sequence[Array], size: int) -> int:
    name: str = op.op
    if name == "matmul":
        return _matmul(meta, args, size)
    complex_ = meta.dtype.startswith("complex") or any(a.dtype.kind == "c" for a in args)
    if complex_:
        factor = COMPLEX_SLOW_ELEMENT if name in _COMPLEX_SLOW else COMPLEX_ELEMENT
    elif name in _SLOW:
        factor = SLOW_ELEMENT
    elif name in _FAST_ON_FLOATS and all(a.dtype.kind == "f" for a in args):
        factor = FLOAT_ELEMENT
    else:
        factor = MEDIUM_ELEMENT if name in _MEDIUM else 1
    return size * factor


def _matmul(meta: TensorMeta, args: Sequence[Array], size: int) -> int:
    """Multiply-adds at the dtype's rate, plus every operand element each product reads (what
    a matrix-vector product costs: its matrix is read once), plus the result written twice."""
    x1, x2 = args
    k = int(x1.shape[-1]) if x1.ndim else 1
    m = int(x1.shape[-2]) if x1.ndim >= 2 else 1
    n = int(x2.shape[-1]) if x2.ndim >= 2 else 1
    out = max(0, math.prod(meta.shape))
    products = out // (m * n) if m * n else 0  # the broadcast batch
    madds = out * k * _MADD_16THS.get(meta.dtype, LOOP_MADD_16THS) // 16
    return madds + products * (m + n) * k + 2 * size


def _unique(op: Unique, meta: TensorMeta, args: Sequence[Array], size: int) -> int:
    n = args[0].size
    return UNIQUE_CALL + n * UNIQUE_FACTOR * _log2(n) + size


def _sort(op: Sort, meta: TensorMeta, args: Sequence[Array], size: int) -> int:
    x = args[0]
    length = int(x.shape[op.axis]) if x.ndim else 1
    return size * (SORT_FACTOR * _log2(length) + 4)  # + 4: a descending order's flips


def _searchsorted(op: SearchSorted, meta: TensorMeta, args: Sequence[Array], size: int) -> int:
    x1, x2 = args  # both are cast to their common dtype first
    return x1.size + x2.size * (1 + SEARCH_FACTOR * _log2(x1.size))


def _gather(op: Any, meta: TensorMeta, args: Sequence[Array], size: int) -> int:
    """Ops that read elements at indices or through a mask: ``take``, ``where``, ``nonzero``,
    and indexing with arrays (basic indexing makes a view: it counts its elements once)."""
    if isinstance(op, GetItem | SetItem) and len(args) == (1 if isinstance(op, GetItem) else 2):
        return size
    return size * GATHER_FACTOR


def _fft(op: FFT, meta: TensorMeta, args: Sequence[Array], size: int) -> int:
    if op.op in ("fftshift", "ifftshift"):
        return size
    x = args[0]
    if op.op.endswith("n"):
        axes = tuple(range(x.ndim)) if op.axes is None else op.axes
    else:
        axes = (op.axes[0] if op.axes else -1,)
    lengths = op.n or (None,) * len(axes)
    per_element = FFT_ELEMENT
    for axis, n in zip(axes, lengths, strict=False):  # as inferred: one length an axis
        # the transform's length: n, else the input's (the output's, for irfft and hfft)
        length = n or max(int(x.shape[axis]), meta.shape[axis])
        per_element += (FFT_SMOOTH if _smooth(length) else FFT_GENERIC) * _log2(length)
    return FFT_CALL + size * per_element


def _smooth(n: int) -> bool:
    """``n`` has no prime factor above 11: numpy's FFT has a pass of its own for each (2, 3, 4,
    5, 7, 11); any other factor takes a generic pass or Bluestein's algorithm, several times
    slower."""
    if n < 1:
        return True
    n >>= (n & -n).bit_length() - 1  # the factors 2 at once
    for p in (3, 5, 7, 11):
        while n % p == 0:
            n //= p
    return n == 1


def _linalg(op: Linalg, meta: TensorMeta, args: Sequence[Array], size: int) -> int:
    name, x = op.op, args[0]
    if name in ("tensordot", "vecdot", "outer", "cross"):
        return _products(op, meta, args, size)
    if name == "matrix_norm" and op.ord not in ("nuc", 2, -2):
        return 2 * size
    if name == "vector_norm":
        return size * (2 if op.ord in (None, 1, 2, 0, math.inf, -math.inf) else SLOW_ELEMENT)
    if name not in _FACTORIZATIONS and name not in ("matrix_power", "matrix_norm"):
        return size  # diagonal, trace
    m, n = int(x.shape[-2]), int(x.shape[-1])
    matrices = x.size // (m * n) if m * n else 0
    if name == "solve":  # one factorization per matrix of the broadcast batch, k columns each
        b = args[1]
        k = int(b.shape[-1]) if b.ndim >= 2 else 1
        matrices = max(0, math.prod(meta.shape)) // (m * k) if m * k else 0
        return LINALG_CALL + matrices * (m * m * (m + k) + 16 * m * m + LINALG_MATRIX) + size
    if name == "matrix_power":  # squarings and products: 2 log2 |n| matmuls, an inverse first
        madd = _MADD_16THS.get(meta.dtype, LOOP_MADD_16THS)
        product = m**3 * madd // 16 + 2 * m * m
        inverse = m**3 + LINALG_MATRIX if op.n < 0 else 0
        steps = 2 * abs(op.n).bit_length()
        return LINALG_CALL + matrices * (steps * product + inverse) + 2 * size
    factor = SVD_FACTOR if name in _SVD_LIKE or name == "matrix_norm" else FACTORIZATION_FACTOR
    per_matrix = factor * m * n * max(m, n) + 32 * m * n + LINALG_MATRIX
    return LINALG_CALL + matrices * per_matrix + size


def _products(op: Linalg, meta: TensorMeta, args: Sequence[Array], size: int) -> int:
    """``tensordot`` (its inputs copied to matrices, then one BLAS product, or numpy's loop for
    integers), ``vecdot``, ``outer`` and ``cross``."""
    a, b = args
    if op.op == "tensordot":
        contracted = math.prod(int(a.shape[axis]) for axis in op.axes1)
        madd = _MADD_16THS.get(meta.dtype, LOOP_MADD_16THS)
        return max(0, math.prod(meta.shape)) * contracted * madd // 16 + a.size + b.size + size
    if op.op == "cross":
        return size * CROSS_ELEMENT
    return 2 * size


def _reduce(op: Reduce, meta: TensorMeta, args: Sequence[Array], size: int) -> int:
    factor = 4 if op.op in ("var", "std") else 1  # passes over the data
    return size * factor * (2 if args[0].dtype.kind == "c" else 1)


def _conv(op: Conv, meta: TensorMeta, args: Sequence[Array], size: int) -> int:
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


def _pool(op: Pool | PoolBackward, meta: TensorMeta, args: Sequence[Array], size: int) -> int:
    """A call's own time and each tap's (a few numpy calls a tap), each window's elements
    read once, for the gradient of max pooling a few passes each (compared with the maximum,
    masked, added back), and the input and result written twice."""
    taps = math.prod(op.kernel)
    if isinstance(op, Pool):
        return POOL_CALL + taps * POOL_TAP + max(0, math.prod(meta.shape)) * taps + 2 * size
    per_window = POOL_MAX_BACKWARD if op.op == "max" else POOL_AVG_BACKWARD
    calls = POOL_CALL + taps * 4 * POOL_TAP
    return calls + args[1].size * taps * per_window + 2 * size


def _random(op: Random, meta: TensorMeta, args: Sequence[Array], size: int) -> int:
    return size * (RANDOM_NORMAL if op.op == "normal" else RANDOM_UNIFORM)


Family = Callable[[Any, TensorMeta, Sequence[Array], int], int]


def _times(factor: int) -> Family:
    return lambda op, meta, args, size: size * factor


_FAMILIES: dict[type, Family] = {
    Unary: _elementwise,
    Binary: _elementwise,
    BinaryScalar: _elementwise,
    InPlaceBinary: _elementwise,
    InPlaceBinaryScalar: _elementwise,
    Unique: _unique,
    Sort: _sort,
    SearchSorted: _searchsorted,
    Take: _gather,
    GetItem: _gather,
    SetItem: _gather,
    Where: _gather,
    Nonzero: _gather,
    FFT: _fft,
    Linalg: _linalg,
    Reduce: _reduce,
    Cumulative: _times(3),
    Repeat: _times(2),
    Tile: _times(2),
    Linspace: _times(2),
    Conv: _conv,
    Pool: _pool,
    PoolBackward: _pool,
    BatchNorm: _times(BATCH_NORM_ELEMENT),
    Softmax: _times(MEDIUM_ELEMENT),
    Random: _random,
}
