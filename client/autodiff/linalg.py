"""``matmul`` with its gradient, batched and broadcast, and 1-D operands as the standard
treats them (a vector is a row on the left and a column on the right)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ._common import as_tensor, same_device, unbroadcast
from .tensor import Tensor, record

if TYPE_CHECKING:
    from .namespace import Autodiff


def matmul(ad: Autodiff, x1: Any, x2: Any, /) -> Tensor:
    a, b = as_tensor(ad, x1), as_tensor(ad, x2)
    same_device("matmul", a, b)
    xp, aa, ba = ad.xp, a.array, b.array
    y = xp.matmul(aa, ba)

    def backward(g: Any) -> tuple[Any, Any]:
        # As matrices: a (..., n, k), b (..., k, m), g (..., n, m).
        a2 = xp.reshape(aa, (1, -1)) if aa.ndim == 1 else aa
        b2 = xp.reshape(ba, (-1, 1)) if ba.ndim == 1 else ba
        if aa.ndim == 1 and ba.ndim == 1:  # a dot product: g is 0-d
            g2 = xp.reshape(g, (1, 1))
        elif aa.ndim == 1:
            g2 = xp.expand_dims(g, axis=-2)  # the row a vector on the left made
        else:
            g2 = xp.expand_dims(g, axis=-1) if ba.ndim == 1 else g  # the column
        ga = gb = None
        if a.requires_grad:
            ga = unbroadcast(xp, g2 @ xp.matrix_transpose(b2), tuple(a2.shape))
            ga = xp.reshape(ga, tuple(aa.shape))
        if b.requires_grad:
            gb = unbroadcast(xp, xp.matrix_transpose(a2) @ g2, tuple(b2.shape))
            gb = xp.reshape(gb, tuple(ba.shape))
        return ga, gb

    return record(ad, "matmul", y, (a, b), backward)


FUNCTIONS: dict[str, Callable[..., Tensor]] = {"matmul": matmul}
