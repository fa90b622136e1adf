"""The ``linalg`` extension, with numpy.linalg."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from protocol.codec import Buffer
from protocol.ops import Linalg

from .base import Array, Runner


def linalg(op: Linalg, args: Sequence[Array], buffers: Sequence[Buffer]) -> tuple[Array, ...]:
    la: Any = np.linalg
    name = op.op
    if name in ("solve", "cross", "outer", "tensordot", "vecdot"):
        a, b = args
        if name == "vecdot":
            vecdot: Any = np.vecdot
            return (vecdot(a, b, axis=op.axis[0] if op.axis else -1),)
        if name == "solve":
            return (la.solve(a, b),)
        if name == "cross":
            return (la.cross(a, b, axis=op.axis[0] if op.axis else -1),)
        if name == "outer":
            return (la.outer(a, b),)
        return (la.tensordot(a, b, axes=(op.axes1, op.axes2)),)
    x = args[0]
    rtol = args[1] if len(args) == 2 else op.rtol
    kwargs: Any = {
        "cholesky": {"upper": op.upper},
        "qr": {"mode": op.mode},
        "svd": {"full_matrices": op.full_matrices},
        "matrix_power": {"n": op.n},
        "diagonal": {"offset": op.offset},
        "trace": {"offset": op.offset},
        "matrix_norm": {"ord": "fro" if op.ord is None else op.ord, "keepdims": op.keepdims},
        "vector_norm": {
            "ord": 2 if op.ord is None else op.ord,
            "keepdims": op.keepdims,
            "axis": op.axis,
        },
        "matrix_rank": {"rtol": rtol},
        "pinv": {"rtol": rtol},
    }.get(name, {})
    result = getattr(la, name)(x, **kwargs)
    return tuple(result) if isinstance(result, tuple) else (result,)


RUNNERS: dict[type, Runner] = {Linalg: linalg}
