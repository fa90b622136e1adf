"""Messages answered in the wire's callback while the session's task waits (server/answering.py),
through a real server: the same replies, in the same order, counted in the same metrics, as
those the task answers; what the callback cannot finish goes on in the task."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from anyio.from_thread import start_blocking_portal
from websockets.exceptions import ConnectionClosed

import client
from protocol import Batch, Read, Stats, Sync, encode
from protocol.ops import Full
from server import Server, ServerConfig, answering
from server.outcome import Job
from server.session import Reply, Session

from .ops_helpers import metrics, value
from .polling import wait_until
from .raw import TOKEN, Raw, RawSocket
from .servers import ServerProcess, run_server

pytestmark = pytest.mark.wire


@pytest.fixture(scope="module")
def counted() -> Iterator[ServerProcess]:
    with run_server("--metrics-auth", "none") as proc:
        yield proc


def _replies_in_order(dev: client.RemoteDevice, xp: client.Namespace) -> list[Any]:
    """Reads pipelined over batches that each path answers: small reads (the callback), a
    read over MOST_REPLY_BYTES and a batch with a matmul too costly for the loop (the task)."""
    small = xp.asarray(np.arange(8.0))
    large = xp.asarray(np.arange(float(answering.MOST_REPLY_BYTES // 8 + 1)))
    a = xp.asarray(np.eye(300) * 2.0)
    pending = [dev.submit_read(small.tensor_id)]
    pending.append(dev.submit_read(large.tensor_id))
    product = a @ a  # 300**3 element operations: a worker thread's, not the loop's
    pending.append(dev.submit_read(product.tensor_id))
    doubled = small * 2.0  # one cheap op with its read: answered where it arrives
    pending.append(dev.submit_read(doubled.tensor_id))
    pending.append(dev.submit_read(small.tensor_id))
    return [future.result(timeout=30) for future in pending]


def test_replies_keep_their_order_and_values_across_both_paths(
    dev: client.RemoteDevice, xp: client.Namespace
) -> None:
    for _ in range(3):
        got = _replies_in_order(dev, xp)
        small = np.arange(8.0)
        assert np.array_equal(got[0], small) and np.array_equal(got[4], small)
        assert np.array_equal(got[1], np.arange(float(answering.MOST_REPLY_BYTES // 8 + 1)))
        assert np.array_equal(got[2], np.eye(300) * 4.0)
        assert np.array_equal(got[3], small * 2.0)
    stats = dev.stats()
    assert stats.failed == 0


def test_reads_answered_in_the_callback_are_counted(counted: ServerProcess) -> None:
    with client.RemoteDevice(counted.url) as dev:
        x = client.namespace(dev).asarray(np.arange(16, dtype=np.float32))
        dev.sync()
        before = metrics(counted.port)
        for _ in range(50):
            x.numpy()
        after = metrics(counted.port)
    reads = value(after, "tensorwire_read_seconds_count") - value(
        before, "tensorwire_read_seconds_count"
    )
    assert reads == 50
    sent = value(after, "tensorwire_sent_bytes_total") - value(
        before, "tensorwire_sent_bytes_total"
    )
    assert sent >= 50 * 64  # each reply carries the tensor's 64 bytes
    received = value(after, "tensorwire_received_bytes_total") - value(
        before, "tensorwire_received_bytes_total"
    )
    assert received > 50 * 16  # each read is a message of a header at least


def test_a_cheap_op_and_its_read_are_answered_where_they_arrive(counted: ServerProcess) -> None:
    """Each loop step sends one batch (an add and a read): answered in the callback; a batch
    with an op too costly for the loop, and a large read, are not."""
    with client.RemoteDevice(counted.url) as dev:
        xp = client.namespace(dev)
        x = xp.asarray(np.ones(4))
        assert float(x[0]) == 1.0  # the upload confirmed, with a stats request (client._known)
        before = value(metrics(counted.port), "tensorwire_answered_on_arrival_total")
        for i in range(20):
            x = x + 1.0
            assert float(x[0]) == 2.0 + i
        middle = value(metrics(counted.port), "tensorwire_answered_on_arrival_total")
        a = xp.asarray(np.eye(300))
        dev.sync()  # the upload and its sync: answered on arrival too
        start = value(metrics(counted.port), "tensorwire_answered_on_arrival_total")
        assert float(xp.sum(a @ a)) == 300.0  # a worker thread's op: the task's
        large = xp.zeros(answering.MOST_REPLY_BYTES // 8 + 1)
        assert large.numpy().sum() == 0  # a reply over MOST_REPLY_BYTES: the task's
        end = value(metrics(counted.port), "tensorwire_answered_on_arrival_total")
    assert middle - before == 20
    assert end == start


@pytest.fixture(scope="module")
def impatient() -> Iterator[ServerProcess]:
    args = (
        "--token",
        TOKEN,
        "--send-timeout",
        "1",
        "--idle-timeout",
        "30",
        "--write-limit",
        "1KiB",
        "--log-level",
        "INFO",
    )
    with run_server(*args) as proc:
        yield proc


def _dropped_for_not_reading(proc: ServerProcess, messages: list[bytes]) -> None:
    """Send ``messages`` from a client that never reads, then stay silent: the server drops it
    for its send timeout (1 s; the idle timeout is 30 s), and its tensors are freed."""
    sock = RawSocket(proc.url)
    sock.hello()
    for message in messages:
        sock.frame(message)
    with client.RemoteDevice(proc.url, token=TOKEN) as probe:
        wait_until(lambda: probe.stats().connections == 1, "the drop after --send-timeout", 10)
        assert probe.stats().server_tensor_bytes == 0
    sock.vanish()
    assert "send_timeout: the client took no reply" in proc.stderr.text()


def test_many_small_replies_to_a_client_that_does_not_read_are_timed(
    impatient: ServerProcess,
) -> None:
    """One batch of 100 000 syncs: megabytes of small replies, sent by the task under the send
    timeout (more than MOST_REPLIES replies are never answered on arrival)."""
    syncs = Batch(requests=[Sync(request_id=i) for i in range(100_000)])
    _dropped_for_not_reading(impatient, [b"".join(encode(syncs))])


def test_reads_answered_on_arrival_to_a_client_that_does_not_read_are_timed(
    impatient: ServerProcess,
) -> None:
    """Reads answered on arrival (each under MOST_REPLY_BYTES) until the socket takes no more:
    the client is still dropped for its send timeout, whichever path meets the full socket."""
    size = answering.MOST_REPLY_BYTES // 8 - 64
    create = Batch(ops=[Full(out=1, shape=(size,), dtype="float64", value=1.0)])
    reads = [Batch(requests=[Read(request_id=i, tensor=1)]) for i in range(400)]  # 25 MiB
    _dropped_for_not_reading(impatient, [b"".join(encode(b)) for b in (create, *reads)])


@pytest.mark.inprocess
def test_an_exception_while_answering_on_arrival_closes_as_in_the_task(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A bug raised where the message arrived is raised again in the session's task, so the
    connection closes with 1011 (internal error) and the handler's log, as before."""
    real_finish = Session.finish

    def finish(self: Session, job: Job) -> list[Reply]:
        if any(isinstance(r, Stats) for r in job.batch.requests):
            raise RuntimeError("a bug")
        return real_finish(self, job)

    monkeypatch.setattr(Session, "finish", finish)
    srv = Server(ServerConfig(port=0))
    with start_blocking_portal(backend="asyncio") as portal:
        future, _ = portal.start_task(srv.serve)
        raw = Raw(f"ws://127.0.0.1:{srv.port}", token=None)
        raw.send(Batch(requests=[Sync(request_id=1)]))
        assert raw.recv() is not None  # answered on arrival, normally
        raw.send(Batch(requests=[Stats(request_id=2)]))
        with pytest.raises(ConnectionClosed) as info:
            raw.recv()
        assert info.value.rcvd is not None and info.value.rcvd.code == 1011
        future.cancel()
