"""Sorting functions: ``sort`` and ``argsort``, stable and descending."""

from __future__ import annotations

import builtins
import operator
from typing import Literal

from protocol.ops import Sort

from .._building import apply
from ..array import RemoteArray


class SortingFunctions:
    """Mixed into :class:`~client.namespace.Namespace`."""

    @staticmethod
    def sort(
        x: RemoteArray,
        /,
        *,
        axis: int = -1,
        descending: builtins.bool = False,
        stable: builtins.bool = True,
    ) -> RemoteArray:
        return _sort("sort", x, axis, descending, stable)

    @staticmethod
    def argsort(
        x: RemoteArray,
        /,
        *,
        axis: int = -1,
        descending: builtins.bool = False,
        stable: builtins.bool = True,
    ) -> RemoteArray:
        return _sort("argsort", x, axis, descending, stable)


def _sort(
    op: Literal["sort", "argsort"], x: RemoteArray, axis: int, descending: bool, stable: bool
) -> RemoteArray:
    axis = operator.index(axis)
    return apply(
        lambda out: Sort(
            out=out, op=op, x=x.tensor_id, axis=axis, descending=descending, stable=stable
        ),
        x,
    )
