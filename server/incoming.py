"""Incoming messages: what the wire hands the connection loop (one whole message, decoded, or
the error that decoding it met), and how a frame's masked payload reaches its decoder."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from protocol import (
    Batch,
    DecodeError,
    ErrorCode,
    ErrorInfo,
    Hello,
    MessageDecoder,
    MessageLimitError,
)
from protocol.codec import Buffer
from protocol.framing import apply_mask, rotate_mask, unmask_in_place

from .errors import bare

if TYPE_CHECKING:
    from .outcome import Job  # annotations only: the session's layer is above the wire's

Decoder = MessageDecoder[Hello | Batch]


@dataclass
class Received:
    """One whole message off the wire, decoded, or the error that decoding it met."""

    message: Hello | Batch | None
    buffers: list[Buffer]
    error: ErrorInfo | None = None
    nbytes: int = 0
    at: float = field(default_factory=time.perf_counter)  # when it arrived whole
    number: int = 0  # of the connection's messages, the hello 0: a batch's is the client's count
    # Set where it was started (server/answering.py), for the session's task to go on: that it
    # was, the job it left, that its replies were all sent, or the exception starting it raised
    started: bool = False
    job: Job | None = None
    answered: bool = False
    failure: Exception | None = None
    ack_due: bool = False  # acknowledge it once it ran (server/live.py, Live.took)
    # The charge of its decoded header's objects (server/header_memory.py): dropped, which
    # gives it back, once the message is answered
    header_hold: object | None = None


@dataclass(slots=True)
class FrameBeingRead:
    """The data frame being read: payload bytes left, bytes read (the mask's phase), its key."""

    left: int
    pos: int
    mask: bytes
    fin: bool


@dataclass(slots=True)
class MessageBeingRead:
    """The data message being read, and the error decoding it met (the rest is drained)."""

    decoder: Decoder | None  # None: no decoder exists (closing after a refused hello): dropped
    error: DecodeError | None = None
    nbytes: int = 0


def received(decoder: Decoder, error: DecodeError | None, nbytes: int) -> Received:
    """The outcome of one message fed to ``decoder``: a limit error keeps the (valid) header,
    so that its ops can be failed one by one. (Nothing is raised here: a caught exception's
    traceback would hold this frame, and the decoder's bytes, in a cycle.)"""
    if error is None:
        try:
            message, buffers = decoder.finish()
        except DecodeError as exc:
            error = bare(exc)
        else:
            return Received(message, buffers, nbytes=nbytes, header_hold=_hold(decoder))
    if isinstance(error, MessageLimitError):
        refused = ErrorInfo(code=error.code, message=str(error))
        return Received(decoder.message, [], refused, nbytes, header_hold=_hold(decoder))
    decoder.header_hold = None
    return Received(None, [], ErrorInfo(code=ErrorCode.BAD_MESSAGE, message=str(error)), nbytes)


def _hold(decoder: Decoder) -> object | None:
    """The decoder's header charge, moved from it to the message's :class:`Received`."""
    hold, decoder.header_hold = decoder.header_hold, None
    return hold


def step_header(message: MessageBeingRead, until: float) -> bool:
    """Validate ``message``'s header in steps (``MessageDecoder.step``) until it is done (True)
    or ``time.monotonic()`` reaches ``until`` (False: call again later). A refused header
    becomes ``message.error`` (the rest of the message is drained)."""
    assert message.decoder is not None  # only a decoder steps
    try:
        while message.decoder.step():
            if time.monotonic() >= until:
                return False
    except DecodeError as exc:
        message.error = bare(exc)
    return True


def unmask_into(decoder: Decoder, data: memoryview, mask: bytes, pos: int) -> None:
    """Unmask ``data`` (a frame's payload from byte ``pos`` on, masked with ``mask``) into
    ``decoder``: copied once into the room it offers and unmasked there, else fed as a fresh
    bytes object (the message's header, or bytes past what it declares).

    Raises:
        DecodeError: the decoder refused the bytes (the caller drains the rest unread).
    """
    while len(data):
        room = decoder.writable()
        if room is None:
            decoder.feed(apply_mask(data, rotate_mask(mask, pos) if pos & 3 else mask))
            return
        n = min(len(room), len(data))
        room[:n] = data[:n]
        unmask_in_place(room[:n], mask, pos)
        decoder.advance(n)
        data, pos = data[n:], pos + n


__all__ = [
    "Decoder",
    "FrameBeingRead",
    "MessageBeingRead",
    "Received",
    "received",
    "step_header",
    "unmask_into",
]
