"""The server's websocket wire: data frames parsed here, payloads received straight into place.

Rule: imports asyncio, websockets, ``protocol``, ``server.frames`` and ``server.sending`` only;
knows nothing of sessions.

websockets' asyncio :class:`ServerConnection` still does the HTTP upgrade, keepalive pings,
the close handshake and every control frame. Data frames never reach it: this subclass is an
asyncio :class:`~asyncio.BufferedProtocol`, so the event loop reads the socket into memory this
module chooses. Inside a large payload that memory is the room the message decoder offers in its
destination array, so the bytes go from the kernel into the tensor once and the client's mask is
removed in place; elsewhere it is a receive buffer parsed here. Whole control frames are handed
to websockets byte for byte, so pongs, closes and protocol errors behave as they did. Websockets
alone copies each received byte about four times (buffer, frame slice, unmask, reassembly).

On plain TCP, each readiness event reads on while the socket holds bytes (up to 1 MiB), so a
fragmented upload does not cost a turn of the event loop per frame header and payload.

Sending is :class:`server.sending.SendingConnection`'s.
"""

from __future__ import annotations

import asyncio
import collections
import math
import socket
import struct
from collections.abc import Callable
from typing import Any

from websockets.frames import CloseCode, Opcode
from websockets.protocol import State

from protocol import DecodeError
from protocol.codec import MAX_HEADER

from .frames import Decoder, Received, apply_mask, received, unmask_in_place
from .sending import SendingConnection

RECV_SIZE = 1 << 18  # the largest first frame taken whole
SMALL_BUFFER = 1 << 14  # the receive buffer of a session at rest (grown for larger frames)
HEADER_BITE = 14  # the longest masked frame header: read alone inside a fragmented message
MAX_REQUEST = 1 << 16  # bytes of an HTTP upgrade request buffered before websockets sees them
QUEUE_HIGH = 8  # default of max_waiting
READ_AHEAD = 1 << 20  # bytes read on past one readiness event before the loop has a turn
_CONTROL = 8
_LEN = struct.Struct("<I")


class WireConnection(SendingConnection, asyncio.BufferedProtocol):
    """A websocket server connection that decodes Tensorwire messages as their bytes arrive.

    The owner sets :attr:`decoders` (a fresh decoder per message), takes whole messages with
    :meth:`receive` and sends with :meth:`send_message`; ``close`` and the rest are websockets'.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.decoders: Callable[[], Decoder] | None = None
        self._one_only = False  # decoders serve one message, then bytes wait for new ones
        self.max_header = MAX_HEADER  # the decoders' limit: a longer header is not buffered
        self.max_waiting = QUEUE_HIGH  # whole messages waiting: stop reading the socket (TCP
        # pushes back on a client that sends faster than its messages are answered)
        self._buf = bytearray(SMALL_BUFFER)
        self._start = self._end = 0  # unparsed bytes of _buf
        self._direct: memoryview | None = None  # room handed to the loop inside a payload
        self._deferred = False  # bytes wait for the upgrade to finish or for decoders
        self._request_fed = False
        self._reading_paused = False
        self._failed = False  # a protocol violation: nothing more is parsed
        # the frame being read (its header is parsed) and the message it belongs to
        self._left = 0  # payload bytes of the frame not read yet
        self._pos = 0  # payload bytes of the frame read so far (the mask's phase)
        self._mask = b""
        self._fin = False
        self._decoder: Decoder | None = None  # set while a data message is being read
        self._error: DecodeError | None = None
        self._nbytes = 0
        self._messages: collections.deque[Received] = collections.deque()
        self._waiter: asyncio.Future[None] | None = None
        self._idle_at = 0.0  # when the wait in progress times out (see receive)
        self._idle_timer: asyncio.TimerHandle | None = None
        self._offered = 0  # bytes of the last room get_buffer offered

    def decode_one(self, decoders: Callable[[], Decoder]) -> None:
        """Decode the next message with ``decoders`` and then stop parsing until
        :attr:`decoders` is set again (a hello is decoded under other limits than the
        session's messages, which may be right behind it in the same read)."""
        self.decoders, self._one_only = decoders, True

    @property
    def waiting(self) -> int:
        """Whole messages received and not taken by :meth:`receive` yet."""
        return len(self._messages)

    # --- receiving: asyncio calls these ---------------------------------------------------------

    def get_buffer(self, sizehint: int) -> memoryview:
        room = self._room()
        self._offered = len(room)
        return room

    def _room(self) -> memoryview:
        if self._start == self._end:
            decoder = self._decoder
            room = None if decoder is None or self._error else decoder.writable()
            if room is not None and self._left:
                self._direct = room[: self._left]
                return self._direct
            self._start = self._end = 0
            if room is not None and self.protocol.state is State.OPEN:  # the next frame's
                return memoryview(self._buf)[:HEADER_BITE]  # header alone: then its payload
        elif len(self._buf) - self._end < HEADER_BITE:  # goes straight to the room above
            self._compact()
            if len(self._buf) - self._end < HEADER_BITE:  # never an empty view: that reads
                self._grow(2 * len(self._buf))  # as the end of the stream
        return memoryview(self._buf)[self._end :]

    def buffer_updated(self, nbytes: int) -> None:
        full = nbytes == self._offered  # else the socket had no more: no read-ahead
        self._take(nbytes)
        if full and self._sock is not None:
            self._read_on(self._sock)

    def _read_on(self, sock: socket.socket) -> None:
        """Go on reading what the socket already holds, up to :data:`READ_AHEAD` bytes, before
        the event loop has its next turn. A large message arrives as header, payload, header,
        ... and asyncio reads once per readiness event, so each of those reads would otherwise
        cost a turn of the loop (an A/B of 1 MiB uploads and their syncs, four server pairs:
        9% less wall time on average, 2-9% less server CPU).
        Stops at the first read that would wait, and whenever reading should stop (paused,
        failed, waiting for decoders, closing).

        Raises:
            OSError: the socket failed; asyncio then closes the connection with it, as it does
                for an error of its own read.
        """
        budget = READ_AHEAD
        while budget > 0 and not (self._reading_paused or self._failed or self._deferred):
            if self.protocol.state is not State.OPEN:
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
            self._parse()
            return
        assert self._decoder is not None
        unmask_in_place(room[:nbytes], self._mask, self._pos)
        self._decoder.advance(nbytes)
        self._pos += nbytes
        self._nbytes += nbytes
        self._left -= nbytes
        if not self._left:
            self._frame_done()

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        if self._idle_timer is not None:
            self._idle_timer.cancel()  # it holds this connection until it fires
            self._idle_timer = None
        self._wake()

    # --- parsing ----------------------------------------------------------------------------

    def _parse(self) -> None:
        """Parse what the receive buffer holds, as far as it goes; read the socket again if
        it was stopped for bytes that are now parsed."""
        self._parse_buffer()
        if self._reading_paused:
            self._update_reading()

    def _parse_buffer(self) -> None:
        self._deferred = False
        if self._failed:
            self._start = self._end = 0
            return
        while self._end > self._start:
            state = self.protocol.state
            if state is State.CONNECTING:
                self._feed_request()
                return
            if state is State.CLOSED or (state is State.OPEN and self.decoders is None):
                self._deferred = state is not State.CLOSED
                self._update_reading()
                return
            if self._left:
                self._payload_from_buffer()
            elif not self._frame():
                return

    def _feed_request(self) -> None:
        """Hand websockets the HTTP upgrade request, and nothing after it (frames that follow
        are ours, parsed once the upgrade is answered)."""
        if self._request_fed:
            self._deferred = True
            self._update_reading()
            return
        data = self._buf[self._start : self._end]
        end = data.find(b"\r\n\r\n")
        if end < 0 and len(data) < MAX_REQUEST:
            return
        upto = len(data) if end < 0 else end + 4
        self._start += upto
        self._request_fed = True
        self._deferred = self._end > self._start  # frames behind the request: parsed later
        self.data_received(bytes(data[:upto]))

    def _frame(self) -> bool:
        """Parse the frame header at the front of the buffer; False if more bytes are needed."""
        buf, s = self._buf, self._start
        avail = self._end - s
        if avail < 2:
            return False
        first, second = buf[s], buf[s + 1]
        if not second & 0x80:
            return self._fail(CloseCode.PROTOCOL_ERROR, "incorrect masking")
        if first & 0x70:
            return self._fail(CloseCode.PROTOCOL_ERROR, "reserved bits must be 0")
        length = second & 0x7F
        extra = 2 if length == 126 else 8 if length == 127 else 0
        header = 2 + extra + 4
        if avail < header:
            return False
        if extra:
            length = int.from_bytes(buf[s + 2 : s + 2 + extra], "big")
        opcode, fin = first & 0x0F, bool(first & 0x80)
        if opcode >= _CONTROL:
            if length > 125:
                return self._fail(CloseCode.PROTOCOL_ERROR, "control frame too long")
            if avail < header + length:
                return False
            self._start += header + length
            self.data_received(bytes(buf[s : s + header + length]))  # websockets' business
            return True
        return self._data_frame(opcode, fin, header, length)

    def _data_frame(self, opcode: int, fin: bool, header: int, length: int) -> bool:
        starting = opcode in (Opcode.BINARY, Opcode.TEXT)
        if opcode == Opcode.CONT and self._decoder is None:
            return self._fail(CloseCode.PROTOCOL_ERROR, "unexpected continuation frame")
        if starting and self._decoder is not None:
            return self._fail(CloseCode.PROTOCOL_ERROR, "expected a continuation frame")
        if not starting and opcode != Opcode.CONT:
            return self._fail(CloseCode.PROTOCOL_ERROR, f"invalid opcode {opcode}")
        max_size = self.protocol.max_message_size
        size = length if starting else self._nbytes + length
        if max_size is not None and size > max_size:
            return self._fail(
                CloseCode.MESSAGE_TOO_BIG, f"over size limit ({size} > {max_size} bytes)"
            )
        s = self._start
        take = 0
        if starting:  # the message's header must reach the decoder in one piece
            take = self._prefix(length, header)
            if take < 0:
                return False
        self._mask = bytes(self._buf[s + header - 4 : s + header])
        self._start += header
        self._left, self._pos, self._fin = length, 0, fin
        if starting:
            assert self.decoders is not None
            self._decoder, self._error, self._nbytes = self.decoders(), None, 0
            if take:
                self._payload_from_buffer(take)
        if not self._left:
            self._frame_done()
        return True

    def _prefix(self, length: int, header: int) -> int:
        """How much of a message's first frame to take at once (all of it if it is small; else
        the message header's length word and the header), or -1 to wait for more bytes (the
        buffer grows to hold them)."""
        s = self._start + header
        avail = self._end - s
        if length <= RECV_SIZE:
            need = length
        elif avail < _LEN.size:
            need = _LEN.size
        else:
            word = apply_mask(self._buf[s : s + _LEN.size], bytes(self._buf[s - 4 : s]))
            need = min(length, _LEN.size + _LEN.unpack(word)[0])
            if need > _LEN.size + self.max_header:
                need = _LEN.size  # a header over the limit: the decoder refuses it
        if avail >= need:
            return need
        if header + need > len(self._buf) - self._start:
            self._grow(header + need)
        return -1

    def _payload_from_buffer(self, most: int | None = None) -> None:
        take = min(self._left, self._end - self._start)
        if most is not None:
            take = min(take, most)
        s = self._start
        self._start += take
        if self._error is None and self._decoder is not None and self._taking():
            self._to_decoder(self._decoder, memoryview(self._buf)[s : s + take])
        self._pos += take
        self._nbytes += take
        self._left -= take
        if not self._left:
            self._frame_done()

    def _to_decoder(self, decoder: Decoder, data: memoryview) -> None:
        """Unmask ``data`` (the frame's payload from ``self._pos`` on) into ``decoder``: copied
        once into the room it offers and unmasked there, else fed as a fresh bytes object (the
        message's header, or bytes past what it declares)."""
        pos = self._pos
        try:
            while len(data):
                room = decoder.writable()
                if room is None:
                    phase = pos & 3
                    decoder.feed(apply_mask(data, self._mask[phase:] + self._mask[:phase]))
                    return
                n = min(len(room), len(data))
                room[:n] = data[:n]
                unmask_in_place(room[:n], self._mask, pos)
                decoder.advance(n)
                data, pos = data[n:], pos + n
        except DecodeError as exc:
            self._error = exc

    def _frame_done(self) -> None:
        if not self._fin or self._decoder is None:
            return
        decoder, self._decoder = self._decoder, None
        if self._one_only:
            self.decoders, self._one_only = None, False
        if not self._taking():
            return  # a message that ends after the client's close is dropped
        self._messages.append(received(decoder, self._error, self._nbytes))
        self._nbytes = 0
        self._wake()
        self._update_reading()

    def _taking(self) -> bool:
        """Whether data frames still count: not after the client's close frame (websockets
        discards them), but still after ours, as websockets delivers them."""
        state = self.protocol.state
        open_ = state is State.OPEN or state is State.CLOSING
        return open_ and self.protocol.close_rcvd is None

    def _fail(self, code: CloseCode, reason: str) -> bool:
        """A protocol violation: close as websockets would, and read nothing more."""
        self._start = self._end = self._left = 0
        self._decoder = None
        self._failed = True
        self.protocol.fail(code, reason)
        self.send_data()
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

    def _update_reading(self) -> None:
        """Stop reading the socket while whole messages wait or bytes wait for the upgrade."""
        full = len(self._messages) >= self.max_waiting
        stuck = self._deferred and len(self._buf) - self._end < HEADER_BITE
        want = full or stuck
        if want != self._reading_paused:
            self._reading_paused = want
            if want:
                self.transport.pause_reading()
            else:
                self.transport.resume_reading()

    # --- the owner's side ---------------------------------------------------------------------

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def _closed(self) -> bool:
        return self.protocol.state is State.CLOSED

    def _idle_check(self) -> None:
        """The idle timer: wake a wait that began ``within`` seconds ago or more. One timer
        serves every wait: it is armed for the first and, when it fires during a later one,
        armed again for that one's deadline (a timer made and cancelled per wait cost 3-4% of
        the server's CPU on small reads)."""
        self._idle_timer = None
        if self._waiter is None or self._idle_at == math.inf:
            return  # not waiting, or waiting without a timeout: the next timed wait arms it
        if self.loop.time() < self._idle_at:
            self._idle_timer = self.loop.call_at(self._idle_at, self._idle_check)
        else:
            self._wake()

    async def receive(self, within: float | None = None) -> Received | None:
        """The next whole message, or None once ``within`` seconds pass without one (a timer
        of the loop's, see :meth:`_idle_check`: cheaper than a cancel scope).

        Raises:
            ConnectionClosed: the connection closed and every message was taken.
        """
        if self._deferred:
            self._parse()
        if not self._messages:
            if self._closed():
                raise self.close_exc
            if len(self._buf) > SMALL_BUFFER and self._start == self._end:
                self._buf = bytearray(SMALL_BUFFER)  # at rest: 16 KiB a session, not 256
            self._waiter = self.loop.create_future()
            if within is None:
                self._idle_at = math.inf
            else:
                self._idle_at = self.loop.time() + within
                if self._idle_timer is None:
                    self._idle_timer = self.loop.call_at(self._idle_at, self._idle_check)
            try:
                await self._waiter
            finally:
                self._waiter = None
            if not self._messages:
                if self._closed():
                    raise self.close_exc
                return None
        item = self._messages.popleft()
        if self._reading_paused:
            self._update_reading()
        return item


__all__ = ["WireConnection"]
