"""``python -m bench.conv_formulations [--all] [--wall]``: the numpy formulations of the
convolution and pooling ops timed against each other on the shapes small CNNs use, one table.

Each row is one op on one shape and dtype; each column one formulation, its time the best of
several rounds in which the formulations take turns (so that a drift of the machine's load hits
all alike), then its ratio to the fastest. The time is the calling thread's CPU time with BLAS
held to that one thread (``threadpoolctl``): the work each formulation does, which a loaded
machine moves far less than wall-clock time (on a shared 2-core machine, a BLAS call on two
threads waited up to tens of milliseconds for its second thread); ``--wall`` times wall-clock
with BLAS on its default threads instead. Every formulation's result is checked against the
first's before it is timed. By default the run takes seconds: float32, the digits CNN of
``examples/train_cnn.py`` and one case of each parameter; ``--all`` adds larger shapes and
float64.

``server`` is what ``server/executor/convolution.py`` and ``pooling.py`` run; the others are
the candidates they were chosen from (``bench/_conv_candidates.py``; bench/REASONS.md,
'Convolution formulation'):

- ``im2col whole``: the server's im2col without its batch chunks (one window matrix);
- ``tensordot``: ``np.tensordot`` on the ``sliding_window_view`` (it copies the windows
  itself), a call per group;
- ``einsum``: ``np.einsum(..., optimize=True)`` on the windows, the groups as a batch axis;
- ``per tap``: a loop over the kernel's taps, each a strided slice copied to a matrix and one
  BLAS product per group, summed (the server's transpose is its adjoint in blocks of taps: a
  block's product added tap by tap into strided slices of the output, a scatter);
- ``col2im`` (transpose): one product for every tap at once, then the scatter per tap;
- ``dilated`` (transpose): the convolution of the input spread by the stride and padded, with
  the flipped kernel;
- pooling: a reduction over the window view's axes (``window reduce``), and for max pooling's
  gradient ``argmax`` of the copied windows, against the server's loop over taps.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from typing import Any

import numpy as np
from threadpoolctl import threadpool_limits

from protocol.ops import Pool, PoolBackward
from protocol.version import version_text
from server.executor import convolution, pooling

from ._conv_candidates import (
    conv_einsum,
    conv_im2col_whole,
    conv_per_tap,
    conv_tensordot,
    max_backward_argmax,
    pool_window_reduce,
    transpose_col2im,
    transpose_dilated,
    transpose_einsum,
    weight_grad_einsum,
    weight_grad_per_tap,
    weight_grad_tensordot,
)
from ._nn_shapes import conv_problems, pool_problems

Array = np.ndarray[Any, Any]
Formulation = Callable[[], Array]


def _best(
    fns: dict[str, Formulation], seconds: float, clock: Callable[[], float]
) -> dict[str, float]:
    """Each formulation's best time on ``clock`` over rounds in which all take a turn, at least
    3 rounds and until ``seconds`` have passed; each result checked against the first's."""
    results = {name: fn() for name, fn in fns.items()}
    first = next(iter(results.values()))
    for name, value in results.items():
        tolerance = 1e-4 if first.dtype == np.float32 else 1e-10
        scale = float(np.abs(first).max()) or 1.0
        assert value.shape == first.shape, (name, value.shape, first.shape)
        assert np.allclose(value, first, rtol=tolerance, atol=tolerance * scale), name
    best = dict.fromkeys(fns, math.inf)
    deadline, rounds = time.perf_counter() + seconds, 0
    while rounds < 3 or (time.perf_counter() < deadline and rounds < 50):
        for name, fn in fns.items():
            start = clock()
            fn()
            best[name] = min(best[name], clock() - start)
        rounds += 1
    return best


Case = tuple[str, str, str, dict[str, Formulation]]  # shape, dtype, op, formulations


def _conv_cases(everything: bool, dtypes: Sequence[str]) -> Iterator[Case]:
    forward: dict[str, Callable[..., Array]] = {
        "server": convolution.conv,
        "im2col whole": conv_im2col_whole,
        "tensordot": conv_tensordot,
        "einsum": conv_einsum,
        "per tap": conv_per_tap,
    }
    grads: dict[str, Callable[..., Array]] = {
        "server": convolution.conv_weight_grad,
        "tensordot": weight_grad_tensordot,
        "einsum": weight_grad_einsum,
        "per tap": weight_grad_per_tap,
    }
    transposes: dict[str, Callable[..., Array]] = {
        "server": convolution.conv_transpose,
        "col2im": transpose_col2im,
        "einsum": transpose_einsum,
        "dilated": partial(transpose_dilated, forward=convolution.conv),
    }
    for p in conv_problems(everything, dtypes):
        x, w, y = p.x, p.w, p.y
        yield (
            p.name,
            p.dtype,
            "conv",
            {f: partial(fn, x, w, p.forward) for f, fn in forward.items()},
        )
        wop = p.weight_grad
        yield p.name, p.dtype, "weight grad", {f: partial(fn, x, y, wop) for f, fn in grads.items()}
        top = p.transpose  # x's gradient
        yield (
            p.name,
            p.dtype,
            "transpose",
            {f: partial(fn, y, w, top) for f, fn in transposes.items()},
        )


def _pool_cases(everything: bool, dtypes: Sequence[str]) -> Iterator[Case]:
    rng = np.random.default_rng(1)
    for name, x, window in pool_problems(everything, dtypes):
        dtype = str(x.dtype)
        for kind in ("max", "avg"):
            op = Pool(out=0, op=kind, x=1, **window)
            pools: dict[str, Formulation] = {
                "server": partial(pooling.run_pool, op, [x], ()),
                "window reduce": partial(pool_window_reduce, x, op),
            }
            yield name, dtype, f"{kind} pool", pools
        y = pooling.run_pool(Pool(out=0, op="max", x=1, **window), [x], ())
        grad = rng.standard_normal(tuple(y.shape)).astype(dtype)
        bop = PoolBackward(out=0, op="max", x=1, grad=2, **window)
        backward: dict[str, Formulation] = {
            "server": partial(pooling.run_pool_backward, bop, [x, grad], ()),
            "argmax": partial(max_backward_argmax, x, grad, bop),
        }
        yield name, dtype, "max backward", backward


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.conv_formulations", description=__doc__)
    parser.add_argument("--version", action="version", version=version_text())
    parser.add_argument("--all", action="store_true", help="larger shapes and float64 too")
    parser.add_argument("--seconds", type=float, default=0.05, help="per row, at least 3 rounds")
    parser.add_argument(
        "--wall", action="store_true", help="wall-clock time, BLAS on its default threads"
    )
    args = parser.parse_args(argv)
    clock = time.perf_counter if args.wall else time.thread_time
    dtypes = ("float32", "float64") if args.all else ("float32",)
    with contextlib.nullcontext() if args.wall else threadpool_limits(1, user_api="blas"):
        _table(args.all, dtypes, args.seconds, clock)


def _table(
    everything: bool, dtypes: Sequence[str], seconds: float, clock: Callable[[], float]
) -> None:
    print(f"{'case':<14} {'dtype':<8} {'op':<13} formulation: ms (x the fastest)")
    against: dict[tuple[str, str], list[float]] = {}  # (op, formulation): its times / server's
    for cases in (_conv_cases(everything, dtypes), _pool_cases(everything, dtypes)):
        for name, dtype, op, fns in cases:
            best = _best(fns, seconds, clock)
            fastest = min(best.values())
            cells = "  ".join(f"{f} {t * 1e3:.2f} ({t / fastest:.1f})" for f, t in best.items())
            print(f"{name:<14} {dtype:<8} {op:<13} {cells}", flush=True)
            for f, t in best.items():
                against.setdefault((op, f), []).append(t / best["server"])
    print("\neach formulation's time / the server's: median (least-most) over the rows")
    for (op, f), ratios in against.items():
        if f != "server":
            low, mid, high = min(ratios), statistics.median(ratios), max(ratios)
            print(f"{op:<13} {f:<14} {mid:.2f} ({low:.2f}-{high:.2f})")


if __name__ == "__main__":
    main()
