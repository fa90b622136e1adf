"""Sorting, searching, cumulative and set ops."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from protocol import from_numpy, to_numpy
from protocol.codec import Buffer
from protocol.ops import Cumulative, Nonzero, SearchSorted, Sort, Unique
from protocol.ops.data import UNIQUE_OUTPUTS
from protocol.ops.rules import reduce_rule

from .base import Array, Runner


def sort(op: Sort, args: Sequence[Array], buffers: Sequence[Buffer]) -> Array:
    (x,) = args
    kind: Any = "stable" if op.stable else None
    if op.op == "sort":
        result = np.sort(x, axis=op.axis, kind=kind)
        return np.flip(result, axis=op.axis) if op.descending else result
    if not op.descending:
        return np.argsort(x, axis=op.axis, kind=kind)
    # Note: a stable descending argsort keeps equal elements in their original order:
    # sort the reversed array ascending, reverse the result and map the indices back.
    n = x.shape[op.axis]
    reversed_order = np.argsort(np.flip(x, axis=op.axis), axis=op.axis, kind="stable")
    indices: Array = (n - 1 - np.flip(reversed_order, axis=op.axis)).astype(np.int64)
    return indices


def cumulative(op: Cumulative, args: Sequence[Array], buffers: Sequence[Buffer]) -> Array:
    (x,) = args
    name = "sum" if op.op == "cumulative_sum" else "prod"
    dtype, compute = reduce_rule(name, from_numpy(x.dtype))
    fn = np.cumulative_sum if name == "sum" else np.cumulative_prod
    return fn(x, axis=op.axis, dtype=to_numpy(compute or dtype), include_initial=op.include_initial)


def searchsorted(op: SearchSorted, args: Sequence[Array], buffers: Sequence[Buffer]) -> Array:
    x1, x2 = args
    common = np.result_type(x1, x2)
    result = np.searchsorted(x1.astype(common), x2.astype(common), side=op.side)
    return np.asarray(result, dtype=np.int64)


def nonzero(op: Nonzero, args: Sequence[Array], buffers: Sequence[Buffer]) -> tuple[Array, ...]:
    return tuple(i.astype(np.int64) for i in np.nonzero(args[0]))


def unique(op: Unique, args: Sequence[Array], buffers: Sequence[Buffer]) -> tuple[Array, ...]:
    (x,) = args
    result = np.unique_all(x)
    parts = {
        "values": result.values,
        "indices": result.indices.astype(np.int64),
        "inverse_indices": result.inverse_indices.astype(np.int64).reshape(x.shape),
        "counts": result.counts.astype(np.int64),
    }
    return tuple(parts[name] for name in UNIQUE_OUTPUTS[op.op])


RUNNERS: dict[type, Runner] = {
    Sort: sort,
    Cumulative: cumulative,
    SearchSorted: searchsorted,
    Nonzero: nonzero,
    Unique: unique,
}
