"""The cost model's audit runs: ``python -m bench.op_costs`` times every op of the catalogue
against its count (``executor.cost``) and prints the bound it measured. Never that anything is
fast: that every op has a case, that each prints a ratio, that the summary states a bound."""

from __future__ import annotations

from typing import Any, get_args

import pytest

from bench import op_costs
from bench._op_cases import FAMILIES
from protocol.ops import (
    AnyOp,
    BinaryScalar,
    FromBuffer,
    InPlaceBinaryScalar,
    Pull,
    RunGraph,
    RunSegment,
)

from .test_bench_nn import run_bench

# costs 0; its ops summed (a graph's, a segment's); a transfer
NOT_RUN_BY_THE_EXECUTOR = (FromBuffer, RunGraph, RunSegment, Pull)
NO_SCALAR_MATMUL = {(BinaryScalar, "matmul"), (InPlaceBinaryScalar, "matmul")}  # refused


def _catalogue() -> set[tuple[type, Any]]:
    """Every op type the executor runs, with each name its ``op`` field takes (None: none)."""
    pairs: set[tuple[type, Any]] = set()
    for op_type in get_args(AnyOp):
        if op_type in NOT_RUN_BY_THE_EXECUTOR:
            continue
        field = op_type.model_fields.get("op")
        names = get_args(field.annotation) if field is not None else (None,)
        pairs.update((op_type, name) for name in names)
    return pairs - NO_SCALAR_MATMUL


def test_the_audit_has_a_case_for_every_op_of_the_catalogue() -> None:
    audited = {
        (type(op), getattr(op, "op", None))
        for _, (_, op, _) in op_costs.cases([*FAMILIES, op_costs.NN], everything=False)
    }
    missing = _catalogue() - audited
    assert not missing, sorted((t.__name__, name) for t, name in missing)


@pytest.mark.e2e
def test_the_audit_prints_a_ratio_for_every_op_and_its_bound() -> None:
    out = run_bench("bench.op_costs", "--rounds", "1", "--blas-threads", "1")
    lines = out.splitlines()
    header = lines[0].split()
    assert header[:3] == ["family", "case", "op"], lines[0]
    summary = lines.index("the most ns per counted unit, by op (and its case)")
    printed = {line.split()[0] for line in lines[summary + 1 :] if line.strip()}
    for op_type, name in _catalogue():
        label = op_type.model_construct(**({} if name is None else {"op": name})).name()
        assert label in printed, (label, out[-2000:])
    assert any(line.startswith("bound: time <= ") for line in lines), out[-2000:]
