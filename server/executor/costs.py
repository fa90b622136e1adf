"""What an op costs numpy, counted before it runs: :func:`cost`, in element operations.

An element operation is about a nanosecond of numpy's time on the machine the factors were
measured on (a 2-core VM, numpy 2.4 with OpenBLAS); ``add`` counts 1 an element. Each family's
factor is about the most measured per unit of its work, rounded up, so on a quiet machine the
count errs high: ``python -m bench.op_costs`` times every op at plain shapes and at those
where its work is not proportional to its largest array, and bench/REASONS.md ('The op cost
model') states the bound it measured and its exceptions (BLAS and LAPACK on a busy machine,
which use every core; an operand read against its layout, which no shape shows).

The session uses it twice (``server/session.py``): an op that costs more than ``INLINE_COST``
runs in a worker thread, never on the event loop, and one that costs more than
``Limits.max_op_cost`` (``--max-op-cost``) is refused before numpy runs (``limit_exceeded``).

What each family counts, beyond the elements of the op's largest array:

- element-wise: 1 an element for most ops, more for the transcendental functions, ``pow``
  (a negative base to an integral power takes libm's slow path) and integer division
  (``uint64`` inputs, converted to float first, are the slowest) and for complex inputs; a
  broadcast operand, each run of numpy's inner loop along the last axis;
- reductions and cumulative ops: passes over the data, and each run of the inner loop (a
  short last axis of many rows costs one per row);
- ``unique_*`` (``np.unique_all``) and sorting: per n log2 n, plus a call's own time for
  ``unique_*``; ``searchsorted`` per query and log2 n; ``nonzero`` each index it writes;
- indexing with arrays, ``take``, ``where``: per element gathered, and per index array;
- ``concat`` and ``stack`` each input, ``roll`` each block it copies (two per rolled axis, in
  all combinations), ``repeat`` by a tensor each input element;
- ``fft``: per n log2 n, more where n has a prime factor above 11 (numpy's FFT has its own
  passes for 2, 3, 5, 7 and 11; any other factor takes a generic pass or Bluestein's
  algorithm), plus each 1-D transform's and a call's own time;
- ``matmul``: per multiply-add, least for float32 and float64 (BLAS, which numpy uses for any
  layout, copying a strided operand first), more for complex, most for integer and bool dtypes
  (numpy's own loop), plus each product's own time; a matrix-vector product reads its matrix
  once (about 1 an element read); ``vecdot`` each element of its operands broadcast together;
- ``linalg`` factorizations: per m n max(m, n) (``svd``, ``pinv`` the most), plus a call's own
  time, which dominates for tiny matrices;
- the neural-network extension: a convolution per multiply-add at the rate BLAS keeps on its
  large products (half matmul's), plus the elements it moves (its window matrix, or each
  tap's product scattered) and a call's own time; pooling per window element (several for
  max pooling's gradient), plus its calls, one a tap; batch norm, softmax and random draws
  per element; the optimizer extension's chains, the sum of their element-wise ops.

The families of the two extensions are in ``costs_extensions.py``, the neural-network
extension's in ``costs_nn.py``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from protocol import TensorMeta
from protocol.ops import (
    FFT,
    AdamDirection,
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
    Join,
    Linalg,
    Linspace,
    MomentUpdate,
    Nonzero,
    Pool,
    PoolBackward,
    Random,
    Reduce,
    Repeat,
    Roll,
    SearchSorted,
    SetItem,
    Softmax,
    Sort,
    Take,
    Tile,
    Triangle,
    Unary,
    Unique,
    Where,
)

from . import costs_extensions as extensions
from . import costs_nn as nn
from .base import Array

# Element-wise ops by what one element costs (the most over the real dtypes): 1 unless named.
# The slowest: transcendental functions and integer division.
_SLOW = frozenset(
    "acosh atanh cos sin log log2 log10 floor_divide remainder logaddexp hypot nextafter".split()
)
# The next: the other transcendental functions, roots and float division.
_MEDIUM = frozenset(
    "asin acos asinh atan tan tanh sinh cosh exp expm1 log1p sqrt signbit atan2 copysign divide "
    "reciprocal".split()
)
# ... of which these are cheap on float inputs (SIMD loops; integers convert first)
_FAST_ON_FLOATS = _MEDIUM - {"asin", "acos", "log1p"}
POW_ELEMENT, SLOW_ELEMENT, MEDIUM_ELEMENT, FLOAT_ELEMENT = 64, 32, 8, 2
COMPLEX_ELEMENT, COMPLEX_SLOW_ELEMENT = 16, 192  # complex operands: plain ops, the others
_COMPLEX_SLOW = (_SLOW | _MEDIUM | {"pow"}) - {"divide", "reciprocal"}  # complex divide: plain
# numpy's inner loop runs along an array's last axis: each run of it costs its own time, which
# dominates a short last axis of many rows (a reduction's, or a broadcast operand's)
REDUCE_LOOP, BROADCAST_LOOP = 32, 8

UNIQUE_CALL = 1 << 15  # np.unique_all's own time, even for one element
# per element and log2 of the length; unique_* as it runs on a loaded machine
UNIQUE_FACTOR, SORT_FACTOR, SEARCH_FACTOR = 16, 8, 16
NONZERO_INDEX = 2  # an index written, per dimension and true element
GATHER_FACTOR = 4  # an element read at an index (take, integer-array and mask indexing, where)
INDEX_ARRAY = 1  # ... and each index array read for it
JOIN_INPUT = 1 << 11  # concat, stack: each input's own time (numpy takes each in Python)
ROLL_PIECE = 1 << 12  # roll: each block it copies, a slice assignment in Python
REPEAT_TENSOR_ELEMENT = 8  # repeat by a tensor: each input element's own copy
# the optimizer extension: its chains' element-wise ops, summed (sqrt and divide 2 on floats)
MOMENT_ELEMENT, MOMENT_SQUARED_ELEMENT, ADAM_DIRECTION_ELEMENT = 3, 4, 6


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


def _loops(shape: Sequence[int], size: int) -> int:
    """The runs of numpy's inner loop over ``size`` elements of ``shape``: one per row of its
    last axis longer than 1 (none for a 0-d or empty array)."""
    inner = next((int(d) for d in reversed(shape) if d > 1), 1)
    return size // inner


def _elementwise(op: Any, meta: TensorMeta, args: Sequence[Array], size: int) -> int:
    name: str = op.op
    if name == "matmul":
        return extensions.matmul(meta, args, size)
    complex_ = meta.dtype.startswith("complex") or any(a.dtype.kind == "c" for a in args)
    if complex_:
        factor = COMPLEX_SLOW_ELEMENT if name in _COMPLEX_SLOW else COMPLEX_ELEMENT
    elif name == "pow":
        factor = POW_ELEMENT
    elif name in _SLOW:
        factor = SLOW_ELEMENT
    elif name in _FAST_ON_FLOATS and all(a.dtype.kind == "f" for a in args):
        factor = FLOAT_ELEMENT
    else:
        factor = MEDIUM_ELEMENT if name in _MEDIUM else 1
    broadcast = any(a.size > 1 and tuple(a.shape) != meta.shape for a in args)
    return size * factor + (_loops(meta.shape, size) * BROADCAST_LOOP if broadcast else 0)


def _reduce(op: Reduce, meta: TensorMeta, args: Sequence[Array], size: int) -> int:
    x = args[0]
    factor = 4 if op.op in ("var", "std") else 1  # passes over the data
    loops = 0 if op.axis is None else _loops(x.shape, x.size) * factor
    return (size * factor + loops * REDUCE_LOOP) * (2 if x.dtype.kind == "c" else 1)


def _cumulative(op: Cumulative, meta: TensorMeta, args: Sequence[Array], size: int) -> int:
    x = args[0]
    loops = 0 if op.axis is None or x.ndim < 2 else _loops(x.shape, x.size)
    return 3 * size + loops * REDUCE_LOOP


def _unique(op: Unique, meta: TensorMeta, args: Sequence[Array], size: int) -> int:
    n = args[0].size
    return UNIQUE_CALL + n * UNIQUE_FACTOR * extensions.log2(n) + size


def _sort(op: Sort, meta: TensorMeta, args: Sequence[Array], size: int) -> int:
    x = args[0]
    length = int(x.shape[op.axis]) if x.ndim else 1
    return size * (SORT_FACTOR * extensions.log2(length) + 4)  # + 4: a descending order's flips


def _searchsorted(op: SearchSorted, meta: TensorMeta, args: Sequence[Array], size: int) -> int:
    x1, x2 = args  # both are cast to their common dtype first
    return x1.size + x2.size * (1 + SEARCH_FACTOR * extensions.log2(x1.size))


def _gather(op: Any, meta: TensorMeta, args: Sequence[Array], size: int) -> int:
    """Ops that read elements at indices or through a mask: ``take``, ``where``, and indexing
    with arrays (basic indexing makes a view: it counts its elements once), each index array
    read for every element gathered."""
    if isinstance(op, GetItem | SetItem):
        indices = len(args) - (1 if isinstance(op, GetItem) else 2)
        return size * (GATHER_FACTOR + INDEX_ARRAY * indices) if indices else size
    return size * GATHER_FACTOR


def _nonzero(op: Nonzero, meta: TensorMeta, args: Sequence[Array], size: int) -> int:
    """The input read through a mask, and an index written per dimension for each true element
    (the count resolved before this runs; unknown, every element)."""
    x = args[0]
    found = meta.shape[0] if meta.shape[0] >= 0 else x.size
    return size * GATHER_FACTOR + found * max(1, x.ndim) * NONZERO_INDEX


def _join(op: Join, meta: TensorMeta, args: Sequence[Array], size: int) -> int:
    return size + len(args) * JOIN_INPUT


def _roll(op: Roll, meta: TensorMeta, args: Sequence[Array], size: int) -> int:
    """numpy's ``roll`` copies 2**k blocks for k rolled axes (each axis with a shift that is not
    a multiple of its length splits every block in two), one slice assignment each."""
    x = args[0]
    if op.axis is None:
        return size + 2 * ROLL_PIECE
    by_axis = op.shift * len(op.axis) if len(op.shift) == 1 else op.shift  # as numpy pairs them
    shifts = dict.fromkeys(range(x.ndim), 0)
    for axis, shift in zip(op.axis, by_axis, strict=True):
        shifts[axis % x.ndim] += shift
    rolled = sum(1 for axis, shift in shifts.items() if shift % (int(x.shape[axis]) or 1))
    return size + (1 << rolled) * ROLL_PIECE


def _repeat(op: Repeat, meta: TensorMeta, args: Sequence[Array], size: int) -> int:
    return 2 * size + (args[0].size * REPEAT_TENSOR_ELEMENT if len(args) == 2 else 0)


Family = Callable[[Any, TensorMeta, Sequence[Array], int], int]


def _moment_update(op: MomentUpdate, meta: TensorMeta, args: Sequence[Array], size: int) -> int:
    return size * (MOMENT_SQUARED_ELEMENT if op.squared else MOMENT_ELEMENT)


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
    Nonzero: _nonzero,
    FFT: extensions.fft,
    Linalg: extensions.linalg,
    Reduce: _reduce,
    Cumulative: _cumulative,
    Join: _join,
    Roll: _roll,
    Repeat: _repeat,
    Tile: _times(2),
    Linspace: _times(2),
    Triangle: _times(2),
    Conv: nn.conv,
    Pool: nn.pool,
    PoolBackward: nn.pool,
    BatchNorm: _times(nn.BATCH_NORM_ELEMENT),
    Softmax: _times(nn.SOFTMAX_ELEMENT),
    Random: nn.random,
    MomentUpdate: _moment_update,
    AdamDirection: _times(ADAM_DIRECTION_ELEMENT),
}
