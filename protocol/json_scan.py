"""Locating the parts of a JSON text without building them: an object's members and an array's
elements, as positions in the text, in steps that a caller can interleave with other work
(``protocol/stepwise.py`` validates a large message header this way).

Building a value is what costs: ``json.loads`` of a 3 MiB graph registration makes a Python
object of every member of its 50,000 declared tensors, in one call that holds the GIL. So a
compound value (an object or an array) is located by its extent only: in one regular
expression match when it nests nothing but arrays of scalars (an op, a declared tensor: the
bulk of a header), else token by token (strings and brackets), pausing every
:data:`SCAN_TOKENS` tokens. A scalar is read by json's C scanner, which bounds what it builds
(a string is one object, an integer at most 4300 digits). What is located is not checked to
be valid JSON beyond its extent: the validation that follows reads every located part whole.
"""

from __future__ import annotations

import json
import re
from array import array
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any

from .errors import DecodeError

SCAN_ELEMENTS = 256  # array elements located between two steps
SCAN_TOKENS = 4096  # strings and brackets of one nested value passed between two steps

_SPACE = re.compile(r"[ \t\n\r]*")
_SPACES = frozenset(" \t\n\r")
# one JSON value at a position, by json's C scanner: (value, its end); StopIteration if none
_scan: Callable[[str, int], tuple[Any, int]] = json.JSONDecoder().scan_once  # type: ignore[attr-defined]
_STRING = r'"(?:[^"\\]++|\\.)*+"'
# an object or array that nests at most arrays of scalars, in one match (possessive: linear)
_FLAT = re.compile(
    r"(?:\{(?:[^{}\[\]\"]++|" + _STRING + r"|\[[^{}\[\]\"]*+\])*+\})"
    r"|(?:\[(?:[^{}\[\]\"]++|" + _STRING + r")*+\])"
)
_TOKEN = re.compile(_STRING + r"|[\[\]{}]")


@dataclass
class Member:
    """One member of an object: where its value starts and ends in the text, and for an array
    where each of its elements does (start, end, start, ...: 16 bytes an element, in one
    machine array, one object for the garbage collector)."""

    start: int
    end: int
    spans: array[int] = field(default_factory=lambda: array("q"))
    array: bool = False


def members(text: str, pos: int = 0) -> Generator[None, None, tuple[dict[str, Member], int]]:
    """The members of the JSON object at ``pos`` of ``text`` (the last of a repeated key
    winning, as when pydantic reads it), arrays with their elements located; and the position
    after the object.

    Raises:
        DecodeError: no object there, or one that is not valid JSON where it was read.
    """
    found: dict[str, Member] = {}
    pos = expect(text, space(text, pos), "{")
    if text.startswith("}", pos):
        return found, pos + 1
    while True:
        key, pos = value(text, pos)
        if not isinstance(key, str):
            raise bad_json("an object key must be a string")
        pos = expect(text, pos, ":")
        if text.startswith("[", pos):
            member = Member(pos, 0, array=True)
            pos = member.end = yield from elements(text, pos, member.spans)
        else:
            start = pos
            pos = yield from extent(text, pos)
            member = Member(start, pos)
        found.pop(key, None)
        found[key] = member
        pos = space(text, pos)
        if text.startswith("}", pos):
            return found, pos + 1
        pos = expect(text, pos, ",")


def elements(text: str, pos: int, spans: array[int]) -> Generator[None, None, int]:
    """Locate the elements of the array at ``pos`` (its ``[``) into ``spans``; the position
    after its ``]``. Compact JSON (no space after a comma) takes the short way."""
    pos = space(text, pos + 1)
    if text.startswith("]", pos):
        return pos + 1
    count = 0
    while True:
        end = yield from extent(text, pos)
        spans.append(pos)
        spans.append(end)
        count += 1
        if count == SCAN_ELEMENTS:
            count = 0
            yield
        if text.startswith(",", end) and text[end + 1 : end + 2] not in _SPACES:
            pos = end + 1
            continue
        pos = space(text, end)
        if text.startswith("]", pos):
            return pos + 1
        pos = expect(text, pos, ",")


def extent(text: str, pos: int) -> Generator[None, None, int]:
    """Where the JSON value at ``pos`` ends, its parts not built (see the module docstring)."""
    if not text.startswith(("{", "["), pos):
        return value(text, pos)[1]
    flat = _FLAT.match(text, pos)
    if flat is not None:
        return flat.end()
    depth, passed = 0, 0
    for token in _TOKEN.finditer(text, pos):
        first = token.group()[0]
        if first in "[{":
            depth += 1
        elif first in "]}":
            depth -= 1
            if not depth:
                return token.end()
        passed += 1
        if passed == SCAN_TOKENS:
            passed = 0
            yield
    raise bad_json(f"the value at byte {pos} is not closed")


def value(text: str, pos: int) -> tuple[Any, int]:
    """The JSON value at ``pos``, built, and where it ends."""
    try:
        return _scan(text, pos)
    except StopIteration:
        raise bad_json(f"expected a value at byte {pos}") from None
    except json.JSONDecodeError as exc:
        raise bad_json(f"{exc.msg} at byte {exc.pos}") from None
    except (ValueError, RecursionError) as exc:  # an integer of over 4300 digits; deep nesting
        raise bad_json(f"a value at byte {pos}: {exc}") from None


def space(text: str, pos: int) -> int:
    match = _SPACE.match(text, pos)
    assert match is not None  # it matches the empty string
    return match.end()


def expect(text: str, pos: int, char: str) -> int:
    pos = space(text, pos)
    if not text.startswith(char, pos):
        raise bad_json(f"expected {char!r} at byte {pos}")
    return space(text, pos + 1)


def bad_json(what: str) -> DecodeError:
    return DecodeError(f"invalid message: invalid JSON: {what}")


__all__ = [
    "SCAN_ELEMENTS",
    "SCAN_TOKENS",
    "Member",
    "bad_json",
    "elements",
    "expect",
    "extent",
    "members",
    "space",
    "value",
]
