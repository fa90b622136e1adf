"""Statistical functions: reductions and cumulative sums and products."""

from __future__ import annotations

import builtins
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np

from protocol.ops import Cumulative, Reduce, ReduceName

from .._building import apply
from .._handle import opt_int, opt_ints
from ..array import RemoteArray, astype


def reduce(
    name: ReduceName,
    x: RemoteArray,
    axis: int | Sequence[int] | None,
    keepdims: bool,
    dtype: Any = None,
    correction: float = 0.0,
) -> RemoteArray:
    """One reduction op; a ``dtype`` casts the input before and the result after, if needed."""
    if dtype is not None:
        x = astype(x, dtype)
    axes = opt_ints(axis)
    result = apply(
        lambda out: Reduce(
            op=name, out=out, x=x.tensor_id, axis=axes, keepdims=keepdims, correction=correction
        ),
        x,
    )
    if dtype is not None and result.dtype != np.dtype(dtype):
        result = astype(result, dtype)
    return result


class StatisticalFunctions:
    """Mixed into :class:`~client.namespace.Namespace`."""

    @staticmethod
    def sum(
        x: RemoteArray,
        /,
        *,
        axis: int | Sequence[int] | None = None,
        dtype: Any = None,
        keepdims: builtins.bool = False,
    ) -> RemoteArray:
        return reduce("sum", x, axis, keepdims, dtype)

    @staticmethod
    def prod(
        x: RemoteArray,
        /,
        *,
        axis: int | Sequence[int] | None = None,
        dtype: Any = None,
        keepdims: builtins.bool = False,
    ) -> RemoteArray:
        return reduce("prod", x, axis, keepdims, dtype)

    @staticmethod
    def mean(
        x: RemoteArray,
        /,
        *,
        axis: int | Sequence[int] | None = None,
        keepdims: builtins.bool = False,
    ) -> RemoteArray:
        return reduce("mean", x, axis, keepdims)

    @staticmethod
    def max(
        x: RemoteArray,
        /,
        *,
        axis: int | Sequence[int] | None = None,
        keepdims: builtins.bool = False,
    ) -> RemoteArray:
        return reduce("max", x, axis, keepdims)

    @staticmethod
    def min(
        x: RemoteArray,
        /,
        *,
        axis: int | Sequence[int] | None = None,
        keepdims: builtins.bool = False,
    ) -> RemoteArray:
        return reduce("min", x, axis, keepdims)

    @staticmethod
    def std(
        x: RemoteArray,
        /,
        *,
        axis: int | Sequence[int] | None = None,
        correction: int | float = 0.0,
        keepdims: builtins.bool = False,
    ) -> RemoteArray:
        return reduce("std", x, axis, keepdims, correction=float(correction))

    @staticmethod
    def var(
        x: RemoteArray,
        /,
        *,
        axis: int | Sequence[int] | None = None,
        correction: int | float = 0.0,
        keepdims: builtins.bool = False,
    ) -> RemoteArray:
        return reduce("var", x, axis, keepdims, correction=float(correction))

    @staticmethod
    def cumulative_sum(
        x: RemoteArray,
        /,
        *,
        axis: int | None = None,
        dtype: Any = None,
        include_initial: builtins.bool = False,
    ) -> RemoteArray:
        return _cumulative("cumulative_sum", x, axis, dtype, include_initial)

    @staticmethod
    def cumulative_prod(
        x: RemoteArray,
        /,
        *,
        axis: int | None = None,
        dtype: Any = None,
        include_initial: builtins.bool = False,
    ) -> RemoteArray:
        return _cumulative("cumulative_prod", x, axis, dtype, include_initial)


def _cumulative(
    name: Literal["cumulative_sum", "cumulative_prod"],
    x: RemoteArray,
    axis: int | None,
    dtype: Any,
    include_initial: bool,
) -> RemoteArray:
    if dtype is not None:
        x = astype(x, dtype)
    axis = opt_int(axis)
    result = apply(
        lambda out: Cumulative(
            out=out, op=name, x=x.tensor_id, axis=axis, include_initial=include_initial
        ),
        x,
    )
    if dtype is not None and result.dtype != np.dtype(dtype):
        result = astype(result, dtype)
    return result
