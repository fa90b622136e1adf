"""The client's own liveness (issue 17, finding 4): a server that stops answering (SIGSTOP) fails
a pending call with ``ServerNotResponding`` within the configured bounds, and every later call
too; a healthy server running a long op keeps its session, because it answers pings meanwhile.

Before the client had pings and a timeout, a read pending on a stopped server neither returned
nor raised (45 s in the issue's run). Small bounds here: ping every 0.2 s, give up after 1 s.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypedDict

import numpy as np
import pytest

import client
from client._liveness import Liveness, Traffic, Watch

from .polling import wait_until
from .servers import ServerProcess, run_server

pytestmark = [pytest.mark.serial, pytest.mark.wire]

HANG = 20.0  # a call still waiting after this long has hung: the test fails


class Pings(TypedDict):
    """``RemoteDevice``'s keyword arguments for its pings."""

    ping_interval: float | None
    ping_timeout: float | None


FAST: Pings = {"ping_interval": 0.2, "ping_timeout": 1.0}


@contextmanager
def stopped(server: ServerProcess) -> Iterator[None]:
    """The server process stopped (SIGSTOP) for the block, and always continued after it."""
    os.kill(server.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(server.pid, signal.SIGCONT)


def outcome(call: Callable[[], Any]) -> tuple[Any, float]:
    """What ``call`` returned or raised, run in a thread, and how long it took; still running
    after :data:`HANG` seconds fails the test (the thread is a daemon, left behind)."""
    done: list[Any] = []

    def run() -> None:
        try:
            done.append(call())
        except BaseException as exc:  # noqa: BLE001 - the outcome under test
            done.append(exc)

    started = time.monotonic()
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(HANG)
    assert done, f"the call still waits after {HANG} s"
    return done[0], time.monotonic() - started


def ready(dev: client.RemoteDevice) -> client.RemoteArray:
    """A tensor queued behind one read that came back: the session works."""
    xp = client.namespace(dev)
    x = xp.ones(3) + 1
    assert x.numpy().tolist() == [2.0, 2.0, 2.0]
    return x * 2


N = 2048  # products of an N x N matrix (32 MiB: more than a cache holds) with a vector


def product_seconds(url: str) -> float:
    """How long one product takes on the server now: 200 of them, timed through a read."""
    with client.RemoteDevice(url) as dev:
        xp = client.namespace(dev)
        a, v = xp.full((N, N), 1.0 / N), xp.ones(N)
        dev.sync()
        started = time.monotonic()
        probes = [a @ v for _ in range(200)]
        probes[-1].numpy()
        return (time.monotonic() - started) / len(probes)


def long_work(dev: client.RemoteDevice, seconds: float, each: float) -> client.RemoteArray:
    """Queue about ``seconds`` of work for the server's worker threads (products taking
    ``each`` seconds), using little memory, in at most 4 batches. BLAS lets go of the GIL
    meanwhile, as it does in any long matmul (numpy's LAPACK calls, ``det`` or ``inv``, do
    not: they stall the server's event loop). Returns the last product (ones), unread."""
    xp = client.namespace(dev)
    a, v = xp.full((N, N), 1.0 / N), xp.ones(N)
    for i in range(max(20, min(8000, round(seconds / each)))):
        product = a @ v
        if i % 2000 == 1999:
            dev.flush()  # its frees go with the next batch: two batches' products at most
    return product


def test_a_pending_read_fails_when_the_server_stops(server: ServerProcess) -> None:
    threads = threading.active_count()
    dev = client.RemoteDevice(server.url, **FAST)
    y = ready(dev)
    with stopped(server):
        error, took = outcome(y.numpy)
        assert isinstance(error, client.ServerNotResponding), error
        assert isinstance(error, client.ConnectionLost) and isinstance(error, TimeoutError)
        assert "did not answer a ping within 1 s (ping_timeout)" in str(error)
        assert 0.5 < took < 10, took  # a ping after 0.2 s of silence, unanswered for 1 s
        with pytest.raises(client.ServerNotResponding):
            client.namespace(dev).ones(3)  # every later call fails at once
        with pytest.raises(client.ServerNotResponding):
            dev.sync()
        _, took = outcome(dev.close)
        assert took < 2  # the socket was cut: nothing waits for the stopped server
    dev._conn._keeper.join(HANG)  # the keeper ended, and no other thread is left behind:
    wait_until(lambda: threading.active_count() == threads, "the client's threads to end", HANG)
    with client.RemoteDevice(server.url) as again:  # the server, continued, serves on
        assert ready(again).numpy().tolist() == [4.0, 4.0, 4.0]


def test_an_idle_session_finds_the_server_stopped(server: ServerProcess) -> None:
    dev = client.RemoteDevice(server.url, **FAST)
    ready(dev)
    with stopped(server):
        dev._conn._keeper.join(HANG)  # nobody waits: the keeper itself gives up on the server
        assert not dev._conn._keeper.is_alive()
        with pytest.raises(client.ServerNotResponding, match="ping"):
            client.namespace(dev).ones(3)
        dev.close()


def test_the_reply_timeout_bounds_a_read_without_pings(server: ServerProcess) -> None:
    dev = client.RemoteDevice(server.url, timeout=1.0, ping_interval=None)
    y = ready(dev)
    with stopped(server):
        error, took = outcome(y.numpy)
        assert isinstance(error, client.ServerNotResponding), error
        assert "no reply from the server within 1 s (timeout)" in str(error)
        assert 1.0 <= took < 10, took
        dev.close()


def test_the_reply_timeout_bounds_a_send_that_the_stopped_server_does_not_take(
    server: ServerProcess,
) -> None:
    """A send held up counts as no silence (a healthy server may have stopped reading this
    session), so pings cannot judge it; ``timeout`` bounds it."""
    dev = client.RemoteDevice(server.url, timeout=1.0, **FAST)
    ready(dev)
    data = np.zeros(8 * 2**20)  # 64 MiB: more than the socket buffers hold, sent at once
    with stopped(server):
        error, took = outcome(lambda: client.namespace(dev).asarray(data))
        assert isinstance(error, client.ServerNotResponding), error
        assert "took none of a message's bytes for 1 s (timeout)" in str(error)
        assert 1.0 <= took < 10, took
        dev.close()


def test_pings_keep_a_session_whose_server_runs_a_long_op(server: ServerProcess) -> None:
    """The server answers pings on its event loop while ops run in a worker thread: a read
    that waits for seconds of work, past the 0.85 s that an unanswered ping allows here, gets
    its value."""
    with client.RemoteDevice(server.url, ping_interval=0.1, ping_timeout=0.75) as dev:
        for seconds in (2.0, 4.0, 8.0):  # until a read waited long enough, however estimated
            value, took = outcome(long_work(dev, seconds, product_seconds(server.url)).numpy)
            assert not isinstance(value, BaseException), value
            np.testing.assert_allclose(value, np.ones(N))
            if took >= 1.0:
                break
        assert took >= 1.0
        pings = dev._conn._ws.pings
        assert pings >= 4, (pings, took)  # one at a time: each was answered during the wait
        assert client.namespace(dev).ones(2).numpy().tolist() == [1.0, 1.0]


def test_the_reply_timeout_bounds_a_long_op(server: ServerProcess) -> None:
    """``timeout`` bounds a call, however alive the server: past it the call fails."""
    for seconds in (3.0, 6.0, 12.0):  # until the work outlasts the timeout, however estimated
        each = product_seconds(server.url)
        with client.RemoteDevice(server.url, timeout=1.0, **FAST) as dev:
            error, took = outcome(long_work(dev, seconds, each).numpy)
        if isinstance(error, BaseException):
            break
    assert isinstance(error, client.ServerNotResponding), error
    assert "no reply from the server within 1 s (timeout)" in str(error)
    assert 1.0 <= took < 10, took


@pytest.mark.asyncio
async def test_an_async_read_fails_when_the_server_stops(server: ServerProcess) -> None:
    dev = await client.AsyncRemoteDevice.connect(server.url, **FAST)
    xp = client.namespace(dev)
    x = xp.ones(3) + 1
    assert (await dev.read(x)).tolist() == [2.0, 2.0, 2.0]
    with stopped(server):
        started = time.monotonic()
        with pytest.raises(client.ServerNotResponding, match="ping_timeout"):
            await asyncio.wait_for(dev.read(x * 2), HANG)
        assert time.monotonic() - started < 10
        with pytest.raises(client.ServerNotResponding):
            await dev.sync()
        await dev.aclose()


@pytest.mark.server
def test_pings_do_not_keep_an_idle_session_past_the_servers_idle_timeout() -> None:
    """The client's pings show that it is alive, not busy: the server still closes a session
    that sends no message for ``--idle-timeout``, and the client hears why."""
    with (
        run_server("--idle-timeout", "2") as server,
        client.RemoteDevice(server.url, **FAST) as dev,
    ):
        ready(dev)
        wait_until(lambda: dev._conn._error is not None, "the server to close the session", HANG)
        assert dev._conn._ws.pings >= 3  # answered meanwhile: one about every 0.3 s for 2 s
        with pytest.raises(client.ConnectionLost) as lost:
            dev.sync()
        assert lost.value.code == "idle_timeout"
        assert not isinstance(lost.value, client.ServerNotResponding)


@pytest.mark.parametrize(
    "bounds", [{"timeout": 0}, {"ping_interval": -1.0}, {"ping_timeout": float("nan")}]
)
def test_bounds_must_be_positive(url: str, bounds: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="positive number of seconds"):
        client.RemoteDevice(url, **bounds)


# --- the watch alone: what it concludes from what it is shown --------------------------------

BOUNDS = Liveness(ping_interval=1.0, ping_timeout=2.0, timeout=None)


def test_the_watch_pings_after_silence_and_gives_up_on_an_unanswered_ping() -> None:
    watch = Watch(BOUNDS, now=0.0)
    quiet = Traffic(received=10, sent=0, sending=False)
    assert watch.look(0.5, quiet, None) is None and not watch.ping_due(0.5)
    assert watch.look(1.6, quiet, None) is None and watch.ping_due(1.6)
    watch.pinged(1.6)
    assert not watch.ping_due(2.0)  # one ping at a time
    assert watch.look(3.5, quiet, None) is None
    assert "ping within 2 s" in (watch.look(3.6, quiet, None) or "")


def test_the_watch_counts_any_byte_as_an_answer() -> None:
    watch = Watch(BOUNDS, now=0.0)
    watch.look(1.0, Traffic(10, 0, False), None)
    watch.pinged(1.0)
    assert watch.look(2.9, Traffic(12, 0, False), None) is None  # the pong: 2 bytes
    assert watch.look(4.0, Traffic(12, 0, False), None) is None and watch.ping_due(4.0)


def test_the_watch_does_not_count_silence_while_the_server_may_not_read_us() -> None:
    """A send held up, or more messages unanswered than the server queues: a healthy server
    may have stopped reading this session (flow control), so silence proves nothing."""
    for held_up in (Traffic(10, 5, True), Traffic(10, 5, False, unanswered=9)):
        watch = Watch(BOUNDS, now=0.0)
        watch.look(1.5, Traffic(10, 0, False), None)
        watch.pinged(1.5)
        for now in (2.0, 5.0, 60.0):
            assert watch.look(now, held_up, None) is None
            assert not watch.ping_due(now)


def test_the_watch_times_a_wait_for_a_reply_and_a_stuck_send() -> None:
    bounds = Liveness(ping_interval=None, ping_timeout=None, timeout=5.0)
    watch = Watch(bounds, now=0.0)
    assert watch.look(4.0, Traffic(10, 0, False), waiting_since=0.0) is None
    assert "no reply" in (watch.look(5.0, Traffic(10, 0, False), waiting_since=0.0) or "")
    watch = Watch(bounds, now=0.0)
    for now in (1.0, 2.0, 6.0):  # the send lock held, no frame written since the look at 1.0
        reason = watch.look(now, Traffic(10, 100, True), None)
    assert reason is not None and "took none of a message's bytes for 5 s" in reason
    watch = Watch(bounds, now=0.0)
    for now, sent in ((1.0, 100), (4.0, 200), (8.0, 300)):  # a slow send that moves on
        assert watch.look(now, Traffic(10, sent, True), None) is None


def test_the_keeper_looks_often_enough_for_each_bound() -> None:
    assert Liveness().tick(poll=1.0) == 1.0  # the defaults leave the keeper's pace alone
    assert Liveness(ping_interval=0.2, ping_timeout=1.0).tick(poll=1.0) == pytest.approx(0.05)
    assert Liveness(ping_interval=None, ping_timeout=None, timeout=0.001).tick(1.0) == 0.01
