"""``python -m bench.conv_formulations [--quick]``: the numpy formulations of the convolution
and pooling ops timed against each other on the shapes small CNNs use, one table.

Each row is one op on one shape and dtype; each column one formulation, its time the best of
several rounds in which the formulations take turns (so that a drift of the machine's load hits
all alike), then its ratio to the fastest. The time is the calling thread's CPU time with BLAS
held to that one thread (``threadpoolctl``): the work each formulation does, which a loaded
machine moves far less than wall-clock time (on a shared 2-core machine, a BLAS call on two
threads waited up to tens of milliseconds for its second thread); ``--wall`` times wall-clock
with BLAS on its default threads instead. Every formulation's result is checked against the
first's before it is timed. ``server`` is what ``server/executor/nn.py`` runs; the others are
the candidates it was chosen from (bench/REASONS.md, 'Convolution formulation'):

- ``im2col``: the windows copied into one matrix per group (channels and taps by batch and
  positions), one BLAS product per group;
- ``tensordot``: ``np.tensordot`` on the ``sliding_window_view`` (it copies the windows
  itself), a call per group;
- ``einsum``: ``np.einsum(..., optimize=True)`` on the windows, the groups as a batch axis;
- ``per tap``: a loop over the kernel's taps, each a strided slice copied to a matrix and one
  BLAS product per group, summed (for the transpose: each tap's product added into a strided
  slice of the output, a scatter);
- ``col2im`` (transpose): one product for every tap at once, then the scatter per tap;
- ``dilated`` (transpose): the convolution of the input spread by the stride and padded, with
  the flipped kernel;
- pooling: a reduction over the window view's axes, against a loop over taps of
  ``np.maximum``/``np.add`` into the output (for max pooling's gradient: ``argmax`` of the
  copied windows, against each tap's equality with the maximum).
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

from protocol.ops import Conv, Pool, PoolBackward
from server.executor import nn

from ._conv_candidates import (
    conv_einsum,
    conv_im2col_whole,
    conv_per_tap,
    conv_tensordot,
    max_backward_argmax,
    pool_window_reduce,
    transpose_dilated,
    transpose_einsum,
    transpose_per_tap,
    weight_grad_einsum,
    weight_grad_per_tap,
    weight_grad_tensordot,
)

Array = np.ndarray[Any, Any]
Formulation = Callable[[], Array]


# --- the cases and the table ----------------------------------------------------------------

# (N, C_in, spatial, C_out, kernel, stride, padding, dilation, groups): a digits CNN (8x8), an
# MNIST-like one (28x28), a CIFAR-like one (32x32), and the variants of the op's parameters
CONVS = (
    ("digits 1", 256, 1, (8, 8), 16, 3, 1, 1, 1, 1),
    ("digits 2", 256, 16, (8, 8), 32, 3, 1, 1, 1, 1),
    ("digits 3", 256, 32, (4, 4), 64, 3, 1, 1, 1, 1),
    ("mnist 1 k5", 64, 1, (28, 28), 32, 5, 1, 2, 1, 1),
    ("mnist 2", 64, 32, (14, 14), 64, 3, 1, 1, 1, 1),
    ("cifar 1", 64, 3, (32, 32), 32, 3, 1, 1, 1, 1),
    ("cifar s2", 64, 32, (32, 32), 64, 3, 2, 1, 1, 1),
    ("groups 4", 64, 32, (16, 16), 32, 3, 1, 1, 1, 4),
    ("depthwise", 64, 32, (16, 16), 32, 3, 1, 1, 1, 32),
    ("dilation 2", 64, 16, (16, 16), 32, 3, 1, 2, 2, 1),
    ("1-D k5", 64, 16, (128,), 32, 5, 1, 2, 1, 1),
    ("cifar N128", 128, 32, (32, 32), 64, 3, 1, 1, 1, 1),  # a window matrix over 32 MiB
)
# (N, C, spatial, kernel, stride, padding)
POOLS = (
    ("digits 2x2", 256, 16, (8, 8), 2, 2, 0),
    ("digits 4x4", 256, 32, (4, 4), 2, 2, 0),
    ("mnist 2x2", 64, 32, (28, 28), 2, 2, 0),
    ("mnist 14x14", 64, 64, (14, 14), 2, 2, 0),
    ("k3 s2 p1", 64, 32, (32, 32), 3, 2, 1),
    ("1-D k2", 64, 32, (128,), 2, 2, 0),
)
QUICK = {"digits 2", "cifar s2", "groups 4", "digits 2x2", "k3 s2 p1"}


def _best(
    fns: dict[str, Formulation], seconds: float, clock: Callable[[], float]
) -> dict[str, float]:
    """Each formulation's best time on ``clock`` over rounds in which all take a turn, at least
    7 rounds and until ``seconds`` have passed; each result checked against the first's."""
    results = {name: fn() for name, fn in fns.items()}
    first = next(iter(results.values()))
    for name, value in results.items():
        tolerance = 1e-4 if first.dtype == np.float32 else 1e-10
        scale = float(np.abs(first).max()) or 1.0
        assert value.shape == first.shape, (name, value.shape, first.shape)
        assert np.allclose(value, first, rtol=tolerance, atol=tolerance * scale), name
    best = dict.fromkeys(fns, math.inf)
    deadline, rounds = time.perf_counter() + seconds, 0
    while rounds < 7 or (time.perf_counter() < deadline and rounds < 100):
        for name, fn in fns.items():
            start = clock()
            fn()
            best[name] = min(best[name], clock() - start)
        rounds += 1
    return best


Case = tuple[str, str, str, dict[str, Formulation]]  # shape, dtype, op, formulations


def _conv_cases(quick: bool) -> Iterator[Case]:
    rng = np.random.default_rng(0)
    for name, n, ci, spatial, co, k, s, p, d, g in CONVS:
        if quick and name not in QUICK:
            continue
        dims = len(spatial)
        fields: Any = {"stride": (s,) * dims, "padding": ((p, p),) * dims, "dilation": (d,) * dims}
        for dtype in ("float32", "float64"):
            x = rng.standard_normal((n, ci, *spatial)).astype(dtype)
            w = rng.standard_normal((co, ci // g, *(k,) * dims)).astype(dtype)
            op = Conv(out=0, x=1, w=2, groups=g, **fields)
            forward = {
                "server": nn.conv,
                "im2col whole": conv_im2col_whole,
                "tensordot": conv_tensordot,
                "einsum": conv_einsum,
                "per tap": conv_per_tap,
            }
            yield name, dtype, "conv", {f: partial(fn, x, w, op) for f, fn in forward.items()}
            y = nn.conv(x, w, op)
            kernel = (k,) * dims
            wop = Conv(out=0, x=1, w=2, op="conv_weight_grad", groups=g, kernel=kernel, **fields)
            grads = {
                "server": nn.conv_weight_grad,
                "tensordot": weight_grad_tensordot,
                "einsum": weight_grad_einsum,
                "per tap": weight_grad_per_tap,
            }
            yield name, dtype, "weight grad", {f: partial(fn, x, y, wop) for f, fn in grads.items()}
            # the transpose with the same parameters, back to x's shape: x's gradient
            extra = tuple(
                m - ((o - 1) * s - 2 * p + d * (k - 1) + 1)
                for m, o in zip(spatial, y.shape[2:], strict=True)
            )
            wt = (
                w.reshape(g, co // g, ci // g, *kernel).swapaxes(1, 2).reshape(co, ci // g, *kernel)
            )
            top = Conv(
                out=0, x=1, w=2, op="conv_transpose", groups=g, output_padding=extra, **fields
            )
            transposes: dict[str, Callable[..., Array]] = {
                "server": nn.conv_transpose,
                "einsum": transpose_einsum,
                "per tap": transpose_per_tap,
                "dilated": partial(transpose_dilated, forward=nn.conv),
            }
            yield (
                name,
                dtype,
                "transpose",
                {f: partial(fn, y, np.ascontiguousarray(wt), top) for f, fn in transposes.items()},
            )


def _pool_cases(quick: bool) -> Iterator[Case]:
    rng = np.random.default_rng(0)
    for name, n, c, spatial, k, s, p in POOLS:
        if quick and name not in QUICK:
            continue
        dims = len(spatial)
        fields: Any = {"kernel": (k,) * dims, "stride": (s,) * dims, "padding": (p,) * dims}
        for dtype in ("float32", "float64"):
            x = rng.standard_normal((n, c, *spatial)).astype(dtype)
            for kind in ("max", "avg"):
                op = Pool(out=0, op=kind, x=1, **fields)
                yield (
                    name,
                    dtype,
                    f"{kind} pool",
                    {
                        "server": partial(nn.run_pool, op, [x], ()),
                        "window reduce": partial(pool_window_reduce, x, op),
                    },
                )
            y = nn.run_pool(Pool(out=0, op="max", x=1, **fields), [x], ())
            grad = rng.standard_normal(tuple(y.shape)).astype(dtype)
            bop = PoolBackward(out=0, op="max", x=1, grad=2, **fields)
            yield (
                name,
                dtype,
                "max backward",
                {
                    "server": partial(nn.run_pool_backward, bop, [x, grad], ()),
                    "argmax": partial(max_backward_argmax, x, grad, bop),
                },
            )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.conv_formulations", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="a few shapes, briefly")
    parser.add_argument("--seconds", type=float, default=0.5, help="per row, at least 7 rounds")
    parser.add_argument(
        "--wall", action="store_true", help="wall-clock time, BLAS on its default threads"
    )
    args = parser.parse_args(argv)
    seconds = 0.05 if args.quick else args.seconds
    clock = time.perf_counter if args.wall else time.thread_time
    with contextlib.nullcontext() if args.wall else threadpool_limits(1, user_api="blas"):
        _table(args.quick, seconds, clock)


def _table(quick: bool, seconds: float, clock: Callable[[], float]) -> None:
    print(f"{'case':<12} {'dtype':<8} {'op':<13} formulation: ms (x the fastest)")
    against: dict[tuple[str, str], list[float]] = {}  # (op, formulation): its times / server's
    for cases in (_conv_cases(quick), _pool_cases(quick)):
        for name, dtype, op, fns in cases:
            best = _best(fns, seconds, clock)
            fastest = min(best.values())
            cells = "  ".join(f"{f} {t * 1e3:.2f} ({t / fastest:.1f})" for f, t in best.items())
            print(f"{name:<12} {dtype:<8} {op:<13} {cells}", flush=True)
            for f, t in best.items():
                against.setdefault((op, f), []).append(t / best["server"])
    print("\neach formulation's time / the server's: median (least, most) over the rows")
    for (op, f), ratios in against.items():
        if f != "server":
            low, mid, high = min(ratios), statistics.median(ratios), max(ratios)
            print(f"{op:<13} {f:<14} {mid:.2f} ({low:.2f}-{high:.2f})")


if __name__ == "__main__":
    main()
