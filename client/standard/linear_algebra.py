"""Linear algebra functions of the main namespace (the ``linalg`` extension has the rest)."""

from __future__ import annotations

import operator
from collections.abc import Sequence

import numpy as np

from protocol.ops import Linalg

from .._building import apply
from .._handle import ints
from ..array import RemoteArray, matrix_transpose
from .elementwise import _binary


class LinearAlgebraFunctions:
    """Mixed into :class:`~client.namespace.Namespace`."""

    matmul = _binary("matmul")  # one binary op on the wire, like the element-wise ones

    @staticmethod
    def matrix_transpose(x: RemoteArray, /) -> RemoteArray:
        return matrix_transpose(x)

    @staticmethod
    def vecdot(x1: RemoteArray, x2: RemoteArray, /, *, axis: int = -1) -> RemoteArray:
        """numpy's ``vecdot`` (conjugates ``x1``); a non-negative ``axis`` counts in the
        broadcast shape."""
        ndim = max(x1.ndim, x2.ndim)
        axis = operator.index(axis)
        a = axis - ndim if axis >= 0 else axis
        return apply(
            lambda out: Linalg(out=out, op="vecdot", xs=(x1.tensor_id, x2.tensor_id), axis=(a,)),
            x1,
            x2,
        )

    @staticmethod
    def tensordot(
        x1: RemoteArray, x2: RemoteArray, /, *, axes: int | tuple[Sequence[int], Sequence[int]] = 2
    ) -> RemoteArray:
        if isinstance(axes, int | np.integer):
            n = operator.index(axes)
            if n < 0:
                raise ValueError("tensordot axes must be non-negative")
            a1 = tuple(range(x1.ndim - n, x1.ndim))
            a2 = tuple(range(n))
        else:
            a1, a2 = ints(axes[0]), ints(axes[1])
        return apply(
            lambda out: Linalg(
                out=out, op="tensordot", xs=(x1.tensor_id, x2.tensor_id), axes1=a1, axes2=a2
            ),
            x1,
            x2,
        )
