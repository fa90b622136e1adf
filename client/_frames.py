"""What the client's transport (``client._transport``) needs of websocket frames beside
``protocol.framing``: the sink a message's payload is received into, a server's frame headers
checked as RFC 6455 requires, and the error a closed or broken connection raises."""

from __future__ import annotations

from typing import Protocol

from protocol.framing import FrameError, FrameHeader, parse_header


class Sink(Protocol):
    """Where :meth:`Transport.receive` puts a message's payload."""

    def feed(self, chunk: bytes | bytearray | memoryview) -> None:
        """Take the next ``chunk`` of the payload."""

    def writable(self) -> memoryview | None:
        """Room for the next payload bytes, written in place, or None."""

    def advance(self, n: int) -> None:
        """``n`` bytes were written at the start of the last :meth:`writable` room."""


class Closed(Exception):
    """The connection is closed or broken; ``str()`` says why."""


def parsed(head: bytes | bytearray) -> FrameHeader | None:
    """The server frame header at the start of ``head`` (None while it is not whole).

    Raises:
        Closed: a frame that breaks RFC 6455 (a masked one: servers never mask, 5.1; a
            reserved bit; a control frame too long or fragmented).
    """
    try:
        return parse_header(head, masked=False)
    except FrameError as exc:
        raise Closed(str(exc)) from None
