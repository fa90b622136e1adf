"""The cutting proxy of the fault tests (``bench/cutting_proxy.py``), against a plain echo
server: bytes arrive intact until the cut, the cut lands at the offset drawn from the seed
(inside the range, mid-chunk), it is a reset, and the counts add up."""

from __future__ import annotations

import errno
import random
import socket
import threading
import time
from collections.abc import Iterator

import numpy as np
import pytest

from bench.cutting_proxy import CuttingProxy

pytestmark = pytest.mark.inprocess
MIB = 1 << 20


@pytest.fixture
def echo() -> Iterator[tuple[str, int]]:
    """A loopback server that sends back whatever it receives, one thread per connection."""
    listener = socket.create_server(("127.0.0.1", 0))

    def serve(conn: socket.socket) -> None:
        with conn:
            try:
                while data := conn.recv(MIB):
                    conn.sendall(data)
            except OSError:
                pass

    def accept() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    yield listener.getsockname()
    listener.close()


def _exchange(port: int, payload: bytes) -> tuple[bytes, BaseException | None]:
    """Send ``payload`` to ``port`` from a thread while reading what comes back; what came
    back and the error that ended the exchange, if any: the kernel reports a reset to one
    call only, the reader's or the sender's, whichever asks first."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    received = bytearray()
    errors: list[BaseException] = []

    def send() -> None:
        try:
            sock.sendall(payload)
            sock.shutdown(socket.SHUT_WR)
        except OSError as exc:
            errors.append(exc)

    sender = threading.Thread(target=send)
    sender.start()
    try:
        while data := sock.recv(MIB):
            received += data
    except OSError as exc:
        errors.append(exc)
    sender.join()
    sock.close()
    resets = [e for e in errors if isinstance(e, ConnectionResetError)]
    return bytes(received), (resets or errors or [None])[0]


def _reset(error: BaseException | None) -> bool:
    """Whether ``error`` says the connection was reset: the call the kernel told
    (``ECONNRESET``), or the other one, which then finds it gone (``EPIPE``, ``ENOTCONN``)."""
    gone = (errno.ECONNRESET, errno.EPIPE, errno.ENOTCONN)
    return isinstance(error, OSError) and error.errno in gone


def _payload(size: int) -> bytes:
    return np.random.default_rng(1).integers(0, 256, size, dtype=np.uint8).tobytes()


def test_without_a_policy_every_byte_arrives_intact(echo: tuple[str, int]) -> None:
    payload = _payload(64 * MIB)
    with CuttingProxy(echo) as proxy:
        received, error = _exchange(proxy.port, payload)
    assert error is None and received == payload
    assert proxy.bytes_up == proxy.bytes_down == len(payload)
    assert proxy.cuts == 0 and proxy.connections == 1


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_cut_by_bytes_lands_at_the_drawn_offset_as_a_reset(
    echo: tuple[str, int], seed: int
) -> None:
    payload = _payload(4 * MIB)
    span = (100_000, 3 * MIB)
    with CuttingProxy(echo, after_bytes=span, seed=seed) as proxy:
        received, error = _exchange(proxy.port, payload)
    offset = random.Random(seed).randint(*span)  # the proxy's first draw
    assert _reset(error), error
    assert proxy.cuts == 1
    assert proxy.bytes_up + proxy.bytes_down == offset
    assert len(received) <= proxy.bytes_down  # a reset may discard what was not read
    assert received == payload[: len(received)]


def test_both_directions_count_towards_the_cut(echo: tuple[str, int]) -> None:
    with CuttingProxy(echo, after_bytes=(10_500, 10_500)) as proxy:
        sock = socket.create_connection(("127.0.0.1", proxy.port), timeout=5)
        echoed = 0
        with pytest.raises(ConnectionResetError):
            for _ in range(20):  # 1000 bytes up, 1000 back: the sixth goes half way up
                sock.sendall(b"m" * 1000)
                want = echoed + 1000
                while echoed < want:
                    data = sock.recv(want - echoed)
                    if not data:
                        raise AssertionError("an orderly end, not a cut")
                    echoed += len(data)
        sock.close()
    assert (proxy.bytes_up, proxy.bytes_down, echoed) == (5500, 5000, 5000)
    assert proxy.cuts == 1


def test_every_connection_is_cut_on_the_timer_until_cutting_stops(
    echo: tuple[str, int],
) -> None:
    with CuttingProxy(echo, every=(0.2, 0.3), seed=4) as proxy:
        sock = socket.create_connection(("127.0.0.1", proxy.port), timeout=5)
        start = time.monotonic()
        with pytest.raises(ConnectionResetError):
            while sock.recv(10):  # nothing was sent: only the cut ends this
                pass
        assert time.monotonic() - start < 1.0 and proxy.cuts == 1
        sock.close()
        proxy.cutting = False
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as sock:
            time.sleep(0.8)  # several periods
            sock.sendall(b"x" * 100)
            assert sock.recv(1000) == b"x" * 100
        assert proxy.cuts == 1 and proxy.connections == 2


def test_after_max_cuts_connections_pass_intact(echo: tuple[str, int]) -> None:
    payload = _payload(MIB)
    with CuttingProxy(echo, after_bytes=(1000, 2000), max_cuts=3) as proxy:
        outcomes = [_exchange(proxy.port, payload) for _ in range(4)]
    resets = [_reset(error) for _, error in outcomes]
    assert resets == [True] * 3 + [False] and outcomes[-1][1] is None
    assert outcomes[-1][0] == payload
    assert proxy.cuts == 3 and not proxy.cutting


def test_a_blackhole_cut_stops_forwarding_and_keeps_the_connection_open(
    echo: tuple[str, int],
) -> None:
    with CuttingProxy(echo, after_bytes=(500, 500), mode="blackhole") as proxy:
        sock = socket.create_connection(("127.0.0.1", proxy.port), timeout=0.5)
        sock.sendall(b"a" * 400)
        assert sock.recv(1000) == b"a" * 100  # 400 up, then 100 of the echo: 500
        sock.sendall(b"b" * 100)
        with pytest.raises(TimeoutError):  # neither an answer nor a reset: silence
            sock.recv(1000)
        assert proxy.cuts == 1
    sock.settimeout(5)
    with pytest.raises(ConnectionResetError):  # the proxy closed: now it ends
        while sock.recv(1000):
            pass
    sock.close()
