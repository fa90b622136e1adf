"""What the standard's two extensions, ``linalg`` and ``fft``, cost numpy: the families of
:func:`~server.executor.costs.cost` for them, in the same element operations (its docstring
says what each counts; bench/REASONS.md, 'The op cost model', gives the figures)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from protocol import TensorMeta
from protocol.ops import FFT, Linalg, broadcast_shapes

from .base import Array

# A multiply-add of matmul (and tensordot), in sixteenths of an element operation, by the
# result's dtype: BLAS for float and complex, numpy's loop for the rest.
MADD_16THS = {"float32": 1, "float64": 2, "complex64": 4, "complex128": 4}
LOOP_MADD_16THS = 32
PRODUCT_CALL = 128  # one matrix product of a batch: numpy's per-product time for tiny ones
VECDOT_MADD = 1  # a multiply-add of vecdot, over its operands broadcast together (any dtype)

FFT_CALL, FFT_ELEMENT = 1 << 14, 16  # a call's own time; each element's
# per element and log2 of the length (see _smooth); a prime length as it runs on a loaded
# machine
FFT_SMOOTH, FFT_GENERIC = 2, 24
FFT_TRANSFORM = 64  # each 1-D transform of an axis (a short axis of many rows: one per row)
CROSS_ELEMENT = 16  # numpy's cross is a dozen small ops
NORM_POWER_ELEMENT = 32  # vector_norm of another order: a power of every (non-negative) element
LINALG_CALL, LINALG_MATRIX = 1 << 16, 1 << 12  # a call's own time; a matrix's
_SVD_LIKE = frozenset(("svd", "svdvals", "pinv", "matrix_rank"))
# per m n max(m, n): twice the most measured on a quiet machine (n = 32 to 1024)
SVD_FACTOR, FACTORIZATION_FACTOR = 4, 2
_FACTORIZATIONS = frozenset(
    ("cholesky", "det", "slogdet", "inv", "eigh", "eigvalsh", "qr", "solve", *_SVD_LIKE)
)


def log2(n: int) -> int:
    """log2 ``n`` rounded up, at least 1."""
    return max(1, (n - 1).bit_length())


def matmul(meta: TensorMeta, args: Sequence[Array], size: int) -> int:
    """Multiply-adds at the dtype's rate, plus every operand element each product reads (what
    a matrix-vector product costs: its matrix is read once) and each product's own time, plus
    the result written twice."""
    x1, x2 = args
    k = int(x1.shape[-1]) if x1.ndim else 1
    m = int(x1.shape[-2]) if x1.ndim >= 2 else 1
    n = int(x2.shape[-1]) if x2.ndim >= 2 else 1
    out = max(0, math.prod(meta.shape))
    products = out // (m * n) if m * n else 0  # the broadcast batch
    madds = out * k * MADD_16THS.get(meta.dtype, LOOP_MADD_16THS) // 16
    return madds + products * ((m + n) * k + PRODUCT_CALL) + 2 * size


def fft(op: FFT, meta: TensorMeta, args: Sequence[Array], size: int) -> int:
    """A call's own time, and per element each transformed axis's passes (n log2 n at the rate
    of the length's factors) plus its transforms' own time (one per row of the axis)."""
    if op.op in ("fftshift", "ifftshift"):
        return size
    x = args[0]
    if op.op.endswith("n"):
        axes = tuple(range(x.ndim)) if op.axes is None else op.axes
    else:
        axes = (op.axes[0] if op.axes else -1,)
    lengths = op.n or (None,) * len(axes)
    total = FFT_CALL + size * FFT_ELEMENT
    for axis, n in zip(axes, lengths, strict=False):  # as inferred: one length an axis
        # the transform's length: n, else the input's (the output's, for irfft and hfft)
        length = n or max(int(x.shape[axis]), meta.shape[axis])
        per_element = (FFT_SMOOTH if _smooth(length) else FFT_GENERIC) * log2(length)
        total += size * per_element + size // max(1, length) * FFT_TRANSFORM
    return total


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


def linalg(op: Linalg, meta: TensorMeta, args: Sequence[Array], size: int) -> int:
    name, x = op.op, args[0]
    if name in ("tensordot", "vecdot", "outer", "cross"):
        return _products(op, meta, args, size)
    if name == "matrix_norm" and op.ord not in ("nuc", 2, -2):
        return 2 * size
    if name == "vector_norm":
        plain = op.ord in (None, 1, 2, 0, math.inf, -math.inf)
        return size * (2 if plain else NORM_POWER_ELEMENT)
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
        madd = MADD_16THS.get(meta.dtype, LOOP_MADD_16THS)
        product = m**3 * madd // 16 + 2 * m * m + PRODUCT_CALL
        inverse = m**3 + LINALG_MATRIX if op.n < 0 else 0
        steps = 2 * abs(op.n).bit_length()
        return LINALG_CALL + matrices * (steps * product + inverse) + 2 * size
    factor = SVD_FACTOR if name in _SVD_LIKE or name == "matrix_norm" else FACTORIZATION_FACTOR
    per_matrix = factor * m * n * max(m, n) + 32 * m * n + LINALG_MATRIX
    return LINALG_CALL + matrices * per_matrix + size


def _products(op: Linalg, meta: TensorMeta, args: Sequence[Array], size: int) -> int:
    """``tensordot`` (its inputs copied to matrices, then one BLAS product, or numpy's loop for
    integers), ``vecdot`` (a multiply-add for every element of its operands broadcast together:
    (L, 1, L) and (1, L, L) make L**3 of them for an (L, L) result), ``outer`` and ``cross``."""
    a, b = args
    if op.op == "tensordot":
        contracted = math.prod(int(a.shape[axis]) for axis in op.axes1)
        madd = MADD_16THS.get(meta.dtype, LOOP_MADD_16THS)
        return max(0, math.prod(meta.shape)) * contracted * madd // 16 + a.size + b.size + size
    if op.op == "cross":
        return size * CROSS_ELEMENT
    if op.op == "vecdot":
        madds = max(0, math.prod(broadcast_shapes(tuple(a.shape), tuple(b.shape))))
        return madds * VECDOT_MADD + 2 * size
    return 2 * size
