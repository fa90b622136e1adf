"""Messages answered in the wire's callback while the session's task waits (server/answering.py),
through a real server: the same replies, in the same order, counted in the same metrics, as
those the task answers; what the callback cannot finish goes on in the task."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import client
from server import answering

from .ops_helpers import metrics, value
from .servers import ServerProcess, run_server


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
        dev.sync()
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
