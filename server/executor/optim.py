"""The optimizer extension's ops (``protocol/ops/optim.py``): Adam's per-parameter chains, each
the numpy calls that its ops one by one make (``elementwise``: a Python scalar becomes a 0-d
array of its operand's dtype, ``scalar_array``; an in-place op is numpy's ``out=``), in the
same order on the same dtypes, so the bits are those of the chain sent op by op."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from protocol import TensorMeta
from protocol.codec import Buffer
from protocol.ops import AdamDirection, MomentUpdate

from .base import Array, Runner, Scratch
from .elementwise import scalar_array


def moment_update(
    op: MomentUpdate, args: Sequence[Array], buffers: Sequence[Buffer], in_place: bool = False
) -> Array:
    """``out *= decay; out += scale * grad`` (``squared``: ``(scale * grad) * grad``): into the
    target when ``in_place`` (the store made its memory safe to write), else into a copy (a
    read-only view), as ``elementwise.binary_inplace``. The scaled gradient is made first, so
    nothing is written before the last allocation, and a gradient that shares the moment's
    memory is read as it was (the op refuses the moment's own id as its gradient)."""
    target, grad = args
    step = np.multiply(scalar_array(op.scale, grad), grad)
    if op.squared:
        np.multiply(step, grad, out=step)  # numpy's own loop: the product's bits either way
    out = target if in_place and target.flags.writeable else target.copy()
    np.multiply(out, scalar_array(op.decay, out), out=out)
    np.add(out, step, out=out)
    return out


def adam_direction(op: AdamDirection, args: Sequence[Array], buffers: Sequence[Buffer]) -> Array:
    """``(step_size * exp_avg) / (sqrt(exp_avg_sq) + eps_term)``: ``denom = sqrt(v)``,
    ``denom += eps_term``, ``step_size * m``, then the quotient, a new array laid out as
    numpy lays out the quotient of the two."""
    m, v, step_size, eps_term = args
    denom = np.sqrt(v)
    np.add(denom, eps_term, out=denom)
    quotient: Array = np.divide(np.multiply(step_size, m), denom)
    return quotient


def _moment_scratch(op: MomentUpdate, meta: TensorMeta, args: Sequence[Array]) -> int:
    """The scaled gradient beside the moment (its square written into it)."""
    return int(args[1].nbytes)


def _direction_scratch(op: AdamDirection, meta: TensorMeta, args: Sequence[Array]) -> int:
    """The denominator and the numerator beside the result (each an ``exp_avg``'s size)."""
    return 2 * int(args[0].nbytes)


RUNNERS: dict[type, Runner] = {AdamDirection: adam_direction}
IN_PLACE: dict[type, Callable[..., Array]] = {MomentUpdate: moment_update}  # with in_place
SCRATCH: dict[type, Scratch] = {MomentUpdate: _moment_scratch, AdamDirection: _direction_scratch}
