"""``python -m bench.nn_costs [--all]``: the cost model's count for each op of the neural-network
extension against the time its runner takes, one row per op and shape.

The count is ``executor.cost`` (``server/executor/costs.py``), in element operations of about a
nanosecond each; the time is the best of a few runs of the server's runner, wall-clock, with
BLAS on its default threads (as the cost model's figures were measured: bench/REASONS.md, 'The
op cost model'), or on ``--blas-threads N``. Each row prints both and their ratio,
nanoseconds per counted unit: each family's factor is chosen so that this stays at most about
1 (the count errs high), within a few times of it. The shapes are ``bench/_nn_shapes.py``'s
(``--all``: all of them, and float64), and element-wise ops (batch norm, softmax, random
draws) at 64 Ki and 1 Mi elements.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from protocol.ops import AnyOp, BatchNorm, Pool, PoolBackward, Random, Softmax
from protocol.ops.nn import FloatDType
from protocol.version import version_text

from ._nn_shapes import conv_problems, pool_problems
from ._timing import add_timing_options, best_seconds, blas_held, count, run_op

Array = np.ndarray[Any, Any]
Row = tuple[str, AnyOp, list[Array]]  # (label, op, its inputs)


def conv_rows(everything: bool, dtype: str) -> Iterator[Row]:
    for p in conv_problems(everything, [dtype]):
        yield p.name, p.forward, [p.x, p.w]
        yield p.name, p.weight_grad, [p.x, p.y]
        yield p.name, p.transpose, [p.y, p.w]


def pool_rows(everything: bool, dtype: str) -> Iterator[Row]:
    for name, x, window in pool_problems(everything, [dtype]):
        for kind in ("max", "avg"):
            op = Pool(out=0, op=kind, x=1, **window)
            yield name, op, [x]
            grad = run_op(op, [x])
            yield name, PoolBackward(out=0, op=kind, x=1, grad=2, **window), [x, grad]


def elementwise_rows(dtype: FloatDType) -> Iterator[Row]:
    rng = np.random.default_rng(0)
    for n in (1 << 16, 1 << 20):
        x = rng.standard_normal((n // 1024, 64, 16)).astype(dtype)
        stats = [np.abs(rng.standard_normal(64)).astype(dtype) + 1 for _ in range(4)]
        label = f"{n // 1024} Ki"
        yield label, BatchNorm(out=0, x=1, mean=2, var=3, weight=4, bias=5), [x, *stats]
        for kind in ("softmax", "log_softmax"):
            yield label, Softmax(out=0, op=kind, x=1, axis=-1), [x]
        state = np.array([1, 2], dtype=np.uint64)
        for draw in ("uniform", "normal"):
            yield label, Random(out=0, op=draw, state=1, shape=(n,), dtype=dtype), [state]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.nn_costs", description=__doc__)
    parser.add_argument("--version", action="version", version=version_text())
    parser.add_argument("--all", action="store_true", help="every shape, and float64 too")
    add_timing_options(parser, rounds=5)
    args = parser.parse_args(argv)
    with blas_held(args):
        _table(args.all, args.rounds)


def _table(everything: bool, rounds: int) -> None:
    dtypes: tuple[FloatDType, ...] = ("float32", "float64") if everything else ("float32",)
    rows: list[tuple[str, Row]] = [
        (dtype, row)
        for dtype in dtypes
        for family in (conv_rows(everything, dtype), pool_rows(everything, dtype))
        for row in family
    ]
    rows += [(dtype, row) for dtype in dtypes for row in elementwise_rows(dtype)]
    for _, (_, op, inputs) in rows:  # the process's memory touched once, untimed
        run_op(op, inputs)
    print(f"{'case':<14} {'dtype':<8} {'op':<22} {'ms':>8} {'count':>12} {'ns/unit':>8}")
    per_op: dict[str, list[float]] = {}
    for dtype, (label, op, inputs) in rows:
        counted = count(op, inputs)
        seconds = best_seconds(op, inputs, rounds)
        ratio = seconds * 1e9 / counted
        per_op.setdefault(op.name(), []).append(ratio)
        print(
            f"{label:<14} {dtype:<8} {op.name():<22} {seconds * 1e3:>8.3f} {counted:>12,} "
            f"{ratio:>8.2f}",
            flush=True,
        )
    print("\nns per counted unit, by op: least - most over the rows")
    for name, ratios in per_op.items():
        print(f"{name:<22} {min(ratios):.2f} - {max(ratios):.2f}")


if __name__ == "__main__":
    main()
