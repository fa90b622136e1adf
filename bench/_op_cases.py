"""The ops ``bench.op_costs`` times against the cost model, one family at a time: each at a
plain shape and at the shapes where an op's work is not proportional to its largest array
(broadcast operands, a short axis of many rows, batches of tiny matrices, many inputs, many
axes, prime lengths, data-dependent outputs), where a count of its arrays' elements would be
far below its time. ``everything`` adds more sizes."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, get_args

import numpy as np

from protocol.ops import (
    FFT,
    AdamDirection,
    AnyOp,
    Arange,
    AsType,
    Axes,
    Binary,
    BinaryName,
    BinaryScalar,
    BroadcastTo,
    Cumulative,
    Eye,
    Full,
    GetItem,
    InPlaceBinary,
    InPlaceBinaryScalar,
    Join,
    Linalg,
    Linspace,
    MomentUpdate,
    MoveAxis,
    Nonzero,
    PermuteDims,
    Reduce,
    ReduceName,
    Repeat,
    Reshape,
    Roll,
    SearchSorted,
    SetItem,
    Sort,
    Take,
    Tile,
    Triangle,
    Unary,
    UnaryName,
    Unique,
    Where,
)
from protocol.ops.indexing import ArrayIndex, SliceSpec

Array = np.ndarray[Any, Any]
Case = tuple[str, AnyOp, list[Array]]  # (what the inputs are, the op, its inputs)
OUT = 1 << 20  # an output id no input uses
# The cases with an operand read against its layout (a transposed view, larger than the cache):
# the model counts shapes, not strides, so these are the stated exception to its bound.
AGAINST_LAYOUT = frozenset(("1024^2 x + x.T", "1024^2 transposed"))
_RNG = np.random.default_rng(0)


def _random(shape: tuple[int, ...], dtype: str = "float64") -> Array:
    values = _RNG.standard_normal(shape)
    if dtype.startswith("complex"):
        values = values + 1j * _RNG.standard_normal(shape)
    if dtype in ("bool",):
        return values > 0
    if dtype.startswith(("int", "uint")):
        return (np.abs(values) * 100 + 1).astype(dtype)
    return values.astype(dtype)


def _each(*names: Any) -> tuple[Any, ...]:
    """``names``, typed as the op fields' literals take them."""
    return names


def _ids(n: int, first: int = 0) -> tuple[int, ...]:
    return tuple(range(first, first + n))


def creation(everything: bool) -> Iterator[Case]:
    n = 1 << 20
    yield "1 Mi float64", Full(out=OUT, shape=(n,), dtype="float64", value=1.5), []
    for dtype in _each("int64", "float64"):
        yield f"1 Mi {dtype}", Arange(out=OUT, start=0, stop=n, dtype=dtype), []
    yield "1024 x 1024", Eye(out=OUT, n_rows=1024, n_cols=1024, dtype="float64"), []
    for dtype in _each("float64", "complex128"):
        op = Linspace(out=OUT, start=0.0, stop=1.0, stop_imag=1.0, num=n, dtype=dtype)
        yield f"1 Mi {dtype}", op, []


_DTYPES = ("float32", "float64", "int64", "uint64", "complex64", "complex128", "bool")
_SHORT = ("float64", "uint64", "complex128")  # the dtypes of the short run: each op's slowest


def elementwise(everything: bool) -> Iterator[Case]:
    """Every unary and binary op on each dtype it takes (``everything``: all of them), with an
    array, a scalar and in place, and the shapes that cost more than their elements:
    broadcasting, a negative base's power, a transposed operand."""
    n = 1 << 18 if everything else 1 << 16
    inputs = {d: _random((n,), d) for d in _DTYPES}
    for dtype in _DTYPES if everything else _SHORT:
        yield from _each_op(f"{n >> 10} Ki {dtype}", inputs[dtype])
    add = Binary(op="add", out=OUT, x1=0, x2=1)
    yield "(512, 1) + (1, 512)", add, [_random((512, 1)), _random((1, 512))]
    yield "(64 Ki, 1) + (1, 2)", add, [_random((1 << 16, 1)), _random((1, 2))]
    yield "(64 Ki, 2) + (2,)", add, [_random((1 << 16, 2)), _random((2,))]
    square = _random((1024, 1024))  # against its transpose: one operand read across rows
    yield "1024^2 x + x.T", add, [square, square.T]
    cube = BinaryScalar(op="pow", out=OUT, x=0, scalar=3.0)
    yield "negative base ** 3", cube, [inputs["float64"]]
    where = Where(out=OUT, condition=0, x1=1, x2=2)
    yield f"{n >> 10} Ki float64", where, [inputs["bool"], inputs["float64"], inputs["float64"]]
    conversions = _each(("float64", "uint64"), ("int64", "float32"), ("complex128", "complex64"))
    for source, dtype in conversions:
        yield f"{source} to {dtype}", AsType(out=OUT, x=0, dtype=dtype), [inputs[source]]


def _each_op(label: str, x: Array) -> Iterator[Case]:
    scalar: bool | int | float = (
        3.0 if x.dtype.kind in "fc" else 3 if x.dtype.kind in "iu" else True
    )
    for name in get_args(UnaryName):
        yield label, Unary(op=name, out=OUT, x=0), [x]
    for name in get_args(BinaryName):
        if name == "matmul":
            continue  # the matmul family's
        yield label, Binary(op=name, out=OUT, x1=0, x2=1), [x, x]
        yield f"{label} and a scalar", BinaryScalar(op=name, out=OUT, x=0, scalar=scalar), [x]
        yield f"{label} in place", InPlaceBinary(op=name, out=0, x2=1), [x.copy(), x]
        in_place = InPlaceBinaryScalar(op=name, out=0, scalar=scalar)
        yield f"{label} in place, a scalar", in_place, [x.copy()]


def matmul(everything: bool) -> Iterator[Case]:
    op = Binary(op="matmul", out=OUT, x1=0, x2=1)
    for dtype, n in (("float32", 256), ("float64", 256), ("complex128", 128), ("int64", 96)):
        yield f"{n}^2 {dtype}", op, [_random((n, n), dtype), _random((n, n), dtype)]
    yield "4096 x (2, 2) batch", op, [_random((4096, 2, 2)), _random((4096, 2, 2))]
    yield "4096 x (8, 8) batch", op, [_random((4096, 8, 8)), _random((4096, 8, 8))]
    square = _random((256, 256))
    yield "256^2 @= 256^2 float64", InPlaceBinary(op="matmul", out=0, x2=1), [square, square]
    yield "(1024, 1024) @ (1024,)", op, [_random((1024, 1024)), _random((1024,))]
    yield (
        "(64, 1, 64, 64) @ (1, 64, 64, 64)",
        op,
        [_random((64, 1, 64, 64)), _random((1, 64, 64, 64))],
    )


def reductions(everything: bool) -> Iterator[Case]:
    n = 1 << 18
    flat, tall, c = _random((n,)), _random((n // 2, 2)), _random((n,), "complex128")
    for name in get_args(ReduceName):
        yield f"{n >> 10} Ki", Reduce(op=name, out=OUT, x=0), [flat]
        yield f"({n >> 11} Ki, 2) on axis -1", Reduce(op=name, out=OUT, x=0, axis=(-1,)), [tall]
    yield f"({n >> 11} Ki, 2) on axis 0", Reduce(op="sum", out=OUT, x=0, axis=(0,)), [tall]
    yield f"{n >> 10} Ki complex128", Reduce(op="var", out=OUT, x=0), [c]
    for name in _each("cumulative_sum", "cumulative_prod"):
        yield f"{n >> 10} Ki", Cumulative(op=name, out=OUT, x=0, axis=0), [flat]
        yield f"({n >> 11} Ki, 2) on axis -1", Cumulative(op=name, out=OUT, x=0, axis=-1), [tall]


def sorting(everything: bool) -> Iterator[Case]:
    n = 1 << 16
    flat, tall = _random((n,)), _random((n // 2, 2))
    for name, descending in _each(("sort", False), ("argsort", False), ("argsort", True)):
        order = Sort(op=name, out=OUT, x=0, descending=descending)
        yield f"{n >> 10} Ki", order, [flat]
        yield f"({n >> 11} Ki, 2) on axis -1", order, [tall]
    yield f"({n >> 11} Ki, 2) on axis 0", Sort(op="sort", out=OUT, x=0, axis=0), [tall]
    ordered = np.sort(flat)
    yield f"{n >> 10} Ki in {n >> 10} Ki", SearchSorted(out=OUT, x1=0, x2=1), [ordered, flat]
    unique = _each(("unique_values", 0), ("unique_counts", 1), ("unique_inverse", 1))
    for name, more in (*unique, ("unique_all", 3)):
        sets = Unique(op=name, out=OUT, more=_ids(more, OUT + 1), x=0)
        for dtype in ("int64", "float64", "complex128"):
            yield f"{n >> 10} Ki {dtype}", sets, [_random((n,), dtype)]
    for shape in ((n,), (2,) * 16):
        found = Nonzero(out=OUT, more=_ids(len(shape) - 1, OUT + 1), x=0)
        yield f"{len(shape)}-d, all true", found, [np.ones(shape, dtype=bool)]


def indexing(everything: bool) -> Iterator[Case]:
    n = 1 << 18
    x, indices, mask = _random((n,)), _RNG.integers(0, n, n), _random((n,), "bool")
    yield "every other element", GetItem(out=OUT, x=0, key=(SliceSpec(step=2),)), [x]
    yield (
        f"{n >> 10} Ki at indices",
        GetItem(out=OUT, x=0, key=(ArrayIndex(tensor=1),)),
        [x, indices],
    )
    yield f"{n >> 10} Ki by a mask", GetItem(out=OUT, x=0, key=(ArrayIndex(tensor=1),)), [x, mask]
    cube = np.ones((2,) * 16)  # 16 index arrays, each element of the result reads all 16
    key16 = tuple(ArrayIndex(tensor=i) for i in range(1, 17))
    yield (
        "16 index arrays",
        GetItem(out=OUT, x=0, key=key16),
        [cube, *[_RNG.integers(0, 2, 1 << 16)] * 16],
    )
    value = np.ones(())
    set_slice = SetItem(out=0, value=1, key=(SliceSpec(step=2),))
    yield "every other element", set_slice, [x.copy(), value]
    set_indices = SetItem(out=0, value=1, key=(ArrayIndex(tensor=2),))
    yield f"{n >> 10} Ki at indices", set_indices, [x.copy(), value, indices]
    yield f"{n >> 10} Ki by a mask", set_indices, [x.copy(), value, mask]
    yield f"{n >> 10} Ki", Take(op="take", out=OUT, x=0, indices=1, axis=0), [x, indices]
    along = Take(op="take_along_axis", out=OUT, x=0, indices=1, axis=1)
    yield "(512, 512)", along, [x.reshape(512, 512), indices.reshape(512, 512) % 512]


def manipulation(everything: bool) -> Iterator[Case]:
    square = _random((1024, 1024))
    yield "1024^2", Reshape(out=OUT, x=0, shape=(-1,)), [square]
    yield "1024^2 transposed", Reshape(out=OUT, x=0, shape=(-1,)), [square.T]
    yield "1024^2", PermuteDims(out=OUT, x=0, axes=(1, 0)), [square]
    ones = [np.ones(1) for _ in range(4096)]
    for name in _each("concat", "stack"):
        yield "4096 of 1 element", Join(out=OUT, op=name, xs=_ids(4096)), ones
        yield "2 of 512 Ki", Join(out=OUT, op=name, xs=(0, 1)), [square.reshape(-1)[: 1 << 19]] * 2
    for name in _each("flip", "expand_dims"):
        yield "1024^2", Axes(out=OUT, op=name, x=0, axis=(0,)), [square]
    yield "(1, 1024, 1024)", Axes(out=OUT, op="squeeze", x=0, axis=(0,)), [square[None]]
    yield "1024^2 on 1 axis", Roll(out=OUT, x=0, shift=(3,), axis=(0,)), [square]
    cube = np.ones((2,) * 14)
    yield "14 axes of 2", Roll(out=OUT, x=0, shift=(1,), axis=_ids(14)), [cube]
    yield "1024^2", MoveAxis(out=OUT, x=0, source=(0,), destination=(1,)), [square]
    yield "to (1024, 1024)", BroadcastTo(out=OUT, x=0, shape=(1024, 1024)), [square[0]]
    yield "(1,) * 16 by 2s", Tile(out=OUT, x=0, reps=(2,) * 16), [np.ones((1,) * 16)]
    yield "(512, 512) by (2, 2)", Tile(out=OUT, x=0, reps=(2, 2)), [square[:512, :512]]
    yield "512 Ki twice", Repeat(out=OUT, x=0, repeats=2), [square.reshape(-1)[: 1 << 19]]
    counts = _RNG.integers(0, 4, 1 << 18)
    yield (
        "256 Ki by a tensor",
        Repeat(out=OUT, x=0, repeats_tensor=1),
        [square.reshape(-1)[: 1 << 18], counts],
    )
    for name in _each("tril", "triu"):
        yield "256 x (64, 64)", Triangle(op=name, out=OUT, x=0), [_random((256, 64, 64))]


def linalg(everything: bool) -> Iterator[Case]:
    def op(name: Any, inputs: int = 1, outputs: int = 1, **kw: Any) -> Linalg:
        return Linalg(op=name, out=OUT, more=_ids(outputs - 1, OUT + 1), xs=_ids(inputs), **kw)

    for dtype in ("float64", "complex128", "int64"):
        a, b = _random((256, 1, 256), dtype), _random((1, 256, 256), dtype)
        yield f"(256, 1, 256) . (1, 256, 256) {dtype}", op("vecdot", 2), [a, b]
    flat = _random((512, 512))
    yield "(512, 512) . (512, 512)", op("vecdot", 2), [flat, flat]
    yield "512 x 512", op("outer", 2), [flat[0], flat[1]]
    yield "256 Ki 3-vectors", op("cross", 2), [_random((1 << 16, 3)), _random((1 << 16, 3))]
    for dtype in ("float64", "int64"):
        m = _random((128, 128), dtype)
        yield f"128^2 {dtype}", op("tensordot", 2, axes1=(1,), axes2=(0,)), [m, m]
    yield "(256, 256)", op("matrix_norm"), [flat[:256, :256]]
    yield "(256, 256) nuclear", op("matrix_norm", ord="nuc"), [flat[:256, :256]]
    for order in (2.0, 3.0):
        yield f"256 Ki, ord {order:g}", op("vector_norm", ord=order), [flat.reshape(-1)[: 1 << 18]]
    for name in _each("diagonal", "trace"):
        yield "4096 x (8, 8)", op(name), [_random((4096, 8, 8))]
    outputs = {"eigh": 2, "qr": 2, "svd": 3, "slogdet": 2}
    spd = _random((128, 128))
    spd = spd @ spd.T + 128 * np.eye(128)
    tiny = _random((4096, 2, 2))
    tiny_spd = tiny @ np.swapaxes(tiny, -1, -2) + 2 * np.eye(2)
    for name in _each("cholesky", "det", "slogdet", "inv", "eigh", "eigvalsh", "qr", "svd"):
        yield "128^2", op(name, outputs=outputs.get(name, 1)), [spd]
        yield "4096 x (2, 2)", op(name, outputs=outputs.get(name, 1)), [tiny_spd]
    for name in _each("svdvals", "pinv", "matrix_rank"):
        yield "128^2", op(name), [spd]
        yield "4096 x (2, 2)", op(name), [tiny_spd]
    yield (
        "(1, 64, 64) \\ (1024, 64, 1)",
        op("solve", 2),
        [spd[None, :64, :64], _random((1024, 64, 1))],
    )
    yield "4096 x (2, 2) \\ (2, 1)", op("solve", 2), [tiny_spd, _random((4096, 2, 1))]
    for power in (13, -13):
        yield f"128^2 ** {power}", op("matrix_power", n=power), [spd / 256]
        yield f"4096 x (2, 2) ** {power}", op("matrix_power", n=power), [tiny_spd]


def fft(everything: bool) -> Iterator[Case]:
    x = _random((1 << 16,))
    prime = _random((65_521,))
    for name in _each("fft", "ifft", "rfft", "ihfft"):
        yield "64 Ki", FFT(op=name, out=OUT, x=0), [x]
        yield "65521 (prime)", FFT(op=name, out=OUT, x=0), [prime]
    for name in _each("irfft", "hfft"):
        yield "64 Ki", FFT(op=name, out=OUT, x=0), [x.astype(complex)]
    tall = _random((1 << 15, 2))
    yield "(32 Ki, 2) on axis -1", FFT(op="fft", out=OUT, x=0), [tall]
    yield "(32 Ki, 2) on axis 0", FFT(op="fft", out=OUT, x=0, axes=(0,)), [tall]
    for name in _each("fftn", "ifftn", "rfftn"):
        yield "(256, 256)", FFT(op=name, out=OUT, x=0), [x.reshape(256, 256)]
        yield "(251, 257) (primes)", FFT(op=name, out=OUT, x=0), [_random((251, 257))]
    yield "(256, 256)", FFT(op="irfftn", out=OUT, x=0), [x.reshape(256, 256).astype(complex)]
    yield "(2,) * 16", FFT(op="fftn", out=OUT, x=0), [np.ones((2,) * 16)]
    for name in _each("fftshift", "ifftshift"):
        yield "(256, 256)", FFT(op=name, out=OUT, x=0), [x.reshape(256, 256)]


def optimizer(everything: bool) -> Iterator[Case]:
    """Adam's chains (``protocol/ops/optim.py``) on float32 and float64 moments."""
    n = 1 << 18 if everything else 1 << 16
    for dtype in ("float32", "float64"):
        g, m, v = (_random((n,), dtype) for _ in "gmv")
        v = np.abs(v)
        term = np.asarray(1e-3, dtype=dtype)
        label = f"{n >> 10} Ki {dtype}"
        for squared in (False, True):
            moment = MomentUpdate(out=0, grad=1, decay=0.9, scale=0.1, squared=squared)
            yield f"{label}{', squared' if squared else ''}", moment, [m.copy(), g]
        direction = AdamDirection(out=OUT, exp_avg=0, exp_avg_sq=1, step_size=2, eps_term=3)
        yield label, direction, [m, v, term, term]


FAMILIES: dict[str, Callable[[bool], Iterator[Case]]] = {
    "creation": creation,
    "element-wise": elementwise,
    "matmul": matmul,
    "reductions": reductions,
    "sorting and sets": sorting,
    "indexing": indexing,
    "manipulation": manipulation,
    "linalg": linalg,
    "fft": fft,
    "optimizer": optimizer,
}
