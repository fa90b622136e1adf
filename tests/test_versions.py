"""Protocol versions at the hello (protocol/README.md, "Versions and compatibility"): a v1
client's hello to this server, and this client against a v1 server, refuse at once, naming both
versions and the side to upgrade.

The v1 server here is v1's handshake as it was (the last v1 server, before protocol v2): its
hello model, strict and closed to unknown fields, and its answer to a hello it cannot validate,
a ``Refused {protocol: 1, error: bad_message}`` and a clean close, on a real websocket server.
"""

from __future__ import annotations

import json
import struct
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Literal

import pytest
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect
from websockets.sync.server import ServerConnection, serve

import client
from protocol import PROTOCOL_VERSION, SERVER_ADAPTER, ErrorCode, Refused, decode

pytestmark = pytest.mark.wire

V1_HELLO = b'{"type":"hello","protocol":1,"device_index":0}'  # what a v1 client sent first


def _message(header: bytes) -> bytes:
    """One protocol message without buffers: u32 header length, then the header."""
    return struct.pack("<I", len(header)) + header


def test_a_v1_hello_is_refused_at_once_naming_both_versions(url: str) -> None:
    started = time.monotonic()
    with connect(url, compression=None) as ws:
        ws.send(_message(V1_HELLO))
        reply, _ = decode(SERVER_ADAPTER, ws.recv(timeout=5, decode=False))
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=5)
    took = time.monotonic() - started
    assert isinstance(reply, Refused) and reply.protocol == PROTOCOL_VERSION
    assert reply.error.code is ErrorCode.VERSION_MISMATCH
    message = reply.error.message
    assert "client speaks protocol v1" in message and f"speaks v{PROTOCOL_VERSION}" in message
    assert "upgrade the client" in message
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1000
    assert took < 1.0, took


class _V1Hello(BaseModel):
    """Protocol v1's hello, as its server validated it."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)
    type: Literal["hello"] = "hello"
    protocol: int
    device_index: int = Field(default=0, ge=0)


def _v1_handshake(ws: ServerConnection) -> None:
    """A v1 server's answer to a first message: a hello it cannot validate is refused as a bad
    message (v1's ``Refused`` had no ``server_id``), a v1 hello as a version mismatch."""
    data = ws.recv(timeout=5, decode=False)
    assert isinstance(data, bytes)
    (length,) = struct.unpack_from("<I", data)
    try:
        hello = _V1Hello.model_validate_json(data[4 : 4 + length])
    except ValidationError as exc:
        error = {"code": "bad_message", "message": f"invalid message: {exc.errors()[0]['msg']}"}
    else:
        error = {"code": "version_mismatch", "message": f"client speaks v{hello.protocol}"}
    ws.send(_message(json.dumps({"type": "refused", "protocol": 1, "error": error}).encode()))
    ws.close(1000, "handshake refused")


@contextmanager
def _v1_server() -> Iterator[str]:
    with serve(_v1_handshake, "127.0.0.1", 0, compression=None) as server:
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            yield f"ws://127.0.0.1:{server.socket.getsockname()[1]}"
        finally:
            server.shutdown()
            thread.join(10)


@pytest.mark.inprocess
def test_this_client_refuses_a_v1_server_at_once_naming_both_versions() -> None:
    with _v1_server() as url:
        started = time.monotonic()
        with pytest.raises(client.VersionMismatchError) as refused:
            client.RemoteDevice(url)
        took = time.monotonic() - started
    message = str(refused.value)
    assert "speaks protocol v1" in message and f"this client speaks v{PROTOCOL_VERSION}" in message
    assert "upgrade the server" in message and url in message
    assert took < 1.0, took


def test_the_nn_ops_go_only_to_a_server_that_announced_them(url: str) -> None:
    """The neural-network ops are a feature of v2 (``nn``): this server announces it, and a
    client facing a v2 server without it (an older release) refuses them before sending,
    naming the feature; everything else goes on."""
    with client.RemoteDevice(url) as dev:
        assert dev._conn.welcome.features == ["nn", "optim", "segments", "limits", "resume"]
        xp = client.namespace(dev)
        x = xp.asarray([[1.0, 2.0, 3.0]])
        assert xp.__tensorwire_nn__.softmax("softmax", x, axis=-1).numpy().sum() == pytest.approx(1)
    with client.RemoteDevice(url) as dev:
        conn = dev._conn
        conn.welcome = conn.welcome.model_copy(update={"features": ["resume"]})
        xp = client.namespace(dev)
        x = xp.asarray([[1.0, 2.0, 3.0]])
        with pytest.raises(client.FeatureNotSupportedError, match="'nn'.*upgrade"):
            xp.__tensorwire_nn__.softmax("softmax", x, axis=-1)
        assert (x + 1).numpy().tolist() == [[2.0, 3.0, 4.0]]
