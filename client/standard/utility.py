"""Utility functions: ``all``, ``any`` and ``diff``."""

from __future__ import annotations

import builtins
from collections.abc import Sequence

from ..array import RemoteArray, binary
from .manipulation import ManipulationFunctions
from .statistical import reduce


class UtilityFunctions:
    """Mixed into :class:`~client.namespace.Namespace`."""

    @staticmethod
    def all(
        x: RemoteArray,
        /,
        *,
        axis: int | Sequence[int] | None = None,
        keepdims: builtins.bool = False,
    ) -> RemoteArray:
        return reduce("all", x, axis, keepdims)

    @staticmethod
    def any(
        x: RemoteArray,
        /,
        *,
        axis: int | Sequence[int] | None = None,
        keepdims: builtins.bool = False,
    ) -> RemoteArray:
        return reduce("any", x, axis, keepdims)

    @staticmethod
    def diff(
        x: RemoteArray,
        /,
        *,
        axis: int = -1,
        n: int = 1,
        prepend: RemoteArray | None = None,
        append: RemoteArray | None = None,
    ) -> RemoteArray:
        if x.ndim == 0:
            raise ValueError("diff needs at least one dimension")
        parts = [p for p in (prepend, x, append) if p is not None]
        if len(parts) > 1:
            x = ManipulationFunctions.concat(parts, axis=axis)
        lead = (slice(None),) * (axis % x.ndim)
        for _ in range(n):
            later, earlier = x[(*lead, slice(1, None))], x[(*lead, slice(None, -1))]
            x = binary("not_equal" if x.wire_dtype == "bool" else "subtract", later, earlier)
        return x
