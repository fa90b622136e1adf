"""``python -m bench.op_costs [--all] [--only FAMILY ...]``: the audit of the cost model, every
op's count against the time its runner takes, one row per op and shape.

The count is ``executor.cost`` (``server/executor/costs.py``), in element operations of about a
nanosecond each, as the session takes it (lengths resolved first); the time is the best of a
few runs of the server's runner, wall-clock, BLAS on its default threads or on
``--blas-threads N``. Each row prints both and their ratio, nanoseconds per counted unit. The
cases (``bench/_op_cases.py``) are each op at a plain shape and at the shapes where its work
is not proportional to its largest array; the neural-network extension's are
``bench.nn_costs``'s short run. The summary gives each op's most, and the most of all: the
model's error bound, which bench/REASONS.md ('The op cost model') states, apart from the
cases with an operand read against its layout, which no shape shows (its stated exception).
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator, Sequence

from protocol import InvalidOpError
from protocol.version import version_text

from . import nn_costs
from ._op_cases import AGAINST_LAYOUT, FAMILIES, Case
from ._timing import add_timing_options, best_seconds, blas_held, count, metas_of, run_op

NN = "neural-network"


def _nn_cases(everything: bool) -> Iterator[Case]:
    for rows in (nn_costs.conv_rows, nn_costs.pool_rows):
        yield from rows(everything, "float32")
    yield from nn_costs.elementwise_rows("float32")


def cases(families: Sequence[str], everything: bool) -> Iterator[tuple[str, Case]]:
    """Each family's cases that the op's checks take (an op on dtypes it refuses, such as
    ``floor_divide`` of complex numbers, never reaches numpy on a server)."""
    for family in families:
        made = _nn_cases(everything) if family == NN else FAMILIES[family](everything)
        for case in made:
            with contextlib.suppress(InvalidOpError):
                metas_of(case[1], case[2])
                yield family, case


def main(argv: Sequence[str] | None = None) -> None:
    names = [*FAMILIES, NN]
    parser = argparse.ArgumentParser(prog="python -m bench.op_costs", description=__doc__)
    parser.add_argument("--version", action="version", version=version_text())
    parser.add_argument("--all", action="store_true", help="more sizes and dtypes")
    parser.add_argument("--only", action="append", choices=names, help="just these families")
    add_timing_options(parser, rounds=3)
    args = parser.parse_args(argv)
    with blas_held(args):
        _table(args.only or names, args.all, args.rounds)


def _table(families: Sequence[str], everything: bool, rounds: int) -> None:
    rows = list(cases(families, everything))
    for _, (_, op, inputs) in rows:  # the process's memory touched once, untimed
        run_op(op, inputs)
    print(f"{'family':<16} {'case':<34} {'op':<20} {'ms':>8} {'count':>14} {'ns/unit':>8}")
    most: dict[str, tuple[float, str]] = {}
    layout: list[tuple[float, str]] = []  # the exception: an operand read against its layout
    for family, (label, op, inputs) in rows:
        counted = count(op, inputs)
        seconds = best_seconds(op, inputs, rounds)
        ratio = seconds * 1e9 / max(1, counted)
        name = op.name()
        if label in AGAINST_LAYOUT:
            layout.append((ratio, f"{name}, {label}"))
        elif ratio > most.get(name, (0.0, ""))[0]:
            most[name] = (ratio, label)
        print(
            f"{family:<16} {label:<34} {name:<20} {seconds * 1e3:>8.3f} {counted:>14,} "
            f"{ratio:>8.2f}",
            flush=True,
        )
    print("\nthe most ns per counted unit, by op (and its case)")
    for name, (ratio, label) in sorted(most.items(), key=lambda item: -item[1][0]):
        print(f"{name:<22} {ratio:>8.2f}  {label}")
    worst, (ratio, label) = max(most.items(), key=lambda item: item[1][0])
    print(f"\nbound: time <= {ratio:.2f} ns per counted unit ({worst}, {label})")
    for ratio, case in layout:
        print(f"against its layout (not in the bound): {ratio:.2f} ns per counted unit ({case})")


if __name__ == "__main__":
    main()
