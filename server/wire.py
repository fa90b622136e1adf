"""The server's websocket wire: data frames parsed here, payloads received straight into place.

websockets' sans-I/O protocol (``server/websocket.py``) does the HTTP upgrade, the close
handshake and every control frame; data frames never reach it. This connection is an asyncio
:class:`~asyncio.BufferedProtocol`, so the event loop reads the socket into memory this module
chooses. Inside a large payload that memory is the room the message decoder offers in its
destination array, so the bytes go from the kernel into the tensor once and the client's mask is
removed in place; elsewhere it is a receive buffer parsed here. The upgrade request and whole
control frames are handed to the protocol byte for byte.

Theory of operation: the byte stream is in one :class:`Reading` state at a time::

    REQUEST  --request whole, answered: upgraded---->  FRAME     (refused: FAILED)
    FRAME    --a data frame's header----------------->  PAYLOAD   (a control frame: FRAME)
    PAYLOAD  --the frame's last payload byte--------->  FRAME     (its message may be whole)
    any      --a frame that breaks RFC 6455---------->  FAILED    (closed 1002 or 1009)

The upgrade is answered as soon as its request is whole (``server/listener.py``). In FRAME,
while the connection is open and the owner has set no decoders yet, bytes wait in the buffer
(*held*), and reading stops if the buffer fills; they are parsed when more bytes arrive or the
owner sets decoders. A data message that starts while no decoder exists (the connection is
closing after a refused hello) is read and dropped; once the connection is lost or dropped (a
write failed: the peer reset it), nothing more is parsed. On plain TCP, each readiness event
reads on while the socket holds bytes (up to :data:`READ_AHEAD`), so a fragmented upload does
not cost a turn of the event loop per frame header and payload. Sending is
:class:`server.sending.SendingConnection`'s.
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Callable
from enum import Enum
from typing import Any

from protocol import DecodeError
from protocol.codec import MAX_HEADER
from protocol.framing import (
    FIRST_CONTROL,
    CloseCode,
    FrameError,
    FrameHeader,
    Opcode,
    apply_mask,
    parse_header,
    unmask_in_place,
)
from protocol.framing import (
    MAX_HEADER as MAX_FRAME_HEADER,
)

from .errors import bare
from .incoming import Decoder, FrameBeingRead, MessageBeingRead, received, unmask_into
from .receiving import ReceivingConnection
from .sending import SendingConnection

RECV_SIZE = 1 << 18  # the largest first frame taken whole
SMALL_BUFFER = 1 << 14  # the receive buffer of a session at rest (grown for larger frames)
MAX_REQUEST = 1 << 16  # bytes of an HTTP upgrade request buffered before the protocol sees them
READ_AHEAD = 1 << 20  # bytes read on past one readiness event before the loop has a turn
_LEN = struct.Struct("<I")


class Reading(Enum):
    """Where the byte stream stands (see the module docstring)."""

    REQUEST = "request"  # the HTTP upgrade request, up to its blank line
    FRAME = "frame"  # at a frame boundary: the next bytes are a frame header
    PAYLOAD = "payload"  # inside a data frame's payload
    FAILED = "failed"  # a protocol violation: every byte is dropped


class WireConnection(SendingConnection, ReceivingConnection):
    """A websocket server connection that decodes Tensorwire messages as their bytes arrive.

    The owner sets :attr:`decoders` (a fresh decoder per message), takes whole messages with
    :meth:`receive` and sends with :meth:`send_message`; ``close`` and the rest are
    :class:`~server.websocket.WebSocket`'s.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._decoders: Callable[[], Decoder] | None = None
        self._one_only = False  # decoders serve one message, then bytes wait for new ones
        self.max_header = MAX_HEADER  # the decoders' limit: a longer header is not buffered
        self._reading = Reading.REQUEST
        self._frame = FrameBeingRead(0, 0, b"", False)  # meaningful in PAYLOAD; one, reused
        self._message: MessageBeingRead | None = None
        self._buf = bytearray(SMALL_BUFFER)
        self._start = self._end = 0  # unparsed bytes of _buf
        self._direct: memoryview | None = None  # room handed to the loop inside a payload
        self._offered = 0  # bytes of the last room get_buffer offered

    @property
    def decoders(self) -> Callable[[], Decoder] | None:
        """Makes a fresh decoder per message; while None, bytes wait at a message boundary.
        Setting it parses what waited (the owner decides when its next message may come)."""
        return self._decoders

    @decoders.setter
    def decoders(self, decoders: Callable[[], Decoder] | None) -> None:
        self._decoders = decoders
        if decoders is not None and self._end > self._start:
            self.parse()

    def decode_one(self, decoders: Callable[[], Decoder]) -> None:
        """Decode the next message with ``decoders`` and then stop parsing until
        :attr:`decoders` is set again (a hello is decoded under other limits than the
        session's messages, which may be right behind it in the same read)."""
        self._one_only = True
        self.decoders = decoders

    def _held(self) -> bool:
        """Whether bytes wait for decoders."""
        return self._reading is Reading.FRAME and self._decoders is None and self.is_open

    # --- receiving: asyncio calls these ---------------------------------------------------------

    def get_buffer(self, sizehint: int) -> memoryview:
        room = self._room()
        self._offered = len(room)
        return room

    def _room(self) -> memoryview:
        if self._start == self._end:
            message = self._message
            decoder = None if message is None or message.error else message.decoder
            room = None if decoder is None else decoder.writable()
            if room is not None and self._reading is Reading.PAYLOAD:
                self._direct = room[: self._frame.left]
                return self._direct
            self._start = self._end = 0
            if room is not None and self.is_open:  # the next frame's header alone: then its
                return memoryview(self._buf)[:MAX_FRAME_HEADER]  # payload goes straight to
        elif len(self._buf) - self._end < MAX_FRAME_HEADER:  # the room above
            self._compact()
            if len(self._buf) - self._end < MAX_FRAME_HEADER:  # never an empty view: that
                self._grow(2 * len(self._buf))  # reads as the end of the stream
        return memoryview(self._buf)[self._end :]

    def buffer_updated(self, nbytes: int) -> None:
        full = nbytes == self._offered  # else the socket had no more: no read-ahead
        self._take(nbytes)
        if full and self.raw_socket is not None:
            self._read_on(self.raw_socket)

    def _read_on(self, sock: socket.socket) -> None:
        """Go on reading what the socket already holds, up to :data:`READ_AHEAD` bytes, before
        the event loop has its next turn. A large message arrives as header, payload, header,
        ... and asyncio reads once per readiness event, so each of those reads would otherwise
        cost a turn of the loop (bench/REASONS.md, 'Reading on'). Stops at the first read that
        would wait, and whenever reading should stop (paused, failed, held, closing).

        Raises:
            OSError: the socket failed; asyncio then closes the connection with it, as it does
                for an error of its own read.
        """
        budget = READ_AHEAD
        while budget > 0 and not self.reading_paused and self.is_open and not self.is_dropped:
            if self._reading is Reading.FAILED or self._held():
                return
            room = self.get_buffer(-1)
            try:
                n = sock.recv_into(room)
            except (BlockingIOError, InterruptedError):
                n = 0
            except OSError:
                self._direct = None
                raise
            if not n:  # nothing more now (or the end of the stream, which the loop sees next)
                self._direct = None
                return
            self._take(n)
            if n < len(room):
                return  # the socket gave all it had: reading again would only fail
            budget -= n

    def _take(self, nbytes: int) -> None:
        room, self._direct = self._direct, None
        if room is None:
            self._end += nbytes
            self.parse()
            return
        assert self._message is not None and self._message.decoder is not None  # it offered room
        frame = self._frame
        unmask_in_place(room[:nbytes], frame.mask, frame.pos)
        self._message.decoder.advance(nbytes)
        self._payload_read(nbytes)

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        self.stop_waiting()
        # Its receive buffer, perhaps grown for a large frame, is let go of now. What else it
        # held goes by reference counting, with no collection (bench/REASONS.md, 'Collecting
        # closed connections'): its session is no reference cycle.
        self._buf, self._start, self._end = bytearray(SMALL_BUFFER), 0, 0

    # --- parsing ----------------------------------------------------------------------------

    def parse(self) -> None:
        """Parse what the receive buffer holds, as far as it goes, unless it is held (see the
        module docstring) or the connection is gone; read the socket again if it was stopped.
        Runs when bytes arrive and when decoders are set."""
        if self._reading is Reading.FAILED:
            self._start = self._end = 0
            return
        if self.is_closed or self.is_dropped:  # gone, or going: nothing more is parsed (a
            return  # control frame's answer, a pong, would be written to a dead socket)
        while self._end > self._start and not self.holding:
            reading = self._reading
            if reading is Reading.PAYLOAD:
                self._payload_from_buffer()
            elif reading is Reading.FRAME:
                if self._decoders is None and self.is_open:
                    break  # held until the owner sets decoders
                if not self._next_frame():
                    break
            elif not self._request():  # REQUEST
                break
        if self.reading_paused or self._end > self._start:
            self.update_reading()

    def _request(self) -> bool:
        """Hand the protocol the HTTP upgrade request, and nothing after it (frames that
        follow are ours); it is answered at once. False while it is not whole. A request that
        does not end within :data:`MAX_REQUEST` bytes is handed over as it is (the protocol
        refuses it) and the rest is dropped."""
        data = self._buf[self._start : self._end]
        end = data.find(b"\r\n\r\n")
        if end < 0 and len(data) < MAX_REQUEST:
            return False
        upto = len(data) if end < 0 else end + 4
        self._start += upto
        self.feed(bytes(data[:upto]))
        self._reading = Reading.FRAME if self.is_open and end >= 0 else Reading.FAILED
        return True

    def _next_frame(self) -> bool:
        """Parse the frame at the front of the buffer: a whole control frame goes to the
        protocol, a data frame's header starts its payload. False if more bytes are needed
        (or the frame broke the protocol)."""
        s = self._start
        try:
            header = parse_header(self._buf, True, s, self._end)
        except FrameError as exc:
            return self._fail(exc)
        if header is None:
            return False
        if header.opcode >= FIRST_CONTROL:
            size = header.size + header.length
            if self._end - s < size:
                return False
            self._start += size
            self.feed(bytes(self._buf[s : s + size]))  # the protocol's business
            return not self.is_dropped  # else its answer (a pong) found the peer gone: stop
        try:
            return self._data_frame(header)
        except FrameError as exc:
            return self._fail(exc)

    def _data_frame(self, header: FrameHeader) -> bool:
        """Start reading a data frame's payload; False to wait for more of its first bytes.

        Raises:
            FrameError: the frame is out of sequence, or the message grows past the limit.
        """
        starting = header.opcode in (Opcode.BINARY, Opcode.TEXT)
        if header.opcode == Opcode.CONT and self._message is None:
            raise FrameError("unexpected continuation frame")
        if starting and self._message is not None:
            raise FrameError("expected a continuation frame")
        if not starting and header.opcode != Opcode.CONT:
            raise FrameError(f"invalid opcode {header.opcode}")
        limit = self.settings.max_message_size
        size = header.length + (0 if starting or self._message is None else self._message.nbytes)
        if limit is not None and size > limit:
            raise FrameError(f"over size limit ({size} > {limit} bytes)", CloseCode.MESSAGE_TOO_BIG)
        take = 0
        if starting:  # the message's header must reach the decoder in one piece
            take = self._prefix(header)
            if take < 0:
                return False
        self._start += header.size
        frame = self._frame
        frame.left, frame.pos, frame.mask, frame.fin = header.length, 0, header.mask, header.fin
        self._reading = Reading.PAYLOAD
        if starting:
            self._message = MessageBeingRead(None if self._decoders is None else self._decoders())
            if take:
                self._payload_from_buffer(take)
        if not header.length:
            self._frame_done()
        return True

    def _prefix(self, header: FrameHeader) -> int:
        """How much of a message's first frame to take at once (all of it if it is small; else
        the message header's length word and the header), or -1 to wait for more bytes (the
        buffer grows to hold them)."""
        s = self._start + header.size
        avail = self._end - s
        length = header.length
        if length <= RECV_SIZE:
            need = length
        elif avail < _LEN.size:
            need = _LEN.size
        else:
            word = apply_mask(self._buf[s : s + _LEN.size], header.mask)
            need = min(length, _LEN.size + _LEN.unpack(word)[0])
            if need > _LEN.size + self.max_header:
                need = _LEN.size  # a header over the limit: the decoder refuses it
        if avail >= need:
            return need
        if header.size + need > len(self._buf) - self._start:
            self._grow(header.size + need)
        return -1

    def _payload_from_buffer(self, most: int | None = None) -> None:
        take = min(self._frame.left, self._end - self._start)
        if most is not None:
            take = min(take, most)
        s = self._start
        self._start += take
        message = self._message
        if message is not None and message.error is None and self.taking_data:
            if message.decoder is not None:
                data = memoryview(self._buf)[s : s + take]
                try:
                    unmask_into(message.decoder, data, self._frame.mask, self._frame.pos)
                except DecodeError as exc:
                    message.error = bare(exc)  # the rest of the message is drained
                if message.decoder.stepping:  # a long header: validated first (``hold``)
                    return self.hold(message, lambda: self._payload_read(take))
        self._payload_read(take)

    def _payload_read(self, n: int) -> None:
        """``n`` more payload bytes of the frame were read."""
        frame = self._frame
        frame.pos += n
        frame.left -= n
        if self._message is not None:
            self._message.nbytes += n
        if not frame.left:
            self._frame_done()

    def _frame_done(self) -> None:
        self._reading = Reading.FRAME
        message = self._message
        if not self._frame.fin or message is None:
            return
        self._message = None
        if self._one_only:
            self._decoders, self._one_only = None, False
        if message.decoder is not None and self.taking_data:  # a message that ends after the
            self.deliver(received(message.decoder, message.error, message.nbytes))  # client's
        # close frame is dropped: the close handshake has begun

    def _fail(self, error: FrameError) -> bool:
        """A protocol violation: close (1002 or 1009) and read nothing more."""
        self._start = self._end = 0
        self._message = None
        self._reading = Reading.FAILED
        self.fail(error.close_code, str(error))
        return False

    # --- the receive buffer ---------------------------------------------------------------------

    def _compact(self) -> None:
        size = self._end - self._start
        self._buf[:size] = self._buf[self._start : self._end]  # same length: no resize
        self._start, self._end = 0, size

    def _grow(self, need: int) -> None:
        """Make room for ``need`` bytes from the start of the unparsed ones (a new buffer:
        the loop may still hold a view of the old one)."""
        buf = bytearray(max(need, SMALL_BUFFER))
        size = self._end - self._start
        buf[:size] = self._buf[self._start : self._end]
        self._buf, self._start, self._end = buf, 0, size

    def stuck(self) -> bool:
        """Whether held bytes fill the buffer, so reading must stop until they are parsed."""
        return len(self._buf) - self._end < MAX_FRAME_HEADER and self._held()

    def at_rest(self) -> None:
        """Nothing is waiting: shrink a grown receive buffer (16 KiB a session, not 256)."""
        if len(self._buf) > SMALL_BUFFER and self._start == self._end:
            self._buf = bytearray(SMALL_BUFFER)


__all__ = ["Reading", "WireConnection"]
