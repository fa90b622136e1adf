"""The fast path of :class:`~server.session.Session` for the pipelined hot case: a ``Unary``,
``Binary`` (not matmul) or ``BinaryScalar`` op on stored inputs, creating a new tensor. The
session imports it; it imports the session's outcome rules (``server/outcome.py``), never the
session.

It runs exactly the checks and accounting of the session's general path, in the same order and
with the same errors, less the work it can prove unneeded: the inferred output, its bytes under
the per-op caps and its cost depend only on (op name, input metas; and for a scalar operand its
Python type and side, once an integer is known to fit), so they are computed once and cached
(only when the checks pass: a refused op goes to the general path, which refuses it again with
its error), with the op's computation as one prepared ufunc call where it is one
(``elementwise.one_call``: no dtype rules per op, a scalar's dtype found once;
bench/REASONS.md, 'Prepared calls on the fast path'); ``resolve`` leaves these ops' metas
unchanged; a result that numpy allocated afresh (its own root, not held, of exactly the
inferred shape, dtype and reserved bytes) needs none of the root bookkeeping of
:meth:`Outcomes.keep`. Anything else — a failed or unknown input, a taken output id, a refused
batch, a result that is a view or not the inferred one — goes to the general code, before
anything was changed or, after numpy ran, through :meth:`Outcomes.keep`; a refused reservation
or a numpy error is settled by :class:`~server.outcome.Outcomes`, as on the general path. The
caller holds ``np.errstate(all="ignore")`` around the calls.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from protocol import InvalidOpError, TensorMeta, to_numpy
from protocol.ops import UNKNOWN, AnyOp, Binary, BinaryScalar, Unary
from protocol.ops.elementwise import operand_dtype

from . import executor
from .errors import StoreError
from .executor import elementwise
from .limits import output_bytes
from .outcome import Job, Outcomes
from .store import Stored

FAST_OPS = frozenset({Unary, Binary, BinaryScalar})  # the op types that FastPath.run takes
_FAST_TYPES = (Unary, Binary, BinaryScalar)  # for isinstance: a tuple, not a Union built per op
_ONE_INPUT = (Unary, BinaryScalar)
RULES_CACHED = 256  # (op, input metas) whose checks a session keeps; then it starts over

# Output meta, its bytes, cost, numpy dtype, and the op's computation as one prepared call
# (elementwise.one_call) or None for the executor's runner.
Rule = tuple[TensorMeta, int, int, np.dtype[Any], Callable[[Any, Sequence[Any]], Any] | None]


class FastPath:
    """One session's fast path, with its cache of checks by (op name, input metas)."""

    def __init__(self, outcomes: Outcomes, inline_cost: int) -> None:
        self._outcomes = outcomes
        self._store = outcomes.store  # one attribute lookup per op, not two
        self._limits = outcomes.limits
        self._inline_cost = inline_cost
        self._rules: dict[tuple[Any, ...], Rule] = {}

    def run(self, op: AnyOp, job: Job, inline: bool) -> bool | None:
        """Run ``op`` as ``Session._general`` would, when it is a ``Unary``, ``Binary`` (not
        matmul) or ``BinaryScalar`` op on stored inputs with a free output id and the batch is
        not refused.
        Returns False when it is too costly to run ``inline`` (nothing changed), True when it
        ran or failed, and None (nothing changed) for any other case, which the caller then
        gives to ``Session._general``. The caller holds ``np.errstate(all="ignore")``.
        """
        if job.rejected is not None or op.out in self._store:
            return None
        found = self._inputs(op)
        if found is None:
            return None
        args, key = found
        assert isinstance(op, _FAST_TYPES)  # what _inputs took
        store = self._store
        entry = self._rules.get(key)
        if entry is None:
            metas = key[-1:] if isinstance(op, BinaryScalar) else key[1:]
            entry = self._rule(op, args, key, metas)
            if entry is None:
                return None
        meta, nbytes, work, dtype, call = entry
        if inline and work > self._inline_cost:
            return False
        try:
            store.reserve(nbytes)
        except StoreError as exc:
            self._outcomes.fail(op, exc.code, str(exc), job)
            return True
        try:
            raw = call(op, args) if call is not None else executor.runner(op)(op, args, job.buffers)
        except Exception as exc:
            self._outcomes.run_failed(op, exc, nbytes, job)
            return True
        if (
            type(raw) is np.ndarray
            and raw.base is None
            and raw.dtype == dtype
            and raw.shape == meta.shape
            and raw.nbytes == nbytes
            and not store.holds(raw)
        ):
            store.put(op.out, Stored(raw, meta), reserved=nbytes)
            outcomes = self._outcomes  # what Outcomes.keep counts for a stored result
            outcomes.ops_run += 1
            outcomes.op_counts[op.op] += 1
        else:
            self._outcomes.keep(op, raw, (meta,), nbytes, job)
        return True

    def _inputs(self, op: AnyOp) -> tuple[list[np.ndarray[Any, Any]], tuple[Any, ...]] | None:
        """The input arrays of a fast op and the key of its rule, or None when it must take the
        general path (matmul; an input missing or failed; an integer scalar that may not fit).
        The key holds the input metas last."""
        store = self._store
        if isinstance(op, Binary):
            if op.op == "matmul":
                return None
            a, b = store.lookup(op.x1), store.lookup(op.x2)
            if type(a) is not Stored or type(b) is not Stored:
                return None
            return [a.array, b.array], (op.op, a.meta, b.meta)
        assert isinstance(op, _ONE_INPUT)
        a = store.lookup(op.x)
        if type(a) is not Stored:
            return None
        if not isinstance(op, BinaryScalar):
            return [a.array], (op.op, a.meta)
        # The rule depends on the scalar's type and side, not its value, but for whether an
        # integer fits: that is checked per op (a refusal goes to the general path).
        scalar = op.scalar
        if type(scalar) is int:
            try:
                operand_dtype(scalar, a.meta.dtype)
            except InvalidOpError:
                return None
        return [a.array], (op.op, type(scalar), op.scalar_first, a.meta)

    def _rule(
        self,
        op: Unary | Binary | BinaryScalar,
        args: list[np.ndarray[Any, Any]],
        key: tuple[Any, ...],
        metas: tuple[TensorMeta, ...],
    ) -> Rule | None:
        """The cached checks of :meth:`run` for ``key`` (the op's ``metas`` in it), or None when
        they refuse the op (nothing is cached then: :meth:`Session._general` refuses it again,
        with its error)."""
        try:
            (meta,) = op.infer_all(*metas)
            nbytes = output_bytes((meta,), self._limits)
        except (InvalidOpError, StoreError):
            return None
        if UNKNOWN in meta.shape:
            return None
        work = executor.cost(op, meta, args)
        if work > self._limits.max_op_cost:
            return None  # the general path refuses it (limit_exceeded)
        if len(self._rules) >= RULES_CACHED:
            self._rules.clear()
        call = elementwise.one_call(op, [m.dtype for m in metas])
        entry = (meta, nbytes, work, to_numpy(meta.dtype), call)
        self._rules[key] = entry
        return entry
