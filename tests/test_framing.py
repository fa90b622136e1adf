"""Tier 1: ``protocol.framing`` alone, bytes in and headers out (RFC 6455, section 5)."""

from __future__ import annotations

import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol.framing import (
    MAX_HEADER,
    FrameError,
    FrameHeader,
    Opcode,
    apply_mask,
    frame_header,
    header_size,
    parse_header,
    rotate_mask,
)

LENGTHS = [0, 1, 125, 126, 127, 65535, 65536, 2**32, 2**63 - 1]  # 7-, 16- and 64-bit lengths


@pytest.mark.parametrize("length", LENGTHS)
@pytest.mark.parametrize("masked", [True, False])
def test_a_header_parses_back_to_what_was_encoded(length: int, masked: bool) -> None:
    mask = os.urandom(4) if masked else b""
    head = frame_header(Opcode.BINARY, True, length, mask)
    assert len(head) == header_size(head[0], head[1]) <= MAX_HEADER
    assert parse_header(head, masked) == FrameHeader(True, Opcode.BINARY, length, mask, len(head))


@pytest.mark.parametrize("length", LENGTHS)
def test_a_partial_header_asks_for_more_at_every_cut(length: int) -> None:
    head = frame_header(Opcode.CONT, False, length, b"\x01\x02\x03\x04")
    for cut in range(len(head)):
        assert parse_header(head[:cut], masked=True) is None


def test_a_header_is_read_in_place_between_start_and_end() -> None:
    head = frame_header(Opcode.BINARY, False, 70_000, b"abcd")
    buffer = bytearray(b"junk" + head + b"\xff" * 32)
    assert parse_header(buffer, True, 4, 4 + len(head)) == parse_header(head, True)
    assert parse_header(buffer, True, 4, 4 + len(head) - 1) is None  # bytes past end don't count


@pytest.mark.parametrize(
    ("data", "masked", "message"),
    [
        (frame_header(Opcode.BINARY, True, 3), True, "incorrect masking"),
        (frame_header(Opcode.BINARY, True, 3, b"abcd"), False, "the server sent a masked frame"),
        (bytes([0x82 | 0x40, 0x80]) + b"abcd", True, "reserved bits must be 0"),
        (frame_header(Opcode.PING, True, 126, b"abcd"), True, "control frame too long"),
        (frame_header(Opcode.PING, False, 5, b"abcd"), True, "fragmented control frame"),
        (frame_header(Opcode.PING, False, 126, b"abcd"), True, "control frame too long"),
    ],
)
def test_frames_that_break_the_rfc_are_refused(data: bytes, masked: bool, message: str) -> None:
    with pytest.raises(FrameError, match=message) as refused:
        parse_header(data, masked)
    assert refused.value.close_code == 1002


def test_a_control_frame_of_125_bytes_is_allowed() -> None:
    header = parse_header(frame_header(Opcode.PONG, True, 125, b"abcd"), masked=True)
    assert header is not None and header.control and header.length == 125


@given(st.binary(max_size=64), st.binary(min_size=4, max_size=4), st.integers(0, 7))
def test_masking_from_any_offset_is_the_mask_rotated(
    payload: bytes, mask: bytes, offset: int
) -> None:
    whole = apply_mask(bytes(offset) + payload, mask)[offset:]
    assert apply_mask(payload, rotate_mask(mask, offset)) == whole
    assert apply_mask(whole, rotate_mask(mask, offset)) == payload
