"""``xp.linalg``: the standard's linear algebra extension (the op family ``Linalg``)."""

from __future__ import annotations

import builtins
import operator
from collections.abc import Sequence
from typing import Any

import numpy as np

from protocol.ops import Linalg

from .._building import apply_many
from .._results import EighResult, QRResult, SlogdetResult, SVDResult
from ..array import RemoteArray, astype, matrix_transpose
from ..device import Device
from .elementwise import binary_function
from .linear_algebra import LinearAlgebraFunctions


def _linalg(name: Any, *xs: RemoteArray, count: int = 1, **params: Any) -> tuple[RemoteArray, ...]:
    ids = tuple(x.tensor_id for x in xs)
    return apply_many(
        lambda out, more: Linalg(out=out, more=more, op=name, xs=ids, **params), count, *xs
    )


def _one(name: Any, *xs: RemoteArray, **params: Any) -> RemoteArray:
    return _linalg(name, *xs, **params)[0]


def _tolerant(name: Any, x: RemoteArray, rtol: float | RemoteArray | None) -> RemoteArray:
    """``matrix_rank`` or ``pinv``; an array ``rtol`` travels as a second input."""
    if isinstance(rtol, RemoteArray):
        return _one(name, x, rtol)
    return _one(name, x, rtol=None if rtol is None else float(rtol))


class LinalgNamespace:
    """The ``linalg`` extension."""

    def __init__(self, device: Device) -> None:
        self.device = device

    @staticmethod
    def cholesky(x: RemoteArray, /, *, upper: builtins.bool = False) -> RemoteArray:
        return _one("cholesky", x, upper=upper)

    @staticmethod
    def cross(x1: RemoteArray, x2: RemoteArray, /, *, axis: int = -1) -> RemoteArray:
        return _one("cross", x1, x2, axis=(operator.index(axis),))

    @staticmethod
    def det(x: RemoteArray, /) -> RemoteArray:
        return _one("det", x)

    @staticmethod
    def diagonal(x: RemoteArray, /, *, offset: int = 0) -> RemoteArray:
        return _one("diagonal", x, offset=operator.index(offset))

    @staticmethod
    def eigh(x: RemoteArray, /) -> EighResult:
        return EighResult(*_linalg("eigh", x, count=2))

    @staticmethod
    def eigvalsh(x: RemoteArray, /) -> RemoteArray:
        return _one("eigvalsh", x)

    @staticmethod
    def inv(x: RemoteArray, /) -> RemoteArray:
        return _one("inv", x)

    @staticmethod
    def matmul(x1: RemoteArray, x2: RemoteArray, /) -> RemoteArray:
        return binary_function("matmul", x1, x2)

    @staticmethod
    def matrix_norm(
        x: RemoteArray, /, *, keepdims: builtins.bool = False, ord: int | float | str | None = "fro"
    ) -> RemoteArray:  # noqa: A002
        o = ord if isinstance(ord, str) or ord is None else float(ord)
        return _one("matrix_norm", x, keepdims=keepdims, ord=o)

    @staticmethod
    def matrix_power(x: RemoteArray, n: int, /) -> RemoteArray:
        return _one("matrix_power", x, n=operator.index(n))

    @staticmethod
    def matrix_rank(x: RemoteArray, /, *, rtol: float | RemoteArray | None = None) -> RemoteArray:
        return _tolerant("matrix_rank", x, rtol)

    @staticmethod
    def matrix_transpose(x: RemoteArray, /) -> RemoteArray:
        return matrix_transpose(x)

    @staticmethod
    def outer(x1: RemoteArray, x2: RemoteArray, /) -> RemoteArray:
        return _one("outer", x1, x2)

    @staticmethod
    def pinv(x: RemoteArray, /, *, rtol: float | RemoteArray | None = None) -> RemoteArray:
        return _tolerant("pinv", x, rtol)

    @staticmethod
    def qr(x: RemoteArray, /, *, mode: str = "reduced") -> QRResult:
        return QRResult(*_linalg("qr", x, count=2, mode=mode))

    @staticmethod
    def slogdet(x: RemoteArray, /) -> SlogdetResult:
        return SlogdetResult(*_linalg("slogdet", x, count=2))

    @staticmethod
    def solve(x1: RemoteArray, x2: RemoteArray, /) -> RemoteArray:
        return _one("solve", x1, x2)

    @staticmethod
    def svd(x: RemoteArray, /, *, full_matrices: builtins.bool = True) -> SVDResult:
        return SVDResult(*_linalg("svd", x, count=3, full_matrices=full_matrices))

    @staticmethod
    def svdvals(x: RemoteArray, /) -> RemoteArray:
        return _one("svdvals", x)

    @staticmethod
    def tensordot(
        x1: RemoteArray, x2: RemoteArray, /, *, axes: int | tuple[Sequence[int], Sequence[int]] = 2
    ) -> RemoteArray:
        return LinearAlgebraFunctions.tensordot(x1, x2, axes=axes)

    @staticmethod
    def trace(x: RemoteArray, /, *, offset: int = 0, dtype: Any = None) -> RemoteArray:
        if dtype is not None:
            x = astype(x, dtype)
        result = _one("trace", x, offset=operator.index(offset))
        return result if dtype is None or result.dtype == np.dtype(dtype) else astype(result, dtype)

    @staticmethod
    def vecdot(x1: RemoteArray, x2: RemoteArray, /, *, axis: int = -1) -> RemoteArray:
        return LinearAlgebraFunctions.vecdot(x1, x2, axis=axis)

    @staticmethod
    def vector_norm(
        x: RemoteArray,
        /,
        *,
        axis: int | Sequence[int] | None = None,
        keepdims: builtins.bool = False,
        ord: int | float = 2,
    ) -> RemoteArray:  # noqa: A002
        axes = None if axis is None else tuple(np.atleast_1d(np.asarray(axis)).tolist())
        return _one("vector_norm", x, axis=axes, keepdims=keepdims, ord=float(ord))
