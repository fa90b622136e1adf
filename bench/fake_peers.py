"""Peer servers that misbehave, for the pulls of a real server (``server/peers.py``): a small
websockets server on loopback that speaks the protocol by hand, as a malicious or outdated
source of transfers would. A real target server that lists ``ws://127.0.0.1:*`` in its
``--peers`` pulls from it like from any source.

Each peer answers the hello as :data:`Answer` says (a welcome of this version, or a hello of
another version), and then each claim as its ``claims`` function says: declare more bytes
than the claim reserved, send a reply that answers no claim, or stay silent.
"""

from __future__ import annotations

import json
import struct
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from websockets.exceptions import ConnectionClosed
from websockets.sync.server import ServerConnection, serve

from protocol import (
    CLIENT_ADAPTER,
    PROTOCOL_VERSION,
    Batch,
    Claim,
    ErrorCode,
    ErrorInfo,
    ReadReply,
    RequestFailed,
    Welcome,
    decode,
)
from protocol.codec import encode_header

FRAGMENT = 1 << 20  # bytes of a lying reply sent per websocket fragment
Claims = Callable[[ServerConnection, Claim], None]  # how a peer answers one claim


def welcome(version: int = PROTOCOL_VERSION) -> bytes:
    """A welcome of protocol ``version``, without resumption (features none)."""
    answer = Welcome(
        protocol=version,
        device_index=0,
        device_count=1,
        server_id="feed",
        session_id="0123456789abcdef",
    )
    return encode_header(answer)


def refused_as_v1() -> bytes:
    """A v1 server's answer to a v2 hello, which its strict hello model cannot validate."""
    error = {"code": "bad_message", "message": "invalid message: extra inputs are not permitted"}
    return _header({"type": "refused", "protocol": 1, "error": error})


def _header(message: dict[str, object]) -> bytes:
    header = json.dumps(message).encode()
    return struct.pack("<I", len(header)) + header


def lies_about_size(declared: int) -> Claims:
    """Answer a claim with a read reply that declares ``declared`` bytes (a float64 vector of
    that size), and send them all, whatever the claim reserved."""

    def answer(ws: ServerConnection, claim: Claim) -> None:
        _send_reply(ws, claim.request_id, declared)

    return answer


def strays(declared: int) -> Claims:
    """Send a read reply of ``declared`` bytes that answers no claim, then refuse the claim."""

    def answer(ws: ServerConnection, claim: Claim) -> None:
        _send_reply(ws, claim.request_id + 1000, declared)
        error = ErrorInfo(code=ErrorCode.CAPABILITY_REFUSED, message="unknown to this server")
        ws.send(encode_header(RequestFailed(request_id=claim.request_id, error=error)))

    return answer


def silent(ws: ServerConnection, claim: Claim) -> None:
    """Never answer the claim (pings are still answered, by the websockets library)."""


def _send_reply(ws: ServerConnection, request_id: int, declared: int) -> None:
    reply = ReadReply(
        request_id=request_id, shape=(declared // 8,), dtype="float64", nbytes=declared
    )
    chunk = bytes(FRAGMENT)

    def fragments() -> Iterator[bytes]:
        yield encode_header(reply, aligned=True)
        for start in range(0, declared, FRAGMENT):
            yield chunk[: min(FRAGMENT, declared - start)]

    ws.send(fragments())


class FakePeer:
    """A peer on loopback: :attr:`url`; :attr:`claims` counts the claims it received."""

    def __init__(self, hello_answer: bytes, claims: Claims) -> None:
        self._hello_answer = hello_answer
        self._welcomes = b'"type":"welcome"' in hello_answer  # else it closes after answering
        self._answer = claims
        self.claims = 0
        self.url = ""
        self.connections: list[ServerConnection] = []

    def handle(self, ws: ServerConnection) -> None:
        self.connections.append(ws)
        try:
            ws.recv(timeout=10, decode=False)  # the hello, of whatever version
            ws.send(self._hello_answer)
            if not self._welcomes:
                ws.close(1000, "handshake refused")
                return
            while True:
                message, _ = decode(CLIENT_ADAPTER, ws.recv(decode=False))
                if not isinstance(message, Batch):
                    continue
                for request in message.requests:
                    if isinstance(request, Claim):
                        self.claims += 1
                        self._answer(ws, request)
        except ConnectionClosed:
            pass  # the target cut the connection: what a lying peer must expect


@contextmanager
def fake_peer(claims: Claims = silent, hello_answer: bytes | None = None) -> Iterator[FakePeer]:
    """A :class:`FakePeer` serving until the block ends; then its connections are closed."""
    peer = FakePeer(welcome() if hello_answer is None else hello_answer, claims)
    with serve(peer.handle, "127.0.0.1", 0, compression=None, max_size=None) as server:
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        peer.url = f"ws://127.0.0.1:{server.socket.getsockname()[1]}"
        try:
            yield peer
        finally:
            server.shutdown()
            for ws in peer.connections:
                ws.close()
            thread.join(10)
