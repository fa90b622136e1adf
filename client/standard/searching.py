"""Searching functions: arg-reductions, ``nonzero``, ``searchsorted`` and ``where``."""

from __future__ import annotations

import builtins
from collections.abc import Sequence
from typing import Any

import numpy as np

from protocol import from_numpy
from protocol.ops import Nonzero, SearchSorted, Where
from protocol.scalars import default_dtype

from .._building import apply, apply_many, full
from ..array import RemoteArray, astype, binary_operator, operand
from .indexing import IndexingFunctions
from .statistical import reduce


class SearchingFunctions:
    """Mixed into :class:`~client.namespace.Namespace`."""

    @staticmethod
    def argmax(
        x: RemoteArray, /, *, axis: int | None = None, keepdims: builtins.bool = False
    ) -> RemoteArray:
        return reduce("argmax", x, axis, keepdims)

    @staticmethod
    def argmin(
        x: RemoteArray, /, *, axis: int | None = None, keepdims: builtins.bool = False
    ) -> RemoteArray:
        return reduce("argmin", x, axis, keepdims)

    @staticmethod
    def count_nonzero(
        x: RemoteArray,
        /,
        *,
        axis: int | Sequence[int] | None = None,
        keepdims: builtins.bool = False,
    ) -> RemoteArray:
        nonzero = binary_operator("not_equal", x, 0, reflected=False)
        return reduce("sum", astype(nonzero, "int64"), axis, keepdims)

    @staticmethod
    def nonzero(x: RemoteArray, /) -> tuple[RemoteArray, ...]:
        """One round trip: the number of non-zero elements is data-dependent."""
        count = max(x.ndim, 1)
        return apply_many(lambda out, more: Nonzero(out=out, more=more, x=x.tensor_id), count, x)

    @staticmethod
    def searchsorted(
        x1: RemoteArray,
        x2: RemoteArray,
        /,
        *,
        side: str = "left",
        sorter: RemoteArray | None = None,
    ) -> RemoteArray:
        if side not in ("left", "right"):
            raise ValueError("side must be 'left' or 'right'")
        if sorter is not None:
            x1 = IndexingFunctions.take(x1, sorter, axis=0)
        s: Any = side
        a, b = x1, x2
        return apply(
            lambda out: SearchSorted(out=out, x1=a.tensor_id, x2=b.tensor_id, side=s), a, b
        )

    @staticmethod
    def where(condition: RemoteArray, x1: Any, x2: Any, /) -> RemoteArray:
        like = x1 if isinstance(x1, RemoteArray) else x2 if isinstance(x2, RemoteArray) else None
        if like is None:  # two Python scalars: the default dtype of their common kind
            dtype = from_numpy(np.result_type(default_dtype(x1), default_dtype(x2)))
            a: RemoteArray | None = full((), x1, dtype, condition.device)
            b: RemoteArray | None = full((), x2, dtype, condition.device)
        else:
            a, b = operand(x1, like), operand(x2, like)
        if a is None or b is None:
            raise TypeError("where takes arrays or Python scalars")
        return apply(
            lambda out: Where(
                out=out, condition=condition.tensor_id, x1=a.tensor_id, x2=b.tensor_id
            ),
            condition,
            a,
            b,
        )
