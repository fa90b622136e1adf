"""The structure of a segment: the ops a client sent between two blocking requests, as a key
that is equal for two segments exactly when one run by the other's ops would do the same
(``client._segments`` replays a segment whose key it has seen).

The key holds each op's type and fields, with every tensor id replaced by what it is within
the segment: a tensor one of its ops made (its id less the first such id, so that the ids of a
repeated segment, allocated in the same order, give the same key), or an input from before it
(its position among them, and its shape and dtype). Python scalars are part of the key by
value and type (``1`` and ``True`` and ``1.0`` differ, and so do ``0.0`` and ``-0.0``), as are
the tensors the segment made and the client freed before it was sent (they are not kept); but
the float value of a ``full`` into a floating dtype (``protocol.ops.graph.varies``: how a
schedule writes a learning rate on the device) is a parameter of each run, not of the key.

Uploads (a step's fresh batch) stay ops of their own, sent before the run: their outputs are
inputs of the segment (an upload reads no tensor, and its bytes are counted from the moment its
message arrives, so running it before the segment's other ops changes nothing). A segment with
a data-dependent shape, a graph or a pull in it has no key.

Building the key costs a few dictionary lookups per op and id: each op type's fields are sorted
once (:class:`_Spec`) into ids, tuples of ids, an index key, fields whose values need their
type in the key, and plain ones.
"""

from __future__ import annotations

import math
import types
import typing
from collections.abc import Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import Any

from protocol import TensorMeta
from protocol.graphs import ID_FIELDS, ID_TUPLES
from protocol.ops import AnyOp, FromBuffer, Full, Pull, RunGraph, RunSegment
from protocol.ops.graph import varies
from protocol.ops.indexing import ArrayIndex

_EXTERNAL = -(1 << 48)  # an input's token: _EXTERNAL - its position (made ids are offsets)
_PLAIN, _ID, _IDS, _KEY, _TYPED = range(5)
_UNKEYED = (RunGraph, RunSegment, Pull)  # a segment holding one is not replayed


@dataclass(frozen=True, slots=True)
class Structure:
    """A segment's key and what a run of it needs: the positions of its uploads (which stay
    ops of their own), its inputs from before it, the ids its ops made (in op order) and
    those of them that the client freed."""

    key: tuple[Any, ...]
    uploads: tuple[int, ...]
    args: tuple[int, ...]
    made: tuple[int, ...]
    freed: frozenset[int]
    scalars: tuple[float, ...]  # the values of the ops that vary (protocol.ops.graph.varies)


def structure(
    ops: Sequence[AnyOp], frees: Sequence[int], metas: dict[int, TensorMeta]
) -> Structure | None:
    """The structure of the segment ``ops``, whose ids in ``frees`` the client freed; None
    if it has none (see the module docstring). ``metas`` holds the meta of every live id."""
    uploads: list[int] = []
    made: dict[int, int] = {}  # id -> its offset from the first made id
    external: dict[int, int] = {}  # id -> its token
    args: list[int] = []
    keys: list[Any] = []
    scalars: list[float] = []
    first = None
    for index, op in enumerate(ops):
        cls = type(op)
        if cls is FromBuffer:  # an op of its own, before the run: its output is an input
            uploads.append(index)
            continue
        spec = _SPECS.get(cls) or _spec(cls)
        if spec is None:
            return None
        values = list(spec.values(op.__dict__))
        if not op.inplace:
            if first is None:
                first = op.out
            made[op.out] = op.out - first
            for out in values[spec.more] if spec.more >= 0 else ():
                made[out] = out - first
        for position, kind in spec.special:
            value = values[position]
            if kind == _ID:  # _token, inlined: most fields are ids
                token = made.get(value)
                if token is None:
                    token = external.get(value)
                    if token is None:
                        token = external[value] = _EXTERNAL - len(args)
                        args.append(value)
                values[position] = token
            elif kind == _IDS:
                values[position] = tuple(_token(i, made, external, args) for i in value)
            elif kind == _KEY:
                values[position] = tuple(
                    ("A", _token(k.tensor, made, external, args)) if type(k) is ArrayIndex else k
                    for k in value
                )
            else:
                values[position] = _typed(value)
        if spec.varying >= 0 and varies(op):  # a run's parameter, not part of the structure
            scalars.append(op.__dict__["value"])
            values[spec.varying] = float
        keys.append((cls, *values))
    if first is None:
        return None
    try:
        inputs = tuple(metas[i] for i in args)
    except KeyError:  # an id without a handle's meta (a protocol tool's): not keyed
        return None
    freed = frozenset(i for i in frees if i in made)
    key = (tuple(keys), inputs, frozenset(made[i] for i in freed), tuple(uploads))
    return Structure(key, tuple(uploads), tuple(args), tuple(made), freed, tuple(scalars))


def _token(value: int, made: dict[int, int], external: dict[int, int], args: list[int]) -> int:
    token = made.get(value)
    if token is None:
        token = external.get(value)
        if token is None:
            token = external[value] = _EXTERNAL - len(args)
            args.append(value)
    return token


def _typed(value: Any) -> Any:
    """``value`` with what ``==`` forgets: its type, and a float's sign (``0.0 == -0.0``)."""
    kind = type(value)
    if kind is float:
        return (kind, value, math.copysign(1.0, value))
    if kind is tuple:
        return tuple(_typed(v) for v in value)
    if hasattr(value, "__dict__"):  # a model (a complex scalar): its fields, typed
        return (kind, *(_typed(v) for v in value.__dict__.values()))
    return (kind, value)


@dataclass(frozen=True, slots=True)
class _Spec:
    values: Any  # itemgetter of the fields, in order
    special: tuple[tuple[int, int], ...]  # (position, kind) of the fields that are not plain
    more: int  # position of ``more`` (a multi-output op's other outputs), or -1
    varying: int  # position of a value that may vary (a ``full``'s), or -1


_SPECS: dict[type, _Spec | None] = {}


def _spec(cls: type) -> _Spec | None:
    """Sort ``cls``'s fields once (None: a type whose segments are not keyed)."""
    if issubclass(cls, _UNKEYED):
        _SPECS[cls] = None
        return None
    fields: dict[str, Any] = cls.model_fields  # type: ignore[attr-defined]
    names = tuple(fields)
    special: list[tuple[int, int]] = []
    for position, name in enumerate(names):
        if name in ID_FIELDS or name == "value" and fields["kind"].default == "setitem":
            special.append((position, _ID))
        elif name in ID_TUPLES:
            special.append((position, _IDS))
        elif name == "key":
            special.append((position, _KEY))
        elif not _plain(fields[name].annotation):
            special.append((position, _TYPED))
    getter = itemgetter(*names) if len(names) > 1 else lambda d: (d[names[0]],)
    more = names.index("more") if "more" in names else -1
    varying = names.index("value") if cls is Full else -1
    _SPECS[cls] = spec = _Spec(getter, tuple(special), more, varying)
    return spec


def _plain(annotation: Any) -> bool:
    """Whether values of ``annotation`` compare equal only when they are the same value of
    the same type: ints, strings, literals, None, and tuples and unions of them (a union of
    bool and int is not: ``True == 1``)."""
    if annotation in (int, str, bool, type(None)):
        return True
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        return _plain(args[0])
    if origin is typing.Literal:
        return len({type(a) for a in args}) == 1
    if origin is tuple:
        return all(a is Ellipsis or _plain(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        bases = {
            typing.get_args(a)[0] if typing.get_origin(a) is typing.Annotated else a for a in args
        }
        return not {bool, int} <= bases and all(_plain(a) for a in args)
    return False
