"""Websocket framing (RFC 6455, section 5) as Tensorwire writes and reads it: frame headers and
masking, for the client and the server alike. Sans-I/O: bytes in, headers out, no sockets.

Both sides parse data frames themselves so that a payload can be received straight into the
array it becomes, and write them themselves so that a payload is sent from the tensor's memory
(websockets copies every byte several times). Everything else of the websocket protocol (the
opening handshake, control frames, the close handshake) stays with websockets' sans-I/O
protocol objects: control frames are parsed here only to be handed to them whole.

Frame header (5.2)::

    byte 0    FIN (0x80), RSV1-3 (0x70, always 0: no extension is negotiated), opcode (0x0F)
    byte 1    MASK (0x80: set on every client frame, never on a server frame), length (0x7F)
    then      the length in 2 bytes (126) or 8 bytes (127), big-endian, when it does not fit
    then      the 4-byte masking key, on masked frames
"""

from __future__ import annotations

import struct
from enum import IntEnum
from typing import NamedTuple

import numpy as np

from .errors import ProtocolError

Bytes = bytes | bytearray | memoryview

# Masking (5.3) up to this many bytes is one XOR of two Python integers; longer payloads are
# XORed eight bytes at a time by numpy, whose call costs more than the integers' below it
# (bench/REASONS.md, 'Masking').
SMALL_MASK = 1 << 10
MAX_CONTROL_PAYLOAD = 125  # 5.5: control frames carry at most 125 bytes
FIRST_CONTROL = 8  # 5.2: opcodes from 8 up are control frames
MIN_HEADER = 2
MAX_HEADER = 14  # 2 + 8 bytes of length + 4 of masking key


class Opcode(IntEnum):
    """5.2: the frame types."""

    CONT = 0x0
    TEXT = 0x1
    BINARY = 0x2
    CLOSE = 0x8
    PING = 0x9
    PONG = 0xA


class CloseCode(IntEnum):
    """7.4.1: the close codes a frame parser gives."""

    PROTOCOL_ERROR = 1002
    MESSAGE_TOO_BIG = 1009


class FrameError(ProtocolError):
    """A frame that breaks RFC 6455; ``close_code`` is what to close the connection with."""

    def __init__(self, message: str, close_code: CloseCode = CloseCode.PROTOCOL_ERROR) -> None:
        super().__init__(message)
        self.close_code = close_code


class FrameHeader(NamedTuple):
    """A parsed frame header. ``size`` is the header's own length in bytes, ``length`` the
    payload's; ``mask`` is the 4-byte masking key of a masked frame, else empty. (A named
    tuple: one is made per frame, on both sides' receive paths.)"""

    fin: bool
    opcode: int
    length: int
    mask: bytes
    size: int

    @property
    def control(self) -> bool:
        return self.opcode >= FIRST_CONTROL


def header_size(first: int, second: int) -> int:
    """The length of a frame header from its first two bytes."""
    short = second & 0x7F
    extra = 2 if short == 126 else 8 if short == 127 else 0
    return MIN_HEADER + extra + (4 if second & 0x80 else 0)


def parse_header(
    data: Bytes, masked: bool, start: int = 0, end: int | None = None
) -> FrameHeader | None:
    """The frame header at ``data[start:end]`` (``end``: the end of the valid bytes, default
    ``len(data)``), or None while that holds only part of it. No slice of ``data`` is made.

    ``masked`` is what the peer must send: True on the server (client frames are masked),
    False on the client.

    Raises:
        FrameError: wrong masking, a reserved bit set, or a control frame longer than 125
            bytes or fragmented (checked in that order, as websockets does).
    """
    avail = (len(data) if end is None else end) - start
    if avail < MIN_HEADER:
        return None
    first, second = data[start], data[start + 1]
    if bool(second & 0x80) != masked:
        raise FrameError("incorrect masking" if masked else "the server sent a masked frame")
    if first & 0x70:
        raise FrameError("reserved bits must be 0")
    length = second & 0x7F
    extra = 2 if length == 126 else 8 if length == 127 else 0
    size = MIN_HEADER + extra + (4 if masked else 0)
    if avail < size:
        return None
    if extra:
        length = int.from_bytes(data[start + 2 : start + 2 + extra], "big")
    opcode = first & 0x0F
    fin = bool(first & 0x80)
    if opcode >= FIRST_CONTROL:
        if length > MAX_CONTROL_PAYLOAD:
            raise FrameError("control frame too long")
        if not fin:
            raise FrameError("fragmented control frame")
    mask = bytes(data[start + size - 4 : start + size]) if masked else b""
    return FrameHeader(fin, opcode, length, mask, size)


def frame_header(opcode: int, fin: bool, length: int, mask: bytes = b"") -> bytes:
    """The header of a frame of ``length`` payload bytes; with a 4-byte ``mask`` (a client
    frame, whose payload the caller masks with it), the MASK bit and the key follow."""
    first = (0x80 if fin else 0) | opcode
    masked = 0x80 if mask else 0
    if length < 126:
        return struct.pack("!BB", first, masked | length) + mask
    if length < 1 << 16:
        return struct.pack("!BBH", first, masked | 126, length) + mask
    return struct.pack("!BBQ", first, masked | 127, length) + mask


def close_payload(data: Bytes) -> tuple[int, str]:
    """The code and reason a close frame's payload carries (5.5.1); 1005 without a code."""
    if len(data) < 2:
        return 1005, ""
    return int.from_bytes(data[:2], "big"), bytes(data[2:]).decode("utf-8", "replace")


def rotate_mask(mask: bytes, offset: int) -> bytes:
    """The masking key as it applies from ``offset`` bytes into the payload."""
    phase = offset & 3
    return mask[phase:] + mask[:phase]


def apply_mask(data: Bytes, mask: bytes) -> bytes | bytearray:
    """``data`` (bytes) XORed with the 4-byte ``mask`` repeated: a new buffer."""
    n = len(data)
    if n <= SMALL_MASK:
        key = int.from_bytes((mask * ((n >> 2) + 1))[:n], "little")
        return (int.from_bytes(data, "little") ^ key).to_bytes(n, "little")
    out = bytearray(n)
    words = n & ~7
    np.bitwise_xor(
        np.frombuffer(data, dtype=np.uint8, count=words).view(np.uint64),
        np.frombuffer(mask + mask, dtype=np.uint64)[0],
        out=np.frombuffer(out, dtype=np.uint8, count=words).view(np.uint64),
    )
    if words < n:
        out[words:] = apply_mask(memoryview(data)[words:], mask)  # the phase is 0 at words
    return out


def unmask_in_place(view: memoryview, mask: bytes, offset: int) -> None:
    """XOR ``view`` (bytes) in place with the 4-byte ``mask``, ``view`` starting ``offset``
    bytes into the frame's payload: a small view as integers, a large one eight bytes at a
    time on aligned words by numpy, in one pass over the view (bench/REASONS.md, 'Masking')."""
    key = rotate_mask(mask, offset)
    n = len(view)
    if n <= SMALL_MASK:
        view[:] = apply_mask(view, key)
        return
    data = np.frombuffer(view, dtype=np.uint8)
    head = -data.__array_interface__["data"][0] & 7
    if head:
        view[:head] = apply_mask(view[:head], key)
        key = rotate_mask(key, head)
    end = head + ((n - head) & ~7)
    body = data[head:end].view(np.uint64)
    np.bitwise_xor(body, np.frombuffer(key + key, dtype=np.uint64)[0], out=body)
    if end < n:
        view[end:] = apply_mask(view[end:], key)


__all__ = [
    "CloseCode",
    "FrameError",
    "FrameHeader",
    "Opcode",
    "apply_mask",
    "close_payload",
    "frame_header",
    "header_size",
    "parse_header",
    "rotate_mask",
    "unmask_in_place",
]
