"""``matmul`` with its gradient, batched and broadcast, and 1-D operands as the standard
treats them (a vector is a row on the left and a column on the right); and ``linear``, the
affine map of a dense layer as one op."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ._common import as_tensor, reshaped_or_same, same_device, unbroadcast
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
            ga = reshaped_or_same(ga, tuple(aa.shape), xp.reshape)
        if b.requires_grad:
            gb = unbroadcast(xp, xp.matrix_transpose(a2) @ g2, tuple(b2.shape))
            gb = reshaped_or_same(gb, tuple(ba.shape), xp.reshape)
        return ga, gb

    return record(ad, "matmul", y, (a, b), backward)


def linear(ad: Autodiff, x: Any, weight: Any, bias: Any = None, /) -> Tensor:
    """``x @ weight.mT + bias`` (PyTorch's ``F.linear``): ``weight`` is (out, in), ``x`` is
    (..., in). As one op its weight gradient is ``g.mT @ x``, made in the weight's own layout;
    through ``matmul`` and ``.mT`` it would be the transpose of a C-contiguous array, which an
    optimizer's in-place update then reads against the grain, many times slower
    (bench/REASONS.md, 'linear as one op')."""
    t, w = as_tensor(ad, x), as_tensor(ad, weight)
    b = None if bias is None else as_tensor(ad, bias)
    if w.ndim != 2 or (b is not None and tuple(b.shape) != (w.shape[0],)):
        shapes = f"weight {w.shape}" + ("" if b is None else f", bias {b.shape}")
        raise ValueError(f"linear: weight must be (out, in) and bias (out,), not {shapes}")
    inputs = same_device("linear", t, w, *(() if b is None else (b,)))
    xp, xa, wa = ad.xp, t.array, w.array
    y = xa @ xp.matrix_transpose(wa)
    if b is not None:
        y = y + b.array

    def backward(g: Any) -> tuple[Any, ...]:
        rows = _as_rows(xp, g, w.shape[0])  # every leading axis is a batch of rows
        gx = g @ wa if t.requires_grad else None
        gw = xp.matrix_transpose(rows) @ _as_rows(xp, xa, w.shape[1]) if w.requires_grad else None
        gb = xp.sum(rows, axis=0) if b is not None and b.requires_grad else None
        return (gx, gw) if b is None else (gx, gw, gb)

    return record(ad, "linear", y, inputs, backward)


def _as_rows(xp: Any, a: Any, n: int | None) -> Any:
    """``a`` (..., n) as a matrix (rows, n); a matrix as it is, without a reshape op (a
    reshape to the same shape is a view of the same layout: nothing to send for it)."""
    return a if a.ndim == 2 else xp.reshape(a, (-1, n))


FUNCTIONS: dict[str, Callable[..., Tensor]] = {"matmul": matmul, "linear": linear}
