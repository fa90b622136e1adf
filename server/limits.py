"""Per-op caps, checked on an op's inferred outputs and on the work numpy would do for it
(:func:`check_cost`) before numpy runs (ARCHITECTURE.md, invariants 4 and 8), and a session's
bounds on the graphs it registers (``server/graphs.py``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from protocol import DTYPES, ErrorCode, TensorMeta, to_numpy
from protocol.ops import UNKNOWN, numel

from .config import MAX_OP_COST
from .errors import StoreError

_ITEMSIZE = {name: to_numpy(name).itemsize for name in DTYPES}


@dataclass(frozen=True)
class Limits:
    """Per-op caps checked on the inferred output before numpy runs (its bytes, its dimensions,
    and the work numpy would do for it), and the bounds on one session's registered graphs: how
    many, and their constants' bytes."""

    max_op_bytes: int = 2**63
    max_ndim: int = 64
    max_graphs: int = 64
    max_graph_bytes: int = 256 * 2**20
    max_op_cost: int = MAX_OP_COST


def output_bytes(metas: Sequence[TensorMeta], limits: Limits, scratch: int = 0) -> int:
    """The bytes to reserve for outputs ``metas`` (their sum; Python ints: no overflow) and
    the ``scratch`` bytes numpy allocates beside them while the op runs
    (``executor.scratch``). A data-dependent output (an ``UNKNOWN`` dim) counts 0 here: it is
    charged after it ran.

    Raises:
        StoreError: ``limit_exceeded``, for outputs over a per-op cap.
    """
    total = 0
    for meta in metas:
        if len(meta.shape) > limits.max_ndim:
            raise StoreError(
                ErrorCode.LIMIT_EXCEEDED,
                f"the output has {len(meta.shape)} dimensions; the limit is {limits.max_ndim}",
            )
        itemsize = _ITEMSIZE[meta.dtype]
        known = numel(tuple(d for d in meta.shape if d > 0)) * itemsize
        if known >= 2**63 and (0 in meta.shape or UNKNOWN in meta.shape):
            raise StoreError(  # other dims that overflow numpy's intp, even if empty
                ErrorCode.LIMIT_EXCEEDED,
                f"the dimensions {list(meta.shape)} overflow numpy's index type, even if empty",
            )
        if UNKNOWN not in meta.shape:
            total += numel(meta.shape) * itemsize
    if total + scratch > limits.max_op_bytes:
        shapes = ", ".join(f"{m.dtype}{list(m.shape)}" for m in metas)
        beside = f" and {scratch} bytes of scratch while it runs" if scratch else ""
        raise StoreError(
            ErrorCode.LIMIT_EXCEEDED,
            f"the output {shapes} needs {total} bytes{beside}; the per-op limit is "
            f"{limits.max_op_bytes}",
        )
    return total + scratch


def check_cost(work: int, limits: Limits) -> None:
    """Refuse an op that would cost numpy ``work`` element operations (``executor.cost``) over
    the per-op cap, before it runs: numpy cannot be interrupted once it has started.

    Raises:
        StoreError: ``limit_exceeded``.
    """
    if work > limits.max_op_cost:
        raise StoreError(
            ErrorCode.LIMIT_EXCEEDED,
            f"the op would cost about {work:.3g} element operations; the per-op limit is "
            f"{limits.max_op_cost:.3g} (--max-op-cost)",
        )
