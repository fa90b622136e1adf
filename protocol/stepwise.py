"""Validating a large message header in small steps, so that the caller can let other work run
between them (the server's event loop, which a large header validated at once would hold for
as long as pydantic takes, holding the GIL throughout: bench/REASONS.md, 'Header validated in
slices').

A header is one JSON object. :func:`validate_stepwise` finds where each element of its
top-level arrays (a batch's ops, frees, requests) begins and ends with the C scanner of
:mod:`json`, then validates the header without those elements, and the elements in pieces of
:data:`PIECE_ELEMENTS` or :data:`PIECE_BYTES`, each piece by the same adapter as a message of
the same ``type`` holding only that piece, so every element is checked by the very rules that
check it in a whole header; the pieces' lists are then joined into the message. The result is
the message ``adapter.validate_json(header)`` gives, or a :class:`DecodeError` where it raises
(the message's wording may differ). One element (an op, a graph registration) and any value
that is not a top-level array are validated whole: a step lasts about as long as its largest
element takes.

A caller that wants the elements one piece at a time, and not the whole message, reads the
header with :func:`read_header` and takes its :meth:`Header.skeleton` and
:meth:`Header.pieces` (a graph file's loader: ``client/capture/graph_file.py``).
"""

from __future__ import annotations

import json
import re
from array import array
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

from pydantic import BaseModel, TypeAdapter, ValidationError

from .errors import DecodeError

PIECE_ELEMENTS = 256  # array elements validated in one step, at most
PIECE_BYTES = 1 << 16  # bytes of array elements validated in one step (one element may exceed)
SCAN_ELEMENTS = 256  # array elements located between two steps

M = TypeVar("M", bound=BaseModel)
T = TypeVar("T")

_SPACE = re.compile(r"[ \t\n\r]*")
_SPACES = frozenset(" \t\n\r")
# one JSON value at a position, by json's C scanner: (value, its end); StopIteration if none
_scan: Callable[[str, int], tuple[Any, int]] = json.JSONDecoder().scan_once  # type: ignore[attr-defined]


@dataclass
class _Member:
    """One member of the header's object: its value's text, or (an array) its elements'."""

    text: str = ""
    spans: array[int] = field(default_factory=lambda: array("q"))  # start, end, start, ...
    array: bool = False


@dataclass
class Header:
    """A header's text and its members, each array's elements located (:func:`read_header`)."""

    text: str
    members: dict[str, _Member]

    def skeleton(self, adapter: TypeAdapter[M]) -> M:
        """The message with every top-level array empty.

        Raises:
            DecodeError: the header is not a valid message.
        """
        skeleton = {key: "[]" if m.array else m.text for key, m in self.members.items()}
        return _validate(adapter, _object(skeleton), None, 0)

    def pieces(self, adapter: TypeAdapter[M], key: str) -> Iterator[list[Any]]:
        """The elements of the top-level array ``key`` (none if it has none), validated in
        pieces of :data:`PIECE_ELEMENTS` or :data:`PIECE_BYTES`, each as a message (of the
        header's ``type``) that holds only that piece.

        Raises:
            DecodeError: an element is not valid; the error names it by its index.
        """
        member = self.members.get(key)
        if member is None or not member.array:
            return
        tag = {"type": self.members["type"].text} if "type" in self.members else {}
        spans, count, first = member.spans, len(member.spans) // 2, 0
        while first < count:
            start, last = spans[2 * first], first + 1
            while (
                last < count
                and last - first < PIECE_ELEMENTS
                and spans[2 * last + 1] - start <= PIECE_BYTES
            ):
                last += 1
            piece = "[" + self.text[start : spans[2 * last - 1]] + "]"  # with the `,` between
            yield getattr(_validate(adapter, _object({**tag, key: piece}), key, first), key)
            first = last


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
    members = yield from _members(text)
    return Header(text, members)


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
    have defaults (a batch's do), since each piece is validated as a message of its own.

    Raises:
        DecodeError: the header is not valid JSON, or not a valid message.
    """
    parsed = yield from read_header(header)
    message = parsed.skeleton(adapter)
    update: dict[str, list[Any]] = {}
    for key, member in parsed.members.items():
        if member.array:
            values: list[Any] = []
            for piece in parsed.pieces(adapter, key):
                values.extend(piece)
                yield
            update[key] = values
    return message.model_copy(update=update) if update else message


def _members(text: str) -> Generator[None, None, dict[str, _Member]]:
    """The members of the JSON object ``text`` holds, the last of a repeated key winning (as
    when pydantic reads it).

    Raises:
        DecodeError: ``text`` is not one JSON object.
    """
    members: dict[str, _Member] = {}
    pos = _expect(text, _space(text, 0), "{")
    if text.startswith("}", pos):
        pos += 1
    else:
        while True:
            key, pos = _value(text, pos)
            if not isinstance(key, str):
                raise _bad_json("an object key must be a string")
            pos = _expect(text, pos, ":")
            if text.startswith("[", pos):
                member = _Member(array=True)
                pos = yield from _elements(text, pos, member.spans)
            else:
                start = pos
                _, pos = _value(text, pos)
                member = _Member(text=text[start:pos])
            members.pop(key, None)
            members[key] = member
            pos = _space(text, pos)
            if text.startswith("}", pos):
                pos += 1
                break
            pos = _expect(text, pos, ",")
    if _space(text, pos) != len(text):
        raise _bad_json("extra data after the header's object")
    return members


def _elements(text: str, pos: int, spans: array[int]) -> Generator[None, None, int]:
    """Locate the elements of the array at ``pos`` (its ``[``) into ``spans`` (where each
    starts and ends, flat in one machine array: 16 bytes an element, one object for the
    garbage collector); the position after its ``]``. Compact JSON (no space after a comma)
    takes the short way."""
    pos = _space(text, pos + 1)
    if text.startswith("]", pos):
        return pos + 1
    count = 0
    while True:
        _, end = _value(text, pos)
        spans.append(pos)
        spans.append(end)
        count += 1
        if count == SCAN_ELEMENTS:
            count = 0
            yield
        if text.startswith(",", end) and text[end + 1 : end + 2] not in _SPACES:
            pos = end + 1
            continue
        pos = _space(text, end)
        if text.startswith("]", pos):
            return pos + 1
        pos = _expect(text, pos, ",")


def _validate(adapter: TypeAdapter[M], text: str, key: str | None, offset: int) -> M:
    """``text`` validated; an error names an element of array ``key`` by its index in the
    whole header, ``offset`` more than in ``text``."""
    try:
        return adapter.validate_json(text)
    except ValidationError as exc:
        raise DecodeError(f"invalid message: {describe(exc, key, offset)}") from None


def describe(exc: ValidationError, key: str | None = None, offset: int = 0) -> str:
    """``exc``'s first error in one line, where it is and what (``ops.3.binary.x2: ...``); an
    index right after ``key`` in its location is shifted by ``offset``."""
    first = exc.errors()[0]
    loc = list(first["loc"])
    for i, part in enumerate(loc[:-1]):
        if part == key and isinstance(loc[i + 1], int):
            loc[i + 1] = int(loc[i + 1]) + offset
            break
    where = ".".join(str(p) for p in loc) or "message"
    more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    return f"{where}: {first['msg']}{more}"


def _object(members: dict[str, str]) -> str:
    return "{" + ",".join(f"{json.dumps(k)}:{v}" for k, v in members.items()) + "}"


def _value(text: str, pos: int) -> tuple[Any, int]:
    try:
        return _scan(text, pos)
    except StopIteration:
        raise _bad_json(f"expected a value at byte {pos}") from None
    except json.JSONDecodeError as exc:
        raise _bad_json(f"{exc.msg} at byte {exc.pos}") from None
    except (ValueError, RecursionError) as exc:  # an integer of over 4300 digits; deep nesting
        raise _bad_json(f"a value at byte {pos}: {exc}") from None


def _space(text: str, pos: int) -> int:
    match = _SPACE.match(text, pos)
    assert match is not None  # it matches the empty string
    return match.end()


def _expect(text: str, pos: int, char: str) -> int:
    pos = _space(text, pos)
    if not text.startswith(char, pos):
        raise _bad_json(f"expected {char!r} at byte {pos}")
    return _space(text, pos + 1)


def _bad_json(what: str) -> DecodeError:
    return DecodeError(f"invalid message: invalid JSON: {what}")


__all__ = [
    "PIECE_BYTES",
    "PIECE_ELEMENTS",
    "Header",
    "complete",
    "describe",
    "read_header",
    "validate_stepwise",
]
