"""Indexing functions (``x[key]`` itself is the array's, in ``client.array``)."""

from __future__ import annotations

import operator

from protocol.ops import Take

from .._building import apply
from ..array import RemoteArray


class IndexingFunctions:
    """Mixed into :class:`~client.namespace.Namespace`."""

    @staticmethod
    def take(x: RemoteArray, indices: RemoteArray, /, *, axis: int | None = None) -> RemoteArray:
        if axis is None:
            if x.ndim != 1:
                raise ValueError("take of a multi-dimensional array needs an axis")
            axis = 0
        a = operator.index(axis)
        return apply(
            lambda out: Take(out=out, op="take", x=x.tensor_id, indices=indices.tensor_id, axis=a),
            x,
            indices,
        )

    @staticmethod
    def take_along_axis(x: RemoteArray, indices: RemoteArray, /, *, axis: int = -1) -> RemoteArray:
        axis = operator.index(axis)
        return apply(
            lambda out: Take(
                out=out, op="take_along_axis", x=x.tensor_id, indices=indices.tensor_id, axis=axis
            ),
            x,
            indices,
        )
