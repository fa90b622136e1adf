"""What an op costs numpy, counted before it runs: :func:`cost`, in element operations.

An element operation is about a nanosecond of numpy's time on the machine the factors were
measured on (a 2-core Xeon VM, numpy 2.4 with OpenBLAS, its default threads): ``add`` takes
0.1-0.5 ns an element on arrays in cache and 1-2 ns on arrays that are not (or memory touched
for the first time), and counts 1. Each family's factor is about the most measured per unit of
its work, rounded up, so on a quiet machine the count errs high, within a few times of the
truth; on a busy one, BLAS and LAPACK (which use every core) ran 2-6x slower than counted.
The session uses it twice (``server/session.py``): an op that costs more than ``INLINE_COST``
runs in a worker thread, never on the event loop, and one that costs more than
``Limits.max_op_cost`` (``--max-op-cost``) is refused before numpy runs (``limit_exceeded``).

What the counts rest on (ns, measured at 65,536 elements unless said):

- element-wise: 0.05-1.5 for most ops; up to 19 for ``floor_divide``, ``logaddexp`` and the
  trigonometric and logarithmic functions (``uint64`` inputs, converted to float first, are the
  slowest); complex inputs 1-15 for the plain ops and up to 176 (``acosh`` of ``complex64``)
  for the others;
- ``unique_*`` (``np.unique_all``): 6.5 per n log2 n, plus about 10 us a call whatever n;
  sorting 3.6-4.8 per n log2 n (stable); ``searchsorted`` 18 per query and log2 n;
- ``fft``: 0.7-1.6 per n log2 n where n has only the factors 2, 3, 5, 7 and 11 (numpy's own
  passes), 5-13 where it has a larger prime factor (a generic pass or Bluestein's algorithm);
  transforms of 1-2 points 6-7 an element, and 3.5 us a call;
- ``matmul``: 0.01-0.05 per multiply-add for float32 and float64 (BLAS, which numpy uses for
  any layout, copying a strided operand first), 0.06-0.1 for complex, 0.4-1.4 for integer and
  bool dtypes (numpy's own loop); a matrix-vector product reads its matrix once (about 1 an
  element read);
- ``linalg`` factorizations: 0.02-0.4 per m n max(m, n) at n = 1024 (``svd``, ``pinv`` the
  most), up to 3 per n**3 at n = 32, and 2-23 us a call for tiny matrices.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from protocol import TensorMeta
from protocol.ops import (
    FFT,
    AnyOp,
    Binary,
    BinaryScalar,
    Cumulative,
    FromBuffer,
    GetItem,
    InPlaceBinary,
    InPlaceBinaryScalar,
    Linalg,
    Linspace,
    Nonzero,
    Reduce,
    Repeat,
    SearchSorted,
    SetItem,
    Sort,
    Take,
    Tile,
    Unary,
    Unique,
    Where,
)

from .base import Array

# Element-wise ops by what one element costs (the most over the real dtypes): 1 unless named.
_SLOW = frozenset(
    ("acosh", "atanh", "cos", "sin", "log", "log2", "log10", "pow", "floor_divide",
     "remainder", "logaddexp", "hypot", "nextafter")
)  # fmt: skip  # 8-19 ns (pow of uint64: 29)
_MEDIUM = frozenset(
    ("asin", "acos", "asinh", "atan", "tan", "tanh", "sinh", "cosh", "exp", "expm1", "log1p",
     "sqrt", "signbit", "atan2", "copysign", "divide", "reciprocal")
)  # fmt: skip  # 3-8 ns
# ... of which these take at most 2 ns on float inputs (SIMD loops; integers convert first)
_FAST_ON_FLOATS = _MEDIUM - {"asin", "acos", "log1p"}
SLOW_ELEMENT, MEDIUM_ELEMENT, FLOAT_ELEMENT = 32, 8, 2
COMPLEX_ELEMENT, COMPLEX_SLOW_ELEMENT = 16, 192  # complex operands: plain ops, the others
_COMPLEX_SLOW = (_SLOW | _MEDIUM) - {"divide", "reciprocal"}  # 4-5 ns for complex

# A multiply-add of matmul (and tensordot), in sixteenths of an element operation, by the
# result's dtype: BLAS for float and complex, numpy's loop for the rest.
_MADD_16THS = {"float32": 1, "float64": 2, "complex64": 4, "complex128": 4}
LOOP_MADD_16THS = 32

UNIQUE_CALL = 1 << 15  # np.unique_all's own time, 10-24 us, even for one element
# per element and log2 of the length; unique_* as the issue measured it on a loaded machine
# (14 ms for 65,536 elements, 5-7 here)
UNIQUE_FACTOR, SORT_FACTOR, SEARCH_FACTOR = 16, 8, 16
FFT_CALL, FFT_ELEMENT = 1 << 14, 16  # a call's own time (4-10 us); each element's
# per element and log2 of the length (see _smooth); a prime length as the issue measured it
# on a loaded machine (20 ms for 65,521, 7-8 here)
FFT_SMOOTH, FFT_GENERIC = 2, 24
CROSS_ELEMENT = 16  # 7-10 ns an element: numpy's cross is a dozen small ops
GATHER_FACTOR = 4  # an element read at an index (take, integer-array and mask indexing, where)
LINALG_CALL, LINALG_MATRIX = 1 << 16, 1 << 12  # a call's own time (up to 41 us); a matrix's
_SVD_LIKE = frozenset(("svd", "svdvals", "pinv", "matrix_rank"))
# per m n max(m, n): twice the most measured on a quiet machine (n = 32 to 1024)
SVD_FACTOR, FACTORIZATION_FACTOR = 4, 2
_FACTORIZATIONS = frozenset(
    ("cholesky", "det", "slogdet", "inv", "eigh", "eigvalsh", "qr", "solve", *_SVD_LIKE)
)


def cost(op: AnyOp, meta: TensorMeta, args: Sequence[Array]) -> int:
    """The element operations numpy will do for ``op`` on ``args`` (arrays of its inputs, or of
    their shapes and dtypes: only ``shape``, ``size``, ``ndim`` and ``dtype`` are read), whose
    first output is ``meta`` (an ``UNKNOWN`` dim counts as none). At least the elements of its
    largest input or output, which every op reads or writes.

    An upload costs nothing: the decoder received its bytes into the array it becomes (a
    message of one frame, at most 256 KiB, is copied once). Sending it to a worker thread
    cost a thread hop, about 1 ms on a busy 2-core machine, per uploaded tensor."""
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
    5, 7, 11); any other factor takes a generic pass or Bluestein's algorithm, 5-10x slower."""
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
}
