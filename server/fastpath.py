"""The fast path of :class:`~server.session.Session`: the ops a pipelined batch and a training
step are made of, on stored inputs. The session imports it; it imports the session's outcome
rules (``server/outcome.py``), never the session.

It runs exactly the checks and accounting of the session's general path, in the same order and
with the same errors, less the work it can prove unneeded. An op's inferred output, its bytes
under the per-op caps (with the scratch numpy allocates beside it) and its cost depend only on
the op's fields but its ids and on its input metas, so they are computed once and cached (only
when the checks pass: a refused op goes to the general path, which refuses it again with its
error). Two caches, by what keys them:

- :meth:`FastPath.run`: a ``Unary``, ``Binary`` (not matmul) or ``BinaryScalar`` op creating a
  new tensor, by (op name, input metas; and for a scalar operand its Python type and side,
  once an integer is known to fit), with the op's computation as one prepared ufunc call where
  it is one (``elementwise.one_call``: no dtype rules per op, a scalar's dtype found once;
  bench/REASONS.md, 'Prepared calls on the fast path'); a result that numpy allocated afresh
  (its own root, not held, of exactly the inferred shape, dtype and reserved bytes) needs none
  of the root bookkeeping of :meth:`Outcomes.keep`.
- :meth:`FastPath.run_keyed`: the other ops of the training examples (matmul, reductions,
  ``where``, ``take``, ``astype``, views and other manipulations, ``full``, ``arange``, the
  neural-network and optimizer ops, and the in-place updates: ``binary_inplace*``,
  ``setitem``, ``moment_update``), by their *key* (``server/fastkeys.py``: the op's type and
  fields but its ids) and input metas (bench/REASONS.md, 'Keyed rules on the fast path'); an
  in-place binary op runs as one prepared call with ``out=`` where that is the whole op
  (``elementwise.inplace_call``). A result is stored as :meth:`Outcomes.keep` stores it
  where that is plain: a view of a root the store holds (a reshape, a slice; the target
  written in place) adds no bytes and gives its reservation back, a root of its own adds its
  bytes (the scratch's given back). An in-place op writes its target only where
  :meth:`TensorStore.prepare_write` would give the target as it is
  (``TensorStore.writes_in_place``: writeable, no reply or exposure sending its memory), and
  reserves only its scratch, as on the general path.

``resolve`` leaves these ops' metas unchanged (an index by a tensor, whose length may depend
on a mask, is not here; nor an output of data-dependent length, nor an op of several
outputs). Anything else — a failed or unknown input, a taken output id, a refused batch, a
target to move or copy, a result that is a view of memory the store does not hold or not the
inferred one — goes to the general code, before anything was changed or, after numpy ran,
through :meth:`Outcomes.keep`; a refused reservation or a numpy error is settled by
:class:`~server.outcome.Outcomes`, as on the general path. The caller holds
``np.errstate(all="ignore")`` around the calls.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np

from protocol import InvalidOpError, TensorMeta, to_numpy
from protocol.ops import UNKNOWN, AnyOp, Binary, BinaryScalar, Unary
from protocol.ops.elementwise import operand_dtype

from . import executor
from .errors import StoreError
from .executor import elementwise
from .executor.base import Runner
from .fastkeys import KEYS
from .limits import output_bytes
from .outcome import Job, Outcomes
from .roots import root_of
from .store import Stored

FAST_OPS = frozenset({Unary, Binary, BinaryScalar})  # the op types that FastPath.run takes
_FAST_TYPES = (Unary, Binary, BinaryScalar)  # for isinstance: a tuple, not a Union built per op
_ONE_INPUT = (Unary, BinaryScalar)
RULES_CACHED = 256  # (op, input metas) whose checks a session keeps; then it starts over
# (key, input metas) of the other ops whose checks a session keeps; then it starts over
# (bench/REASONS.md, 'Keyed rules on the fast path')
KEYED_CACHED = 1024

# Output meta, its bytes, cost, numpy dtype, and the op's computation as one prepared call
# (elementwise.one_call) or None for the executor's runner.
Rule = tuple[TensorMeta, int, int, np.dtype[Any], Callable[[Any, Sequence[Any]], Any] | None]


class KeyedRule(NamedTuple):
    """The cached checks of an op of ``fastkeys.KEYS``: its output's meta, the bytes to
    reserve for it and its scratch, the scratch's alone (what an in-place op reserves), its
    cost, the output's numpy dtype, the op's name (for the counts) and its runner."""

    meta: TensorMeta
    nbytes: int
    scratch: int
    work: int
    dtype: np.dtype[Any]
    name: str
    call: Runner


class FastPath:
    """One session's fast path, with its cache of checks by (op name, input metas)."""

    def __init__(self, outcomes: Outcomes, inline_cost: int) -> None:
        self._outcomes = outcomes
        self._store = outcomes.store  # one attribute lookup per op, not two
        self._limits = outcomes.limits
        self._inline_cost = inline_cost
        self._rules: dict[tuple[Any, ...], Rule] = {}
        self._keyed: dict[tuple[Any, ...], KeyedRule] = {}

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
            return self.run_keyed(op, job, inline) if type(op) is Binary else None
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
        if not self._reserve(op, nbytes, job):
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

    def _reserve(self, op: AnyOp, nbytes: int, job: Job) -> bool:
        """Reserve ``nbytes`` for ``op``; False once a refusal (quota, budget) failed it."""
        try:
            self._store.reserve(nbytes)
        except StoreError as exc:
            self._outcomes.fail(op, exc.code, str(exc), job)
            return False
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

    def run_keyed(self, op: AnyOp, job: Job, inline: bool) -> bool | None:
        """:meth:`run` for the other ops of ``fastkeys.KEYS`` (matmul, reductions, views,
        in-place updates...), their checks cached by their key and input metas: returns as
        :meth:`run` does. An in-place op whose target cannot be written as it is (a read-only
        view, or memory that a reply still sends: ``TensorStore.writes_in_place``) takes the
        general path. The caller holds ``np.errstate(all="ignore")``."""
        key_of = KEYS.get(type(op))
        if key_of is None or job.rejected is not None:
            return None
        fields = key_of(op)
        store = self._store
        inplace = op.inplace
        if fields is None or (not inplace and op.out in store):
            return None
        args: list[np.ndarray[Any, Any]] = []
        parts: list[Any] = [type(op), fields]
        for tensor_id in op.inputs():
            value = store.lookup(tensor_id)
            if type(value) is not Stored:
                return None
            args.append(value.array)
            parts.append(value.meta)
        key = tuple(parts)
        rule = self._keyed.get(key)
        if rule is None:
            rule = self._keyed_rule(op, args, key)
            if rule is None:
                return None
        if inplace and not store.writes_in_place(op.out):
            return None
        if inline and rule.work > self._inline_cost:
            return False
        reserved = rule.scratch if inplace else rule.nbytes  # in place: the target's memory
        if not self._reserve(op, reserved, job):
            return True
        try:
            raw = rule.call(op, args, job.buffers)
        except Exception as exc:
            self._outcomes.run_failed(op, exc, reserved, job)
            return True
        self._settle(op, raw, rule, reserved, job)
        return True

    def _settle(self, op: AnyOp, raw: Any, rule: KeyedRule, reserved: int, job: Job) -> None:
        """Store what ``op`` returned as :meth:`Outcomes.keep` would, where that is plain: the
        inferred array, a view of a root the store holds (or the target written in place),
        which adds no bytes, or a root of its own, which adds its bytes, at most those
        reserved (the scratch's are given back). Anything else goes to
        :meth:`Outcomes.keep`."""
        meta = rule.meta
        if isinstance(raw, np.generic):  # a whole reduction's numpy scalar, as checked() takes it
            raw = np.asarray(raw)
        if type(raw) is np.ndarray and raw.dtype == rule.dtype and raw.shape == meta.shape:
            store = self._store
            base = raw.base
            if store.holds(raw if base is None else root_of(raw)):
                need = 0
            elif base is None and raw.nbytes <= reserved:
                need = raw.nbytes
            else:
                need = -1  # a view of memory the store does not hold: copied by keep()
            if need >= 0:
                if need < reserved:
                    store.cancel(reserved - need)
                if op.inplace:
                    store.replace(op.out, Stored(raw, meta), reserved=need)
                else:
                    store.put(op.out, Stored(raw, meta), reserved=need)
                outcomes = self._outcomes  # what Outcomes.keep counts for a stored result
                outcomes.ops_run += 1
                outcomes.op_counts[rule.name] += 1
                return
        self._outcomes.keep(op, raw, (meta,), reserved, job)

    def _keyed_rule(
        self, op: AnyOp, args: list[np.ndarray[Any, Any]], key: tuple[Any, ...]
    ) -> KeyedRule | None:
        """The cached checks of :meth:`run_keyed` for ``key`` (the op's input metas from its
        third item), or None when they refuse the op or its output is not known before it
        runs: as :meth:`_rule`."""
        metas = key[2:]
        try:
            outputs = op.infer_all(*metas)
            if len(outputs) != 1:
                return None
            (meta,) = outputs
            scratch = executor.scratch(op, meta, args)
            nbytes = output_bytes(outputs, self._limits, scratch)
        except (InvalidOpError, StoreError):
            return None
        if UNKNOWN in meta.shape or executor.resolve(op, args, outputs) is not outputs:
            return None
        work = executor.cost(op, meta, args)
        if work > self._limits.max_op_cost:
            return None  # the general path refuses it (limit_exceeded)
        if len(self._keyed) >= KEYED_CACHED:
            self._keyed.clear()
        call = elementwise.inplace_call(op, [m.dtype for m in metas])
        call = call or executor.runner(op, in_place=op.inplace)
        rule = KeyedRule(meta, nbytes, scratch, work, to_numpy(meta.dtype), op.name(), call)
        self._keyed[key] = rule
        return rule
