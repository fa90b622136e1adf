"""A join of many inputs runs a chunk at a time into its result (``server/executor/
manipulation.py``: numpy holds the GIL through one call): the same values, shape and dtype as
numpy's one call, for ``stack`` and ``concat`` along every axis, flattened, and across dtypes
that promote."""

from __future__ import annotations

import numpy as np
import pytest

from protocol.ops import Join
from server.executor import manipulation

DTYPES = [("float64",), ("int8", "float32"), ("bool", "int64"), ("complex64", "float64")]
AXES = {"stack": [0, 1, 2, -1, None], "concat": [0, 1, -1, -2, None]}


@pytest.mark.parametrize("dtypes", DTYPES, ids=["/".join(d) for d in DTYPES])
@pytest.mark.parametrize(("kind", "axis"), [(k, a) for k, axes in AXES.items() for a in axes])
def test_a_join_by_chunks_is_numpys_join(
    monkeypatch: pytest.MonkeyPatch, kind: str, axis: int | None, dtypes: tuple[str, ...]
) -> None:
    monkeypatch.setattr(manipulation, "JOIN_CHUNK", 3)
    rng = np.random.default_rng(len(dtypes))
    count = 11  # three full chunks and a short one
    if kind == "stack":
        shapes = [(2, 3)] * count
    else:  # a different length along the joined axis (any axis, flattened)
        joined = 0 if axis is None else axis % 2
        shapes = [
            (2, 3)[:joined] + (int(rng.integers(1, 4)),) + (2, 3)[joined + 1 :]
            for _ in range(count)
        ]
    xs = [
        (rng.standard_normal(s) * 5).astype(dtypes[i % len(dtypes)]) for i, s in enumerate(shapes)
    ]
    op = Join(op=kind, out=1, xs=tuple(range(count)), axis=axis)
    got = manipulation.join(op, xs, [])
    want = np.stack(xs, axis=axis or 0) if kind == "stack" else np.concatenate(xs, axis=axis)
    assert (got.shape, got.dtype) == (want.shape, want.dtype)
    np.testing.assert_array_equal(got, want)
