"""Opening a websocket: TCP without Nagle's delay, TLS for ``wss://``, and the HTTP upgrade,
driven through websockets' sans-I/O :class:`~websockets.client.ClientProtocol` on a blocking
socket. It knows nothing of Tensorwire messages; ``client._transport`` runs the connection it
opens."""

from __future__ import annotations

import socket
import ssl
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from websockets.client import ClientProtocol
from websockets.exceptions import InvalidHandshake
from websockets.frames import Frame
from websockets.http11 import Response
from websockets.uri import parse_uri

from protocol.framing import Opcode

RECV_SIZE = 1 << 18
_DATA: frozenset[int] = frozenset({Opcode.BINARY, Opcode.CONT, Opcode.TEXT})


@dataclass
class Upgraded:
    """An upgraded connection: its socket (still with the opening timeout), websockets'
    protocol state, and any data frames that arrived with the upgrade's response."""

    socket: socket.socket
    protocol: ClientProtocol
    response: Response  # the server's 101
    early: list[Frame]


def upgrade(
    url: str,
    open_timeout: float,
    max_size: int,
    headers: Mapping[str, str],
    ssl_context: ssl.SSLContext | None,
) -> Upgraded:
    """Connect to ``url`` (``ws://`` or ``wss://``) and upgrade with ``headers`` added.

    Raises:
        OSError, TimeoutError: the server cannot be reached.
        InvalidURI, InvalidHandshake: the URL is bad or the server refused the upgrade.
    """
    uri = parse_uri(url)
    sock = socket.create_connection((uri.host, uri.port), timeout=open_timeout)
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if uri.secure:
            context = ssl_context or ssl.create_default_context()
            sock = context.wrap_socket(sock, server_hostname=uri.host)
        protocol = ClientProtocol(uri, max_size=max_size)  # no extensions: no deflate
        response, early = _handshake(sock, protocol, headers)
    except BaseException:
        sock.close()
        raise
    return Upgraded(sock, protocol, response, early)


def _handshake(
    sock: socket.socket, protocol: ClientProtocol, headers: Mapping[str, str]
) -> tuple[Response, list[Frame]]:
    """The HTTP upgrade; returns the response and the data frames that came right behind it."""
    request = protocol.connect()
    for name, value in headers.items():
        request.headers[name] = value
    protocol.send_request(request)
    for chunk in protocol.data_to_send():
        sock.sendall(chunk)
    while True:
        data = sock.recv(RECV_SIZE)
        if data:
            protocol.receive_data(data)
        else:
            protocol.receive_eof()
        events = protocol.events_received()
        for i, event in enumerate(events):
            if isinstance(event, Response):
                if protocol.handshake_exc is not None:
                    raise protocol.handshake_exc
                return event, _frames(events[i + 1 :])
        if not data:
            raise InvalidHandshake("connection closed during the opening handshake")


def _frames(events: Iterable[object]) -> list[Frame]:
    """The data frames among ``events`` (control frames are the protocol's business)."""
    return [e for e in events if isinstance(e, Frame) and e.opcode in _DATA]
