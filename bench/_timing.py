"""One op run as the server runs it, and timed: what ``bench.op_costs`` and ``bench.nn_costs``
set against the cost model's count (``executor.cost``)."""

from __future__ import annotations

import argparse
import contextlib
import math
import time
from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any

import numpy as np
from threadpoolctl import threadpool_limits

from protocol import TensorMeta, from_numpy
from protocol.ops import AnyOp
from server import executor

Array = np.ndarray[Any, Any]


def metas_of(op: AnyOp, args: Sequence[Array]) -> tuple[TensorMeta, ...]:
    """``op``'s output metas on ``args``, with the lengths the session resolves before it
    counts (``executor.resolve``: a mask's count, a tensor of repeats' sum)."""
    metas = op.infer_all(*(TensorMeta(a.shape, from_numpy(a.dtype)) for a in args))
    return executor.resolve(op, args, metas)


def run_op(op: AnyOp, args: Sequence[Array]) -> Array:
    """``op``'s first result, run by the server's executor (an in-place op writes into its
    target, as the session lets it when nothing else reads that memory)."""
    result: Array = executor.run(op, args, (), metas_of(op, args), in_place=op.inplace)[0]
    return result


def count(op: AnyOp, args: Sequence[Array]) -> int:
    """The cost model's count for ``op`` on ``args``, as the session takes it."""
    return executor.cost(op, metas_of(op, args)[0], args)


def best_seconds(op: AnyOp, args: Sequence[Array], rounds: int) -> float:
    """The best of ``rounds`` runs, after one untimed (first-call costs)."""
    run_op(op, args)
    best = math.inf
    for _ in range(rounds):
        start = time.perf_counter()
        run_op(op, args)
        best = min(best, time.perf_counter() - start)
    return best


def add_timing_options(parser: argparse.ArgumentParser, rounds: int) -> None:
    """``--rounds`` (``rounds`` by default) and ``--blas-threads``, for :func:`blas_held`."""
    parser.add_argument("--rounds", type=int, default=rounds, help="runs per row, the best kept")
    parser.add_argument(
        "--blas-threads", type=int, help="BLAS held to this many threads (default: its own)"
    )


def blas_held(args: argparse.Namespace) -> AbstractContextManager[object]:
    """BLAS held to ``--blas-threads`` within the block (its own threads if unset)."""
    limit = args.blas_threads
    return contextlib.nullcontext() if limit is None else threadpool_limits(limit, user_api="blas")
