"""The server's own frame parser (server.wire) against hand-made frames on a real socket.

Frames are built here byte by byte, so that every split, interleaving and violation the RFC
allows (or forbids) reaches the server exactly as written; the server's replies are parsed with
websockets' sans-I/O client protocol.
"""

from __future__ import annotations

import os
import socket
import struct
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from websockets.client import ClientProtocol
from websockets.frames import Frame, Opcode
from websockets.http11 import Response
from websockets.uri import parse_uri

from protocol import (
    PROTOCOL_VERSION,
    SERVER_ADAPTER,
    Batch,
    Hello,
    Read,
    ReadReply,
    Sync,
    SyncReply,
    Welcome,
    decode,
    encode,
)
from protocol.framing import apply_mask, unmask_in_place
from protocol.ops import FromBuffer, Full

from .raw import Witness
from .servers import ServerProcess, run_server

pytestmark = pytest.mark.wire

WAIT = 30.0


def frame(
    opcode: int, payload: bytes, *, fin: bool = True, masked: bool = True, rsv: int = 0
) -> bytes:
    """One client frame, exactly as given (masked with a fresh key unless ``masked`` is
    False)."""
    first = (0x80 if fin else 0) | rsv | opcode
    bit = 0x80 if masked else 0
    n = len(payload)
    if n < 126:
        head = struct.pack("!BB", first, bit | n)
    elif n < 1 << 16:
        head = struct.pack("!BBH", first, bit | 126, n)
    else:
        head = struct.pack("!BBQ", first, bit | 127, n)
    if not masked:
        return head + payload
    key = os.urandom(4)
    return head + key + apply_mask(payload, key)


def message_bytes(batch: Batch | Hello, *buffers: np.ndarray) -> bytes:
    views = [b.reshape(-1).view(np.uint8).data for b in buffers]
    return b"".join(bytes(c) for c in encode(batch, views))


class Peer:
    """A raw socket speaking websocket frames by hand to a real server."""

    def __init__(self, url: str, *, early: bytes = b"", hello: bool = True, pad: int = 0) -> None:
        uri = parse_uri(url)
        self.protocol = ClientProtocol(uri, max_size=None)
        self.sock = socket.create_connection((uri.host, uri.port), timeout=WAIT)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.events: list[Frame] = []
        self.pongs: list[bytes] = []  # payloads of the server's pongs, in order
        try:
            self._open(early, hello, pad)
        except BaseException:
            self.sock.close()
            raise

    def _open(self, early: bytes, hello: bool, pad: int) -> None:
        request = self.protocol.connect()
        for i in range(pad):  # headers of 4 KB each: a request larger than the first read
            request.headers[f"X-Pad-{i}"] = "p" * 4000
        self.protocol.send_request(request)
        upgrade = b"".join(self.protocol.data_to_send())
        if hello:
            early = frame(Opcode.BINARY, message_bytes(Hello(protocol=PROTOCOL_VERSION))) + early
        self.sock.sendall(upgrade + early)  # frames right behind the upgrade request
        self._until(lambda: self.response is not None)
        if hello:
            welcome = self.message()
            assert isinstance(welcome, Welcome)

    response: Response | None = None

    def _until(self, done: object) -> None:
        assert callable(done)
        while not done():
            data = self.sock.recv(1 << 16)
            if data:
                self.protocol.receive_data(data)
            else:
                self.protocol.receive_eof()
            for event in self.protocol.events_received():
                if isinstance(event, Response):
                    self.response = event
                elif isinstance(event, Frame) and event.opcode is Opcode.PONG:
                    self.pongs.append(bytes(event.data))
                else:
                    assert isinstance(event, Frame)
                    self.events.append(event)
            if not data:
                return

    def frame(self) -> Frame:
        """The next frame from the server (data or control)."""
        self._until(lambda: bool(self.events))
        assert self.events, "the server closed the connection"
        return self.events.pop(0)

    def reply(self) -> tuple[Any, list[Any]]:
        """The next whole data message, decoded, and its buffers (control frames on the way
        are skipped)."""
        parts: list[bytes] = []
        while True:
            got = self.frame()
            if got.opcode in (Opcode.BINARY, Opcode.CONT):
                parts.append(bytes(got.data))
                if got.fin:
                    return decode(SERVER_ADAPTER, b"".join(parts))

    def message(self) -> object:
        """The next whole data message, decoded."""
        return self.reply()[0]

    def pongs_until(self, payload: bytes) -> list[bytes]:
        """Every pong so far, once the one carrying ``payload`` has come."""
        self._until(lambda: payload in self.pongs)
        assert payload in self.pongs, "the server closed the connection"
        return self.pongs

    def close_code(self) -> int:
        """The code of the close frame the server sends next (data frames skipped)."""
        while True:
            got = self.frame()
            if got.opcode is Opcode.CLOSE:
                return int.from_bytes(got.data[:2], "big")

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def peer(url: str) -> Iterator[Peer]:
    each = Peer(url)
    yield each
    each.close()


def _upload(values: np.ndarray, request: int = 1) -> bytes:
    assert values.dtype == np.float32
    op = FromBuffer(out=1, shape=values.shape, dtype="float32", buffer=0)
    batch = Batch(ops=[op], requests=[Read(request_id=request, tensor=1)], buffers=[values.nbytes])
    return message_bytes(batch, values)


def _reads(peer: Peer, values: np.ndarray, request: int = 1) -> None:
    """The server's reply to :func:`_upload`: the values, byte exact."""
    reply, buffers = peer.reply()
    assert isinstance(reply, ReadReply) and reply.request_id == request, reply
    received = np.frombuffer(bytes(buffers[0]), values.dtype).reshape(values.shape)
    np.testing.assert_array_equal(received, values)


def test_unmask_in_place_matches_the_mask_at_every_phase_and_alignment() -> None:
    for size in (1, 3, 7, 8, 9, 100, 1 << 17, (1 << 17) + 5, 300_001):
        for phase in range(5):
            for lead in (0, 1, 3, 7):
                key, payload = os.urandom(4), os.urandom(phase + size)
                masked = apply_mask(payload, key)
                buf = bytearray(lead) + bytearray(masked[phase:])
                unmask_in_place(memoryview(buf)[lead:], key, phase)
                assert bytes(buf[lead:]) == payload[phase:], (size, phase, lead)


def test_a_message_split_at_every_byte_count_is_decoded(peer: Peer) -> None:
    values = np.arange(3000, dtype=np.float32)
    body = _upload(values)
    first = 4 + int.from_bytes(body[:4], "little") + 100  # the header and some data
    wire = frame(Opcode.BINARY, body[:first], fin=False) + frame(Opcode.CONT, body[first:])
    step = 1
    at = 0
    while at < len(wire):  # pieces of 1, 2, ... 15 bytes, then one large
        peer.send(wire[at : at + step])
        at += step
        step = step + 1 if step < 15 else len(wire)
    _reads(peer, values)


def test_pings_between_fragments_are_answered_and_the_message_lands(peer: Peer) -> None:
    values = np.random.default_rng(0).random((600, 700)).astype(np.float32)  # 1.6 MiB
    body = _upload(values)
    header = 4 + int.from_bytes(body[:4], "little")
    cut = [0, header, header + 1000, header + 300_000, header + 1_200_000, len(body)]
    for i in range(len(cut) - 1):
        opcode = Opcode.CONT if i else Opcode.BINARY
        peer.send(frame(opcode, body[cut[i] : cut[i + 1]], fin=i == len(cut) - 2))
        peer.send(frame(Opcode.PING, b"ping %d" % i))
    _reads(peer, values)
    last = b"ping %d" % (len(cut) - 2)  # the last pong may follow the reply
    assert peer.pongs_until(last) == [b"ping %d" % i for i in range(len(cut) - 1)]


def test_one_frame_larger_than_the_receive_buffer(peer: Peer) -> None:
    values = np.random.default_rng(1).random(400_000).astype(np.float32)  # 1.5 MiB, one frame
    peer.send(frame(Opcode.BINARY, _upload(values)))
    _reads(peer, values)


def test_one_frame_whose_header_alone_is_larger_than_the_receive_buffer(peer: Peer) -> None:
    values = np.random.default_rng(2).random(300_000).astype(np.float32)
    fill = [Full(out=i, shape=(1,), dtype="float32", value=0.0) for i in range(2, 5002)]
    upload = FromBuffer(out=1, shape=values.shape, dtype="float32", buffer=0)
    batch = Batch(ops=[*fill, upload], requests=[Read(request_id=1, tensor=1)])
    body = message_bytes(batch.model_copy(update={"buffers": [values.nbytes]}), values)
    assert int.from_bytes(body[:4], "little") > 1 << 18  # a JSON header over 256 KiB
    peer.send(frame(Opcode.BINARY, body))
    _reads(peer, values)


def test_frames_sent_before_the_upgrade_is_answered_are_kept(url: str) -> None:
    sync = message_bytes(Batch(requests=[Sync(request_id=9)]))
    early = Peer(url, early=frame(Opcode.BINARY, sync))
    try:
        reply = early.message()
        assert isinstance(reply, SyncReply) and reply.request_id == 9
    finally:
        early.close()


def test_an_upgrade_request_larger_than_the_receive_buffer(url: str) -> None:
    big = Peer(url, pad=10)  # about 40 KB of headers, then the hello right behind them
    try:
        big.send(frame(Opcode.BINARY, message_bytes(Batch(requests=[Sync(request_id=3)]))))
        reply = big.message()
        assert isinstance(reply, SyncReply) and reply.request_id == 3
    finally:
        big.close()


def test_an_upload_sent_before_the_welcome_is_decoded_for_the_session(url: str) -> None:
    values = np.arange(70_000, dtype=np.float32)  # fragmented: its buffer is allocated
    body = _upload(values)
    cut = 4 + int.from_bytes(body[:4], "little")
    early = frame(Opcode.BINARY, body[:cut], fin=False) + frame(Opcode.CONT, body[cut:])
    eager = Peer(url, early=early)  # hello and upload right behind the upgrade request
    try:
        _reads(eager, values)
    finally:
        eager.close()


@pytest.mark.parametrize(
    ("what", "wire"),
    [  # each named by its case: a mask is random, so the bytes would differ between processes
        pytest.param(what, wire, id=what)
        for what, wire in [
            ("unmasked", frame(Opcode.BINARY, b"x", masked=False)),
            ("reserved bit", frame(Opcode.BINARY, b"x", rsv=0x40)),
            ("continuation first", frame(Opcode.CONT, b"x")),
            (
                "new message inside one",
                frame(Opcode.BINARY, b"x", fin=False) + frame(Opcode.TEXT, b"y"),
            ),
            ("long control frame", frame(Opcode.PING, b"p" * 126)),
            ("unknown opcode", frame(3, b"x")),
        ]
    ],
)
def test_protocol_violations_close_with_1002_and_touch_no_one_else(
    url: str, what: str, wire: bytes
) -> None:
    witness = Witness(url, token=None)
    bad = Peer(url)
    try:
        bad.send(wire)
        assert bad.close_code() == 1002, what
    finally:
        bad.close()
    witness.assert_intact()
    witness.dev.close()


@pytest.mark.server
def test_fragments_adding_up_past_the_message_size_close_with_1009() -> None:
    with run_server("--max-message-size", "1MiB") as small:
        witness = Witness(small.url, token=None)
        big = Peer(small.url)
        try:
            big.send(frame(Opcode.BINARY, bytes(600_000), fin=False))
            big.send(frame(Opcode.CONT, bytes(600_000)))  # each fits, the message does not
            assert big.close_code() == 1009
        finally:
            big.close()
        witness.assert_intact()
        witness.dev.close()


def test_a_close_in_the_middle_of_a_message_is_answered(peer: Peer, server: ServerProcess) -> None:
    values = np.ones(100_000, dtype=np.float32)
    body = _upload(values)
    peer.send(frame(Opcode.BINARY, body[:5000], fin=False))
    peer.send(frame(Opcode.CLOSE, struct.pack("!H", 1000)))
    assert peer.close_code() == 1000


CHUNKS = (1, 2, 7, 14, 100, 4096, 65536, 200_000)  # socket writes: inside headers, whole frames


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_any_framing_and_chunking_of_a_message_stream_is_decoded(
    url: str, data: st.DataObject
) -> None:
    """Uploads of any size, cut into frames anywhere after their header, with pings between
    frames, written to the socket in pieces of any size (or all behind the upgrade request):
    every read returns its values, and every ping its pong."""
    sizes = data.draw(st.lists(st.integers(0, 100_000), min_size=1, max_size=3), label="elements")
    wire, expected, pings = b"", [], 0
    for i, n in enumerate(sizes, start=1):
        values = (np.arange(n, dtype=np.float32) + i).astype(np.float32)
        op = FromBuffer(out=i, shape=(n,), dtype="float32", buffer=0)
        batch = Batch(ops=[op], requests=[Read(request_id=i, tensor=i)], buffers=[values.nbytes])
        body = message_bytes(batch, values)
        header = 4 + int.from_bytes(body[:4], "little")
        cuts = sorted(set(data.draw(st.lists(st.integers(header, len(body)), max_size=4))))
        bounds = [0, *[c for c in cuts if c > header], len(body)]
        if bounds[1] < header:
            bounds.insert(1, header)
        for k in range(len(bounds) - 1):
            opcode = Opcode.CONT if k else Opcode.BINARY
            wire += frame(opcode, body[bounds[k] : bounds[k + 1]], fin=k == len(bounds) - 2)
            if data.draw(st.booleans(), label="ping"):
                wire += frame(Opcode.PING, b"p%d" % pings)
                pings += 1
        expected.append(values)
    early = data.draw(st.booleans(), label="behind the upgrade request")
    peer = Peer(url, early=wire if early else b"")
    try:
        if not early:
            at = 0
            while at < len(wire):
                step = data.draw(st.sampled_from(CHUNKS), label="write")
                peer.send(wire[at : at + step])
                at += step
        for i, values in enumerate(expected, start=1):
            _reads(peer, values, request=i)
        peer.send(frame(Opcode.PING, b"last"))  # its pong comes after all the others
        assert peer.pongs_until(b"last") == [*(b"p%d" % k for k in range(pings)), b"last"]
    finally:
        peer.close()
