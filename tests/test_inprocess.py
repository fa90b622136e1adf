"""The real serving code on a real loopback socket, in this process, so tests can look inside."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest
from anyio.from_thread import start_blocking_portal

import client
from bench.training import DIGITS, Trainer
from client._connection import FLUSH_OPS
from client.autodiff import Autodiff
from server import Server, ServerConfig
from server.connection import Connections

from .polling import wait_until


@contextmanager
def _serving(config: ServerConfig) -> Iterator[Server]:
    srv = Server(config)
    with start_blocking_portal(backend="asyncio") as portal:
        future, _ = portal.start_task(srv.serve)
        yield srv
        future.cancel()


@pytest.fixture
def live() -> Iterator[Server]:
    with _serving(ServerConfig(port=0)) as srv:
        yield srv


def _freed_without_the_collector(srv: Server, work: Callable[[client.RemoteDevice], None]) -> None:
    """Run ``work`` in a session of ``srv`` with the garbage collector off: once the session
    has ended, it must be freed all the same (no collection may free what only one would)."""
    gc.collect()
    gc.disable()
    try:
        with client.RemoteDevice(f"ws://127.0.0.1:{srv.port}") as dev:
            work(dev)
            (session,) = srv.sessions.values()
            ended = weakref.ref(session)
            del session
        wait_until(lambda: not srv.sessions, "the session to end")
        wait_until(lambda: ended() is None, "the ended session to be freed")
    finally:
        gc.enable()


def test_size_threshold_flushes_without_a_read(live: Server) -> None:
    with client.RemoteDevice(f"ws://127.0.0.1:{live.port}") as dev:
        xp = client.namespace(dev)
        x = xp.zeros(4)
        for _ in range(FLUSH_OPS + 10):
            x = x + 1
        (session,) = live.sessions.values()
        wait_until(lambda: session.ops_run >= FLUSH_OPS, "ops to arrive with no read or sync")
        assert x.numpy().tolist() == [FLUSH_OPS + 10.0] * 4


def test_session_end_frees_everything(live: Server) -> None:
    dev = client.RemoteDevice(f"ws://127.0.0.1:{live.port}")
    xp = client.namespace(dev)
    kept = [xp.asarray(np.ones(1000)) for _ in range(10)]
    dev.sync()
    (session,) = live.sessions.values()
    assert len(session.store) == 10 and session.store.nbytes == 80_000
    dev.close()
    wait_until(lambda: not live.sessions, "the session to end")
    assert len(session.store) == 0 and session.store.nbytes == 0
    del kept
    gc.collect()  # handles outliving their device free nothing and raise nothing


def test_an_ended_session_goes_without_the_garbage_collector(live: Server) -> None:
    """The server collects garbage rarely (``server/__main__.py``), and not when a connection
    is lost: what an ended session held (its tensors, failures, registered segments) must go
    by reference counting alone, so no session object may be part of a reference cycle."""

    def work(dev: client.RemoteDevice) -> None:
        xp = client.namespace(dev)
        Trainer(Autodiff(xp), DIGITS, 256).run(6)  # repeating steps: replayed as a segment
        with pytest.raises(client.RemoteError):
            xp.linalg.inv(xp.zeros((3, 3))).numpy()  # a failure record
        assert dev.segment_stats().hits > 0

    _freed_without_the_collector(live, work)


@pytest.mark.inprocess
def test_a_session_whose_expose_failed_goes_without_the_garbage_collector() -> None:
    """A refused expose's error is kept to answer the request: it may not hold the frames
    that refused it (they hold the session) in a reference cycle with the batch that holds it.
    """

    def work(dev: client.RemoteDevice) -> None:
        x = client.namespace(dev).asarray(np.ones(100_000))  # 800 KB of a 1 MiB quota
        with pytest.raises(client.RemoteError, match="quota"):
            dev.expose(x.tensor_id, "feed").result()

    with _serving(ServerConfig(port=0, session_quota=1 << 20)) as srv:
        _freed_without_the_collector(srv, work)


def test_frees_travel_with_the_next_batch(live: Server) -> None:
    with client.RemoteDevice(f"ws://127.0.0.1:{live.port}") as dev:
        xp = client.namespace(dev)
        a = xp.ones(10)
        dev.sync()
        (session,) = live.sessions.values()
        assert len(session.store) == 1
        del a
        gc.collect()
        assert len(session.store) == 1  # not sent on its own
        dev.sync()
        assert len(session.store) == 0


def test_a_replayed_step_runs_on_the_loop_only_while_its_connection_is_alone(
    live: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A training step replayed as one segment (cost over INLINE_COST, under
    INLINE_GRAPH_COST) runs on the event loop while its connection is the server's only one,
    and in a worker thread once another is open (bench/REASONS.md, 'Small graphs inline')."""
    hops: list[object] = []
    off_loop = Connections._off_loop

    async def counted(self: Connections, session: Any, job: Any) -> None:
        hops.append(job)
        await off_loop(self, session, job)

    monkeypatch.setattr(Connections, "_off_loop", counted)
    url = f"ws://127.0.0.1:{live.port}"
    with client.RemoteDevice(url) as dev:
        trainer = Trainer(Autodiff(client.namespace(dev)), DIGITS, 4 * DIGITS.batch)
        trainer.run(6)
        assert dev.segment_stats().hits >= 2
        hops.clear()
        trainer.run(3)
        assert hops == []
        with client.RemoteDevice(url) as other:
            other.sync()
            trainer.run(3)
            assert len(hops) >= 3
        wait_until(lambda: len(live.sessions) == 1, "the other session to end")
        hops.clear()
        trainer.run(3)
        assert hops == []  # alone again
