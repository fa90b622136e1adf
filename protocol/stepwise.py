"""Validating a large message header in small steps, so that the caller can let other work run
between them (the server's event loop, which a large header validated at once would hold for
as long as pydantic takes, holding the GIL throughout: bench/REASONS.md, 'Header validated in
slices').

A header is one JSON object. :func:`validate_stepwise` locates its parts without building them
(``protocol/json_scan.py``), then validates the header without its top-level arrays (a batch's
ops, frees, requests, graphs), and those arrays' elements in pieces of :data:`PIECE_ELEMENTS` or
:data:`PIECE_BYTES`, each piece by the same adapter as a message of the same ``type`` holding
only that piece, so every element is checked by the very rules that check it in a whole header.
An element larger than :data:`PIECE_BYTES` that is an object (a graph registration of 50,000
declared inputs, a ``stack`` of a million inputs) is validated the same way one level down: the
element without its large members, as the one element of such a message, then each large
member, an array in pieces or an object in turn, each inside a message that holds the element
with only that member; the parts are then joined into the element, and the elements into the
message. A step lasts about as long as :data:`PIECE_BYTES` take, whatever the header holds.

The result is the message ``adapter.validate_json(header)`` gives, or a :class:`DecodeError`
where it raises (the message's wording may differ). Joining a model from parts skips its
``model_validator``\\ s: a model whose validator looks at a whole array (several outputs that
must be distinct) offers ``check_joined()``, which runs once its parts are joined.

A caller that wants the elements one piece at a time, and not the whole message, reads the
header with :func:`read_header` and takes its :meth:`Header.skeleton` and
:meth:`Header.pieces` (a graph file's loader: ``client/capture/graph_file.py``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic import BaseModel, TypeAdapter, ValidationError

from .errors import DecodeError
from .json_scan import Member, members, space

PIECE_ELEMENTS = 256  # array elements validated in one step, at most
PIECE_BYTES = 1 << 16  # bytes of a piece validated in one step; a larger element is split

M = TypeVar("M", bound=BaseModel)
T = TypeVar("T")
Shifts = tuple[tuple[str, int], ...]  # (array's key, index of its first element) on the path


@dataclass(frozen=True)
class _Place:
    """Where a value sits in a message: how to make a whole message's JSON around the value's
    JSON (``wrap``), how to take the value from that message validated (``take``), and how
    the indices of an error's location there map to the header's (``shifts``)."""

    adapter: TypeAdapter[Any]
    wrap: Callable[[str], str]
    take: Callable[[Any], Any]
    shifts: Shifts

    def validate(self, value: str, shift: tuple[str, int] | None = None) -> Any:
        """The value whose JSON is ``value``, validated here (``shift``: of its own array)."""
        try:
            message = self.adapter.validate_json(self.wrap(value))
        except ValidationError as exc:
            shifts = self.shifts if shift is None else (*self.shifts, shift)
            raise DecodeError(f"invalid message: {describe(exc, shifts)}") from None
        return self.take(message)

    def member(self, key: str, others: dict[str, str]) -> _Place:
        """The place of member ``key`` of the object here, beside its ``others`` (JSON)."""
        wrap, take = self.wrap, self.take
        return _Place(
            self.adapter,
            lambda v: wrap(_object({**others, key: v})),
            lambda m: getattr(take(m), key),
            self.shifts,
        )

    def element(self, key: str, index: int) -> _Place:
        """The place of element ``index`` of the array (member ``key``) here."""
        wrap, take = self.wrap, self.take
        return _Place(
            self.adapter,
            lambda v: wrap("[" + v + "]"),
            lambda m: take(m)[0],
            (*self.shifts, (key, index)),
        )


@dataclass
class Header:
    """A header's text and its members, each array's elements located (:func:`read_header`)."""

    text: str
    members: dict[str, Member]

    def skeleton(self, adapter: TypeAdapter[M]) -> M:
        """The message with every top-level array empty.

        Raises:
            DecodeError: the header is not a valid message.
        """
        skeleton = {key: "[]" if m.array else self._text(m) for key, m in self.members.items()}
        return _Place(adapter, lambda v: v, lambda m: m, ()).validate(_object(skeleton))  # type: ignore[no-any-return]

    def pieces(self, adapter: TypeAdapter[M], key: str) -> Iterator[list[Any]]:
        """The elements of the top-level array ``key`` (none if it has none), validated in
        pieces of :data:`PIECE_ELEMENTS` or :data:`PIECE_BYTES`, each as a message (of the
        header's ``type``) that holds only that piece; an element is validated whole.

        Raises:
            DecodeError: an element is not valid; the error names it by its index.
        """
        member = self.members.get(key)
        if member is None or not member.array:
            return
        place = self._place(adapter, key)
        for first, last in _runs(member, 1 << 62):
            yield place.validate(self._piece(member, first, last), (key, first))

    def _place(self, adapter: TypeAdapter[Any], key: str) -> _Place:
        tag = {"type": self._text(self.members["type"])} if "type" in self.members else {}
        return _Place(adapter, lambda v: _object({**tag, key: v}), lambda m: getattr(m, key), ())

    def _text(self, member: Member) -> str:
        return self.text[member.start : member.end]

    def _piece(self, member: Member, first: int, last: int) -> str:
        """Elements ``first`` to ``last - 1`` of ``member``, as a JSON array."""
        spans = member.spans
        return "[" + self.text[spans[2 * first] : spans[2 * last - 1]] + "]"


def read_header(header: bytes | memoryview) -> Generator[None, None, Header]:
    """Decode ``header`` and locate its members and its arrays' elements, yielding between
    steps; the generator returns the :class:`Header`.

    Raises:
        DecodeError: the header is not UTF-8, or not one JSON object.
    """
    try:
        text = bytes(header).decode()
    except UnicodeDecodeError as exc:
        raise DecodeError(f"invalid message: the header is not UTF-8 ({exc.reason})") from None
    found, end = yield from members(text)
    if space(text, end) != len(text):
        raise DecodeError("invalid message: invalid JSON: extra data after the header's object")
    return Header(text, found)


def complete(steps: Generator[None, None, T]) -> T:
    """What ``steps`` returns, run without a pause."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            result: T = done.value
            return result


def validate_stepwise(
    adapter: TypeAdapter[M], header: bytes | memoryview
) -> Generator[None, None, M]:
    """Validate ``header`` as ``adapter.validate_json`` does, yielding between steps; the
    generator returns the message. The message's fields other than its top-level arrays must
    have defaults (a batch's do), since each piece is validated as a message of its own; so
    must a large element's fields other than its large members.

    Raises:
        DecodeError: the header is not valid JSON, or not a valid message.
    """
    parsed = yield from read_header(header)
    message = parsed.skeleton(adapter)
    update: dict[str, list[Any]] = {}
    for key, member in parsed.members.items():
        if member.array:
            update[key] = yield from _array(parsed.text, member, parsed._place(adapter, key), key)
    return message.model_copy(update=update) if update else message


def _array(text: str, member: Member, place: _Place, key: str) -> Generator[None, None, list[Any]]:
    """The elements of the array ``member`` at ``place`` (member ``key`` of its object),
    validated in pieces; an object larger than a piece, by its parts (:func:`_large`)."""
    values: list[Any] = []
    spans = member.spans
    for first, last in _runs(member, PIECE_BYTES):
        start = spans[2 * first]
        if spans[2 * last - 1] - start > PIECE_BYTES and text.startswith("{", start):
            located = yield from _locate(text, start)  # one element, larger than a piece
            values.append((yield from _large(text, located, place.element(key, first))))
            continue
        piece = "[" + text[start : spans[2 * last - 1]] + "]"
        values.extend(place.validate(piece, (key, first)))
        yield
    return values


@dataclass
class _Object:
    """An object larger than a piece, located: its members; each one's JSON in its outline
    (the object without its large members: a small member as it is, a large array empty, a
    large object as its own outline); and its large members, each an object located in turn,
    or None for an array."""

    found: dict[str, Member]
    outline: dict[str, str]
    large: dict[str, _Object | None]


def _locate(text: str, start: int) -> Generator[None, None, _Object]:
    found, _ = yield from members(text, start)
    outline: dict[str, str] = {}
    large: dict[str, _Object | None] = {}
    for key, member in found.items():
        if member.end - member.start <= PIECE_BYTES:
            outline[key] = text[member.start : member.end]
        elif member.array:
            outline[key], large[key] = "[]", None
        elif text.startswith("{", member.start):
            inner = yield from _locate(text, member.start)
            outline[key], large[key] = _object(inner.outline), inner
        else:  # a long string or number: one value, validated with the outline
            outline[key] = text[member.start : member.end]
    return _Object(found, outline, large)


def _large(text: str, located: _Object, place: _Place) -> Generator[None, None, Any]:
    """The object ``located``, validated at ``place``: its outline, then each large member
    in a message that holds the outline with that member (see the module docstring); joined."""
    outline = place.validate(_object(located.outline))
    yield
    update: dict[str, Any] = {}
    for key, inner in located.large.items():
        others = {k: v for k, v in located.outline.items() if k != key}
        at = place.member(key, others)
        if inner is None:
            items = yield from _array(text, located.found[key], at, key)
            update[key] = tuple(items) if isinstance(getattr(outline, key), tuple) else items
        else:
            update[key] = yield from _large(text, inner, at)
    joined = outline.model_copy(update=update)
    check = getattr(joined, "check_joined", None)
    if check is not None:
        try:
            check()
        except ValueError as exc:
            raise DecodeError(f"invalid message: {exc}") from None
    return joined


def _runs(member: Member, most_bytes: int) -> Iterator[tuple[int, int]]:
    """Runs ``(first, last)`` of ``member``'s elements, ``first`` to ``last - 1``: at most
    :data:`PIECE_ELEMENTS` of them and ``most_bytes`` of text, and at least one."""
    spans, count, first = member.spans, len(member.spans) // 2, 0
    while first < count:
        start, last = spans[2 * first], first + 1
        while (
            last < count
            and last - first < PIECE_ELEMENTS
            and spans[2 * last + 1] - start <= most_bytes
        ):
            last += 1
        yield first, last
        first = last


def describe(exc: ValidationError, shifts: Shifts = ()) -> str:
    """``exc``'s first error in one line, where it is and what (``ops.3.binary.x2: ...``); the
    index right after each ``(key, offset)`` of ``shifts`` in its location, in order, is
    shifted by ``offset`` (a piece's element 0 is the header's element ``offset``)."""
    first = exc.errors()[0]
    loc = list(first["loc"])
    at = 0
    for key, offset in shifts:
        for i in range(at, len(loc) - 1):
            if loc[i] == key and isinstance(loc[i + 1], int):
                loc[i + 1] = int(loc[i + 1]) + offset
                at = i + 2
                break
    where = ".".join(str(p) for p in loc) or "message"
    more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    return f"{where}: {first['msg']}{more}"


def _object(members: dict[str, str]) -> str:
    return "{" + ",".join(f"{json.dumps(k)}:{v}" for k, v in members.items()) + "}"


__all__ = [
    "PIECE_BYTES",
    "PIECE_ELEMENTS",
    "Header",
    "complete",
    "describe",
    "read_header",
    "validate_stepwise",
]
