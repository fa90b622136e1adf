"""A server with a small ``--max-message-size``, through a real server: the client cuts what it
sends to the limit its server's welcome says, so no message closes the session, and an upload
that cannot fit fails alone with :class:`client.MessageTooLargeError` (a ``MemoryError``)."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import numpy as np
import pytest

import client
from protocol import FEATURE_LIMITS, PROTOCOL_VERSION, Hello
from server.handshake import welcome

from .servers import ServerProcess, run_server

pytestmark = pytest.mark.server

LIMIT = 64 * 1024


@pytest.fixture(scope="module")
def small_messages() -> Iterator[ServerProcess]:
    with run_server("--max-message-size", str(LIMIT)) as proc:
        yield proc


@pytest.fixture
def sdev(small_messages: ServerProcess) -> Iterator[client.RemoteDevice]:
    with client.RemoteDevice(small_messages.url) as device:
        yield device


def test_the_welcome_says_the_limit_only_to_a_client_that_speaks_it() -> None:
    said = {"device_count": 1, "server_id": "ab", "session_id": "0" * 16, "secret": None}
    hello = Hello(protocol=PROTOCOL_VERSION, features=[FEATURE_LIMITS])
    assert welcome(hello, window=0, max_message_size=LIMIT, **said).max_message_size == LIMIT
    older = welcome(Hello(protocol=PROTOCOL_VERSION), window=0, max_message_size=LIMIT, **said)
    assert b"max_message_size" not in older.__pydantic_serializer__.to_json(older)


def test_an_upload_too_large_fails_alone(sdev: client.RemoteDevice) -> None:
    xp = client.namespace(sdev)
    assert sdev._conn.welcome.max_message_size == LIMIT
    kept = xp.asarray(np.arange(4.0))
    with pytest.raises(MemoryError) as info:
        xp.asarray(np.zeros(LIMIT // 8))
    assert isinstance(info.value, client.MessageTooLargeError)
    assert f"at most {LIMIT} bytes" in str(info.value)
    np.testing.assert_array_equal((kept * 2).numpy(), [0.0, 2.0, 4.0, 6.0])


def test_uploads_that_add_up_past_the_limit_travel_apart(sdev: client.RemoteDevice) -> None:
    xp = client.namespace(sdev)
    parts = [np.full(2000, float(i)) for i in range(40)]  # 16 KB each, 640 KB in all
    remote = [xp.asarray(p) for p in parts]
    np.testing.assert_array_equal(xp.concat(remote).numpy(), np.concatenate(parts))


def test_a_batch_of_ops_past_the_limit_is_cut(sdev: client.RemoteDevice) -> None:
    xp = client.namespace(sdev)
    x = xp.ones(3)
    for _ in range(2000):  # one flush of ~200 KB of ops' headers
        x = x + 1.0
    np.testing.assert_array_equal(x.numpy(), [2001.0] * 3)
    with_uploads = [xp.asarray(np.full(300, float(i))) + 1.0 for i in range(300)]
    got = xp.stack(with_uploads).numpy()
    np.testing.assert_array_equal(got, np.arange(1.0, 301.0)[:, None] * np.ones(300))


def test_many_frees_past_the_limit_are_cut(sdev: client.RemoteDevice) -> None:
    xp = client.namespace(sdev)
    handles = [xp.ones(1) for _ in range(20_000)]
    sdev.sync()
    del handles
    gc.collect()
    assert sdev.stats().tensors == 0  # every free arrived, in messages the server took
    np.testing.assert_array_equal(xp.ones(2).numpy(), [1.0, 1.0])
