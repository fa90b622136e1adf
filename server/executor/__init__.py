"""The numpy executor: runs one checked op and returns its array.

One module per op family, mirroring ``protocol/ops/``; each lists its runners in ``RUNNERS``.
Knows nothing of bytes on sockets or of sessions (the import contracts in ``pyproject.toml``).
What an op will cost numpy, before it runs, is :func:`cost` (``costs.py``); what it allocates
beside its results, :func:`scratch`.

Callers run ``op.infer`` first (the check) and pass its result; :func:`run` then calls numpy and
verifies that numpy produced exactly the inferred shape and dtype, so the client's local view of
every tensor is the truth (ARCHITECTURE.md, invariant 3).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial

import numpy as np

from protocol import TensorMeta, to_numpy
from protocol.codec import Buffer
from protocol.ops import (
    UNKNOWN,
    AnyOp,
    GetItem,
    InPlaceBinary,
    InPlaceBinaryScalar,
    Nonzero,
    Repeat,
    SetItem,
)

from . import (
    creation,
    data,
    elementwise,
    fft,
    indexing,
    linalg,
    manipulation,
    nn,
    optim,
    reduction,
)
from .base import Array, Runner
from .costs import cost as cost
from .creation import uploads_kept_apart as uploads_kept_apart


class InferenceMismatch(AssertionError):
    """numpy produced another shape or dtype than the protocol inferred: a bug in a rule."""


_FAMILIES = (creation, elementwise, reduction, manipulation, indexing, data, linalg, fft, nn, optim)
_RUNNERS: dict[type, Runner] = {t: r for family in _FAMILIES for t, r in family.RUNNERS.items()}
# The in-place ops' runners, each called with ``in_place`` (whether it may write the target)
_WRITERS: dict[type, Callable[..., Array]] = {
    SetItem: indexing.setitem,
    InPlaceBinary: elementwise.binary_inplace,
    InPlaceBinaryScalar: elementwise.binary_inplace,
    **optim.IN_PLACE,
}
# ... bound to write into the target: a plan's steps (its session made every input safe first)
IN_PLACE_RUNNERS: dict[type, Runner] = {t: partial(w, in_place=True) for t, w in _WRITERS.items()}
_SCRATCH = {**nn.SCRATCH, **optim.SCRATCH}


def scratch(op: AnyOp, meta: TensorMeta, args: Sequence[Array]) -> int:
    """The most bytes numpy allocates beside ``op``'s results while it runs, where that can be
    much more than the results (a convolution's window matrix); 0 for the other ops. ``args``
    and ``meta`` as :func:`cost` takes them. The session reserves them with the results."""
    count = _SCRATCH.get(type(op))
    return 0 if count is None else count(op, meta, args)


def run(
    op: AnyOp,
    args: Sequence[Array],
    buffers: Sequence[Buffer],
    metas: Sequence[TensorMeta],
    in_place: bool = False,
) -> tuple[Array, ...]:
    """Run ``op`` on ``args`` (arrays of ``op.inputs()``); ``metas`` is ``op.infer_all(...)``.
    Returns one array per output; a dimension inferred as ``UNKNOWN`` may take any length.
    ``in_place``: an in-place op may write into its target's array (nothing else shares it).

    Raises:
        Exception: whatever numpy raises for a genuine runtime failure.
        InferenceMismatch: a result differs from its meta.
    """
    with np.errstate(all="ignore"):
        raw = runner(op, in_place)(op, args, buffers)
    return checked(op, raw, metas)


def runner(op: AnyOp, in_place: bool = False) -> Runner:
    """The function that runs ``op``: call it as ``runner(op, in_place)(op, args, buffers)``
    inside ``np.errstate(all="ignore")``, and pass what it returns to :func:`checked`. This is
    :func:`run` in two steps, for a caller's fast path. ``in_place`` as :func:`run` takes it."""
    write = _WRITERS.get(type(op))
    if write is not None:
        return partial(write, in_place=in_place)
    return _RUNNERS[type(op)]


def checked(
    op: AnyOp, raw: Array | tuple[Array, ...], metas: Sequence[TensorMeta]
) -> tuple[Array, ...]:
    """The arrays of what a runner returned, one per output, verified against ``metas``.

    Raises:
        InferenceMismatch: a result differs from its meta.
    """
    results = tuple(np.asarray(r) for r in (raw if isinstance(raw, tuple) else (raw,)))
    if len(results) != len(metas) or not all(map(_matches, results, metas)):
        got = ", ".join(f"{r.dtype}{list(r.shape)}" for r in results)
        want = ", ".join(f"{m.dtype}{list(m.shape)}" for m in metas)
        raise InferenceMismatch(f"{op.describe()} gave {got}, inferred {want}")
    return results


def resolve(
    op: AnyOp, args: Sequence[Array], metas: tuple[TensorMeta, ...]
) -> tuple[TensorMeta, ...]:
    """``metas`` with the data-dependent lengths that the inputs tell cheaply filled in, so
    that the output is capped and reserved before numpy allocates it: ``repeat`` by a tensor
    has the sum of its repeats (an exact Python int); ``nonzero`` and an index by one boolean
    mask have the mask's count of true elements. Other ``UNKNOWN`` dims stay (``unique_*``,
    several masks; a negative repeat, which numpy refuses).
    """
    if isinstance(op, Nonzero):
        count = int(np.count_nonzero(args[0]))
        return tuple(TensorMeta((count,), m.dtype) for m in metas)
    if isinstance(op, GetItem):
        masks = [a for a in args[1:] if a.dtype == np.bool_]
        if len(masks) != 1 or metas[0].shape.count(UNKNOWN) != 1:
            return metas
        count = int(np.count_nonzero(masks[0]))
        shape = tuple(count if d == UNKNOWN else d for d in metas[0].shape)
        return (TensorMeta(shape, metas[0].dtype),)
    if not isinstance(op, Repeat) or len(args) != 2:
        return metas
    total = manipulation.repeat_length(op, args[0], args[1])
    if total is None:
        return metas
    shape = tuple(total if d == UNKNOWN else d for d in metas[0].shape)
    return (TensorMeta(shape, metas[0].dtype),)


def _matches(result: Array, meta: TensorMeta) -> bool:
    if result.dtype != to_numpy(meta.dtype) or result.ndim != len(meta.shape):
        return False
    return all(d == m or m == UNKNOWN for d, m in zip(result.shape, meta.shape, strict=True))
