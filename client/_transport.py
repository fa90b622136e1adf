"""A websocket client connection driven by the threads that use it: no thread of its own.

It knows nothing of Tensorwire messages. websockets' sans-I/O
:class:`~websockets.client.ClientProtocol` does the opening handshake, pongs and the close
handshake; data frames and the client's own pings are framed and parsed with
``protocol.framing`` (shared with the server; the headers checked in ``client._frames``), so
that a payload is masked with one copy and received straight into its array; this module owns
the socket. Sending is done by the sending thread; receiving by whichever thread calls
:meth:`Transport.receive` (the caller must let one thread at a time do that). Nothing crosses
a thread on the way, which halves a small round trip's cost against websockets' threaded
clients on a 2-core machine.

Bytes the protocol produces (frames being sent, and pongs and close replies made while
receiving) go through one FIFO, written in order by whichever thread holds the send lock, so a
receiving thread never waits for a large send to finish: a reader can always make progress.
"""

from __future__ import annotations

import collections
import os
import select
import socket
import ssl
import threading
from collections.abc import Callable, Mapping
from typing import Any

from websockets.exceptions import InvalidHandshake, InvalidURI
from websockets.frames import Frame
from websockets.frames import Opcode as EventOpcode

from protocol.framing import (
    MAX_HEADER,
    FrameHeader,
    Opcode,
    apply_mask,
    close_payload,
    frame_header,
    header_size,
)

from ._frames import Closed, Sink, parsed
from ._upgrade import RECV_SIZE, upgrade

# The first read of a message: a small reply whole in one call, and little of a large one,
# whose bytes read this way are copied twice more (into the read buffer, then the array) where
# the rest is received in place (bench/REASONS.md, 'First read of a message').
FIRST_BITE = 1 << 16
SMALL_FRAME = 1 << 16  # over TLS, frames below this go out in one write, header and payload joined


class Transport:
    """An open websocket connection to ``url`` (``ws://`` or ``wss://``).

    Raises:
        OSError, TimeoutError: the server cannot be reached.
        InvalidURI, InvalidHandshake: the URL is bad or the server refused the upgrade.
    """

    def __init__(
        self,
        url: str,
        open_timeout: float,
        max_size: int,
        headers: Mapping[str, str] | None = None,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        opened = upgrade(url, open_timeout, max_size, headers or {}, ssl_context)
        self.socket = opened.socket  # it keeps open_timeout until opened()
        self.protocol = opened.protocol
        self.response = opened.response  # the server's 101: its headers say what was agreed
        self._lock = threading.Lock()  # the protocol's state and the FIFO
        self._send_lock = threading.Lock()  # who writes the FIFO to the socket
        self.sent_bytes = 0  # data frames written, headers included (the bench reads it)
        self.received_bytes = 0  # read from the socket (client._liveness: any byte answers)
        self.pings = 0  # keepalive pings sent
        self._out: collections.deque[bytes] = collections.deque()
        self._events: collections.deque[Frame] = collections.deque(opened.early)
        self._rbuf = bytearray()  # read from the socket, not parsed yet, from _rpos on
        self._rpos = 0
        self._scratch = memoryview(bytearray(RECV_SIZE))  # see _recv_more
        self._taken = 0  # bytes of the stream parsed so far
        self.close_received: tuple[int, str] | None = None  # the server's close frame

    def opened(self) -> None:
        """The caller's own opening exchange is done: no timeout on the socket from now on."""
        self.socket.settimeout(None)

    # --- sending ------------------------------------------------------------------------------

    @property
    def send_lock(self) -> threading.Lock:
        """Held by one sender at a time; the caller of :meth:`send` must hold it."""
        return self._send_lock

    def send(self, frames: bytes | list[bytes | memoryview]) -> None:
        """Send one binary message (a list: its fragments). The caller holds :attr:`send_lock`.

        Raises:
            Closed: the connection is closing, closed or broke.
        """
        if isinstance(frames, bytes):
            frames = [frames]
        last = len(frames) - 1
        for i, frame in enumerate(frames):
            with self._lock:
                self._check_open()
            opcode = Opcode.CONT if i else Opcode.BINARY
            self._write_frame(opcode, i == last, frame)
            self._flush_out()  # control frames that receiving made meanwhile

    def _write_frame(self, opcode: Opcode, fin: bool, payload: bytes | memoryview) -> None:
        """Write one masked data frame, framed here and not by the protocol: one copy of the
        payload (masking, with a fresh key: RFC 6455, 5.3), written by :meth:`_send_parts`.
        The caller holds the send lock; the protocol sees no data frames of ours and needs
        none."""
        mask = os.urandom(4)
        masked = apply_mask(payload, mask)
        head = frame_header(opcode, fin, len(payload), mask)
        self.sent_bytes += len(head) + len(masked)
        try:
            self._send_parts(head, masked)
        except OSError as exc:
            raise Closed(f"send failed: {exc}") from exc

    def _send_parts(self, head: bytes, body: bytes | bytearray) -> None:
        """``head`` then ``body``: one ``sendmsg`` for a small frame (no joined copy), two
        writes for a large one: with the header written alone, the server's 256 KiB reads tend
        to line up with the payloads, and one write of both is slower (bench/REASONS.md,
        'Large frames in two writes').

        Raises:
            OSError: the socket failed.
        """
        sock = self.socket
        if len(body) >= SMALL_FRAME:
            sock.sendall(head)
            sock.sendall(body)
        elif isinstance(sock, ssl.SSLSocket):  # no sendmsg over TLS
            sock.sendall(head + body)
        else:
            sent = sock.sendmsg((head, body))
            if sent < len(head) + len(body):  # cut short (a signal, a send timeout): rare
                sock.sendall((head + body)[sent:])

    def _check_open(self) -> None:
        if self.protocol.state.name != "OPEN":
            raise Closed(f"connection is {self.protocol.state.name.lower()}")

    def _flush_out(self) -> None:
        """Write the FIFO (the caller holds the send lock)."""
        try:
            while True:
                with self._lock:
                    if not self._out:
                        return
                    chunk = self._out.popleft()
                if chunk:
                    self.socket.sendall(chunk)
                else:  # the protocol's end of stream, after the close handshake
                    self.socket.shutdown(socket.SHUT_WR)
        except OSError as exc:
            raise Closed(f"send failed: {exc}") from exc

    def ping(self) -> bool:
        """Send a keepalive ping unless that could block (a thread holds :attr:`send_lock`, or
        the socket is full); whether it went out. Its pong shows in :attr:`received_bytes`."""
        if not self._send_lock.acquire(blocking=False):
            return False
        try:  # an empty ping is its masked header alone, framed here as data frames are
            writable = select.select([], [self.socket], [], 0)[1]
            if not writable or self.protocol.state.name != "OPEN":
                return False
            self.socket.sendall(frame_header(Opcode.PING, True, 0, os.urandom(4)))
        except (OSError, ValueError):  # ValueError: another thread closed the socket (fd -1)
            return False
        finally:
            self.release_send_lock()
        self.pings += 1
        return True

    def _flush_if_free(self) -> None:
        """Write what receiving produced (pongs, a close reply) unless a sender holds the lock:
        that sender writes it before it lets go, and every thread that lets go looks again."""
        while self._out and self._send_lock.acquire(blocking=False):
            try:
                self._flush_out()
            except Closed:
                return
            finally:
                self._send_lock.release()

    def release_send_lock(self) -> None:
        """Let go of :attr:`send_lock`, then write anything left behind by a receiver."""
        self._send_lock.release()
        self._flush_if_free()

    # --- receiving: one thread at a time ------------------------------------------------------
    # Frames from the server are parsed here, not by the protocol, so that a large payload is
    # received straight into its destination (``recv_into``). Control frames (ping, pong,
    # close) are handed to the protocol whole, which answers them and tracks the close.

    def receive(self, sink: Sink) -> None:
        """Read one whole data message into ``sink``: each payload part goes to
        ``sink.writable()`` when it offers room, else to ``sink.feed``. Anything raised once part
        of the message was read (an interrupt, an error from ``sink``) cuts the connection: the
        stream's place in the message is lost.

        Raises:
            Closed: the connection closed or broke (a thread blocked here wakes when it does).
        """
        taken = self._taken
        try:
            self._receive(sink)
        except Closed:
            raise
        except BaseException:
            if self._taken != taken:
                self.abort()
            raise

    def _receive(self, sink: Sink) -> None:
        while self._events:  # frames that came with the handshake's response
            early = self._events.popleft()
            sink.feed(early.data)
            if early.fin:
                return
        inside = False  # within a fragmented message: read headers in small bites
        while True:
            head = self._take(2, 16 if inside else FIRST_BITE)
            size = header_size(head[0], head[1])
            if size > 2:
                head += self._take(size - 2, 16)
            frame = parsed(head)
            assert frame is not None  # the whole header was taken
            if frame.control:
                self._control(head + self._take(frame.length, RECV_SIZE))
                continue
            if not inside and frame.length <= RECV_SIZE:  # a first frame arrives whole: the
                sink.feed(self._take(frame.length, RECV_SIZE))  # message's header is in it
            else:
                self._payload(sink, frame.length)
            if frame.fin:
                return
            inside = True

    def poll(self) -> list[bytearray]:
        """If the socket holds something, read it once, without blocking: answer the control
        frames at the front (pings) and take the whole one-frame data messages there (small
        ones, such as acknowledgements), whose payloads are returned; a message still arriving,
        or fragmented, waits for :meth:`receive`.

        Raises:
            Closed: the connection closed or broke.
        """
        try:
            decrypted = isinstance(self.socket, ssl.SSLSocket) and self.socket.pending() > 0
            readable = decrypted or select.select([self.socket], [], [], 0)[0]
        except (OSError, ValueError) as exc:  # ValueError: closed by another thread (fd -1)
            raise Closed(f"poll failed: {exc}") from exc
        if readable:
            self._recv_more(RECV_SIZE)  # TLS: select cannot see bytes already decrypted
        messages: list[bytearray] = []
        while not self._events and (whole := self._whole_frame()) is not None:
            frame, size = whole
            if frame.control:
                self._control(self._take(size, 0))
            else:
                messages.append(self._take(size, 0)[frame.size :])
        return messages

    def _whole_frame(self) -> tuple[FrameHeader, int] | None:
        """The frame at the front of the read buffer and its size, if it is whole and either a
        control frame or a whole one-frame data message."""
        buf, pos = self._rbuf, self._rpos
        frame = parsed(bytes(buf[pos : pos + MAX_HEADER]))
        if frame is None or len(buf) - pos < frame.size + frame.length:
            return None
        if not frame.control and not (frame.fin and frame.opcode == Opcode.BINARY):
            return None
        return frame, frame.size + frame.length

    def _control(self, frame: bytearray) -> None:
        with self._lock:
            self.protocol.receive_data(frame)
            for event in self.protocol.events_received():  # control frames: data are ours
                if isinstance(event, Frame) and event.opcode is EventOpcode.CLOSE:
                    self.close_received = close_payload(event.data)
            self._out.extend(self.protocol.data_to_send())
        self._flush_if_free()

    def _payload(self, sink: Sink, length: int) -> None:
        buffered = min(length, len(self._rbuf) - self._rpos)
        if buffered:
            sink.feed(self._take(buffered, 0))
        left = length - buffered
        while left:
            room = sink.writable()
            if room is not None and len(room):
                n = min(left, len(room))
                got = self._recv_into(room[:n])
                self._taken += got
                sink.advance(got)
            else:
                data = self._recv(min(left, RECV_SIZE))
                got = len(data)
                self._taken += got
                sink.feed(data)
            left -= got

    def _take(self, n: int, bite: int) -> bytearray:
        """The next ``n`` bytes of the stream, reading ``max(bite, what is missing)`` at a
        time."""
        while len(self._rbuf) - self._rpos < n:
            self._recv_more(max(bite, n - (len(self._rbuf) - self._rpos)))
        out = self._rbuf[self._rpos : self._rpos + n]  # a copy: the buffer may move on
        self._rpos += n
        self._taken += n
        if self._rpos == len(self._rbuf):
            self._rbuf, self._rpos = bytearray(), 0
        return out

    def _recv_more(self, size: int) -> None:
        """Append at most ``size`` (up to :data:`RECV_SIZE`) more bytes to the read buffer.

        Reads into a scratch buffer kept for the connection: ``socket.recv(RECV_SIZE)``
        allocates 256 KiB per call, which malloc maps and unmaps while its dynamic mmap
        threshold is still low (a fresh process): page faults on every small reply
        (bench/REASONS.md, 'Scratch receive buffer')."""
        if self._rpos:
            del self._rbuf[: self._rpos]
            self._rpos = 0
        scratch = self._scratch[: min(size, RECV_SIZE)]
        self._rbuf += scratch[: self._recv_into(scratch)]

    def _recv(self, size: int) -> bytes:
        data: bytes = self._read(self.socket.recv, size)
        return data

    def _recv_into(self, target: memoryview) -> int:
        got: int = self._read(self.socket.recv_into, target)
        return got

    def _read(self, call: Callable[[Any], Any], arg: Any) -> Any:
        """``call(arg)`` (a receive), counted; :meth:`_ended` when the socket ended."""
        error: OSError | None = None
        try:
            got = call(arg)
        except OSError as exc:
            error = exc
        else:
            if got:
                self.received_bytes += got if isinstance(got, int) else len(got)
                return got
        raise self._ended(error) from error

    def _ended(self, error: OSError | None) -> Closed:
        """The socket ended (end of stream or an error): the protocol learns it, the socket
        is cut, and this is the exception to raise. Called outside the ``except`` block of
        ``error``, whose traceback is dropped: what the protocol keeps of the end must not
        hold the reading thread's frames (and the arrays in them) in a reference cycle."""
        if error is not None:
            error.__traceback__ = None
        with self._lock:
            self.protocol.receive_eof()
            self._out.extend(self.protocol.data_to_send())
        self._events.clear()
        self.abort()
        return Closed(str(error or self.protocol.close_exc))

    # --- closing ------------------------------------------------------------------------------

    def send_close(self, code: int = 1000, reason: str = "") -> None:
        """Start the close handshake (the caller holds :attr:`send_lock`); then receive until
        :class:`Closed`. Does nothing on a connection that is not open."""
        with self._lock:
            if self.protocol.state.name != "OPEN":
                return
            self.protocol.send_close(code, reason)
            self._out.extend(self.protocol.data_to_send())
        try:
            self._flush_out()
        except Closed:
            pass

    def abort(self) -> None:
        """Cut the connection at once: blocked sends and receives in other threads fail."""
        try:
            self.socket.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # already closed

    def close(self) -> None:
        """Release the socket. Call once no other thread uses this transport."""
        self.abort()
        self.socket.close()


__all__ = ["Closed", "InvalidHandshake", "InvalidURI", "Transport"]
