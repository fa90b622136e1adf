"""The binary codec: one websocket message is a typed header followed by raw buffers.

Layout of one binary websocket message (protocol v2)::

    u32 little-endian  N, the header's length in bytes (1 <= N <= MAX_HEADER)
    N bytes            the header: one message as JSON (``protocol.messages``)
    buffers            raw bytes, concatenated, lengths as ``message.buffer_sizes()`` says

Tensor bytes are C-order, little-endian, never base64, never JSON numbers, never pickle.
When a message carries buffers, its header ends in spaces (JSON allows them) so that the first
buffer starts at a multiple of :data:`ALIGN` bytes into the message: a receiver that reads the
message into aligned memory gets a read's array aligned, with no copy. A sender may split a
message into websocket fragments anywhere; :class:`MessageDecoder` takes the fragments one by
one and copies buffer bytes straight into preallocated arrays.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Generator, Sequence
from typing import Any, Generic, TypeVar

import numpy as np
from pydantic import BaseModel, TypeAdapter, ValidationError

from .errors import DecodeError, MessageLimitError
from .messages import Batch, Message, Request, Sync
from .stepwise import describe, validate_stepwise

MAX_HEADER = 64 * 2**20
MAX_BUFFERS = 2**16  # raw buffers one message may declare
ALIGN = 16  # the first buffer's offset in a message is a multiple: numpy's largest alignment
_PAD = b" " * ALIGN
_LEN = struct.Struct("<I")

M = TypeVar("M", bound=BaseModel)
Buffer = memoryview | np.ndarray[Any, np.dtype[np.uint8]]


def byte_view(array: np.ndarray[Any, Any]) -> memoryview:
    """A flat, zero-copy byte view of a C-contiguous array (a copy if it is not contiguous)."""
    flat = np.ascontiguousarray(array).reshape(-1)
    return flat.view(np.uint8).data


def encode_header(message: Message, aligned: bool = False) -> bytes:
    """The length and the JSON header of ``message``; ``aligned``: padded with spaces to a
    multiple of :data:`ALIGN` bytes in all (so the buffers after it start aligned)."""
    header = message.__pydantic_serializer__.to_json(message)
    if aligned:
        header += _PAD[: -(_LEN.size + len(header)) % ALIGN]
    return _LEN.pack(len(header)) + header


def encode(message: Message, buffers: Sequence[memoryview] = ()) -> list[bytes | memoryview]:
    """The chunks of one message: the header, then each buffer as a byte view.

    Raises:
        ValueError: the buffers' lengths differ from what the message declares.
    """
    declared = tuple(message.buffer_sizes())
    actual = tuple(b.nbytes for b in buffers)
    if declared != actual:
        raise ValueError(f"message declares buffers {declared} but {actual} were given")
    return [encode_header(message, aligned=bool(buffers)), *buffers]


def _empty(nbytes: int) -> np.ndarray[Any, np.dtype[np.uint8]]:
    return np.empty(nbytes, dtype=np.uint8)


class MessageDecoder(Generic[M]):
    """Decodes one message fed as one or more chunks (websocket fragments).

    Call :meth:`feed` with each fragment in order, then :meth:`finish`. When the first fragment
    holds the whole message, buffers are zero-copy (read-only) views of it; otherwise each
    buffer is a fresh writable ``np.uint8`` array that fragments are copied into.

    Limits are checked when the header has been validated and before any buffer is allocated:
    ``max_buffer_bytes`` caps the declared buffer bytes (the sum), and ``check``, if given, is
    called with the message and may raise :class:`MessageLimitError` to refuse it (the server
    uses it for its memory quota). ``allocate(n)``, if given, provides each buffer's ``n`` bytes
    of flat ``np.uint8`` memory (the server reuses freed tensors' memory); every byte of it is
    written before :meth:`finish` returns. After any error the caller must stop feeding this decoder
    (and drain the rest of the websocket message to keep the stream intact).

    ``hold_header(header)``, if given, is called with a header before it is validated,
    and may raise :class:`MessageLimitError` to refuse it (the message is drained unread);
    what it returns is kept in :attr:`header_hold` once the header is valid, for the caller
    to keep as long as the message (the server counts a decoded header's objects in its
    budget while that object lives), and dropped if it is not.

    A header longer than ``stepwise_over`` bytes is validated in steps
    (``protocol/stepwise.py``), so that the caller can do other work between them: while
    :attr:`stepping`, call :meth:`step` until it returns False, and feed nothing meanwhile.

    Raises:
        DecodeError: from ``feed`` or ``finish``, for a bad header, more bytes than declared,
            or fewer (truncated).
        MessageLimitError: from ``feed``, when the declared buffers exceed a limit.
    """

    def __init__(
        self,
        adapter: TypeAdapter[M],
        max_header: int = MAX_HEADER,
        max_buffer_bytes: int | None = None,
        check: Callable[[M], None] | None = None,
        max_buffers: int = MAX_BUFFERS,
        allocate: Callable[[int], np.ndarray[Any, np.dtype[np.uint8]]] | None = None,
        stepwise_over: int | None = None,
        hold_header: Callable[[bytes], object | None] | None = None,
    ) -> None:
        self._adapter = adapter
        self._hold_header = hold_header
        self.header_hold: object | None = None
        self._stepwise_over = stepwise_over
        self._steps: Generator[None, None, M] | None = None  # while the header is validated
        self._rest = memoryview(b"")  # what followed it in the first chunk
        self._max_header = max_header
        self._max_buffer_bytes = max_buffer_bytes
        self._max_buffers = max_buffers
        self._check = check
        self._allocate = allocate or _empty
        self.message: M | None = None
        self._sizes: tuple[int, ...] = ()
        self._buffers: list[Buffer] = []
        self._arrays: list[np.ndarray[Any, np.dtype[np.uint8]]] = []
        self._index = 0  # buffer being filled
        self._offset = 0  # bytes filled in it

    def feed(self, chunk: bytes | bytearray | memoryview) -> None:
        view = memoryview(chunk).cast("B")
        if self.message is None:
            if self._steps is not None:
                raise RuntimeError("fed while the header is being validated in steps")
            view = self._start(view)
        self._fill(view)

    @property
    def stepping(self) -> bool:
        """Whether the header is being validated in steps (see :meth:`step`)."""
        return self._steps is not None

    def step(self) -> bool:
        """Validate the header one step further; True while steps remain. After the last, the
        message stands as if its first chunk had just been fed whole.

        Raises:
            DecodeError: a bad header; MessageLimitError: its declared buffers exceed a limit.
        """
        assert self._steps is not None, "no header is being validated in steps"
        try:
            next(self._steps)
            return True
        except StopIteration as done:
            self.message = done.value
        except BaseException:
            self._steps = None  # a bad header: nothing more to step
            self.header_hold = None
            raise
        self._steps = None
        rest, self._rest = self._rest, memoryview(b"")
        self._fill(self._begin(rest))
        return False

    def _start(self, view: memoryview) -> memoryview:
        if len(view) < _LEN.size:
            raise DecodeError("message shorter than its 4-byte header length")
        (length,) = _LEN.unpack_from(view)
        if not 1 <= length <= self._max_header:
            raise DecodeError(f"header length {length} outside 1..{self._max_header}")
        if len(view) < _LEN.size + length:
            raise DecodeError("the header must arrive whole in the first fragment")
        header = bytes(view[_LEN.size : _LEN.size + length])  # once: each reader takes it
        rest = view[_LEN.size + length :]
        if self._hold_header is not None:
            self.header_hold = self._hold_header(header)
        if self._stepwise_over is not None and length > self._stepwise_over:
            self._steps = validate_stepwise(self._adapter, header)
            self._rest = memoryview(bytes(rest))  # the chunk may be the caller's buffer
            return rest[len(rest) :]
        try:
            self.message = self._adapter.validate_json(header)
        except ValidationError as exc:
            self.header_hold = None
            raise DecodeError(f"invalid message: {describe(exc)}") from None
        return self._begin(rest)

    def _begin(self, rest: memoryview) -> memoryview:
        """Check the validated message's buffers against the limits and make room for them;
        what of ``rest`` (the first chunk's bytes after the header) is left to fill them."""
        assert self.message is not None
        self._sizes = tuple(getattr(self.message, "buffer_sizes", tuple)())
        self._check_limits(self.message)
        if len(rest) == sum(self._sizes):  # the whole message in one chunk: zero-copy views
            self._buffers = []
            start = 0
            for size in self._sizes:  # a loop: np.cumsum costs more than the rest of a read
                self._buffers.append(rest[start : start + size])
                start += size
            self._index = len(self._sizes)
            return rest[len(rest) :]
        self._arrays = [self._allocate(n) for n in self._sizes]
        self._buffers = list(self._arrays)
        self._skip_full()
        return rest

    def _check_limits(self, message: M) -> None:
        if len(self._sizes) > self._max_buffers:
            raise MessageLimitError(
                f"{len(self._sizes)} buffers exceed the limit of {self._max_buffers}"
            )
        total = sum(self._sizes)
        if self._max_buffer_bytes is not None and total > self._max_buffer_bytes:
            raise MessageLimitError(
                f"the message declares {total} buffer bytes; the limit is {self._max_buffer_bytes}"
            )
        if self._check is not None:
            self._check(message)

    def _fill(self, view: memoryview) -> None:
        while len(view):
            if self._index >= len(self._sizes):
                raise DecodeError(f"{len(view)} bytes more than the message declares")
            n = min(len(view), self._sizes[self._index] - self._offset)
            target = self._arrays[self._index]
            target[self._offset : self._offset + n] = np.frombuffer(view[:n], dtype=np.uint8)
            self._offset += n
            view = view[n:]
            self._skip_full()

    def writable(self) -> memoryview | None:
        """Room in the buffer being filled, for a caller that writes the next bytes in place
        (``socket.recv_into``) and then calls :meth:`advance`; None before the header and once
        every buffer is full."""
        if self.message is None or self._index >= len(self._arrays):
            return None
        return self._arrays[self._index].data[self._offset :]

    def advance(self, n: int) -> None:
        """``n`` bytes were written at the start of the last :meth:`writable` room."""
        self._offset += n
        self._skip_full()

    def _skip_full(self) -> None:
        while self._index < len(self._sizes) and self._offset == self._sizes[self._index]:
            self._index += 1
            self._offset = 0

    def finish(self) -> tuple[M, list[Buffer]]:
        """The message and its buffers.

        Raises:
            DecodeError: nothing was fed, or the buffers are shorter than declared.
        """
        if self.message is None:
            raise DecodeError("empty message")
        if self._index < len(self._sizes):
            missing = sum(self._sizes[self._index :]) - self._offset
            raise DecodeError(f"truncated message: {missing} buffer bytes missing")
        return self.message, self._buffers


def decode(
    adapter: TypeAdapter[M],
    data: bytes | bytearray | memoryview,
    max_buffer_bytes: int | None = None,
) -> tuple[M, list[Buffer]]:
    """Decode a message that arrived whole. Raises :class:`DecodeError`."""
    decoder = MessageDecoder(adapter, max_buffer_bytes=max_buffer_bytes)
    decoder.feed(data)
    return decoder.finish()


def to_frames(
    chunks: Sequence[bytes | memoryview], fragment_size: int = 2**18
) -> bytes | list[bytes | memoryview]:
    """What to hand the websocket: one bytes object for a small message, or the fragments of a
    large one (the header alone first, then slices of the buffers, none copied).
    """
    total = sum(len(c) for c in chunks)
    if total <= fragment_size:
        return b"".join(chunks)
    frames: list[bytes | memoryview] = [chunks[0]]
    for chunk in chunks[1:]:
        view = memoryview(chunk).cast("B")
        frames.extend(view[i : i + fragment_size] for i in range(0, len(view), fragment_size))
    return frames


def _around_requests() -> tuple[bytes, bytes, bytes]:
    """The header of a batch that holds only requests and an ack, cut where the requests and
    the ack go: taken once from pydantic's own encoding of such a batch, so it follows the
    Batch model."""
    marker, ack = Sync(request_id=0), 987654321
    header = encode_header(Batch(requests=[marker], ack=ack))[4:]
    before, after = header.split(marker.__pydantic_serializer__.to_json(marker))
    between, end = after.split(str(ack).encode())
    return before, between, end


_BEFORE_REQUESTS, _BEFORE_ACK, _AFTER_ACK = _around_requests()


def requests_only(requests: Sequence[Request], ack: int = 0) -> bytes:
    """The encoding of ``Batch(requests=requests, ack=ack)``, without building the batch (a
    read's hot path: about half the cost of ``to_frames(encode(Batch(...)))``)."""
    body = b",".join(r.__pydantic_serializer__.to_json(r) for r in requests)
    header = b"%b%b%b%d%b" % (_BEFORE_REQUESTS, body, _BEFORE_ACK, ack, _AFTER_ACK)
    return _LEN.pack(len(header)) + header
