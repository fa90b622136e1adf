"""The client's side of resuming, piece by piece: when it tries again (the backoff, its jitter
and bounds), what it keeps until the server has it (numbered messages, forgotten on
acknowledgement; a large upload acknowledged before its call returns; a sender that never
reads keeps a bounded number), and the options' checks.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable

import numpy as np
import pytest

import client
from client._connection import RETAINED_MOST
from client._pending import MAX_FREES
from client._resuming import BACKOFF_FACTOR, JITTER, Backoff, Retained
from protocol import Stats
from server.live import KEPT_MOST


def test_the_first_attempt_goes_at_once_then_the_waits_grow_to_their_bound() -> None:
    backoff = Backoff(attempts=12, timeout=30, first=0.05, most=2.0)
    delays = list(backoff.delays(random.Random(1)))
    assert len(delays) == 12 and delays[0] == 0.0
    nominal = 0.05
    for delay in delays[1:]:
        assert nominal * (1 - JITTER) <= delay <= nominal * (1 + JITTER)
        nominal = min(nominal * BACKOFF_FACTOR, 2.0)
    assert max(delays) <= 2.0 * (1 + JITTER)
    assert len(set(delays[1:])) == 11  # jittered: clients cut together spread out


def test_zero_attempts_turns_resuming_off() -> None:
    assert list(Backoff(attempts=0).delays()) == []


@pytest.mark.parametrize(
    "keywords",
    [
        {"reconnect_attempts": -1},
        {"reconnect_attempts": 1.5},
        {"reconnect_timeout": 0},
        {"reconnect_backoff": -0.1},
        {"reconnect_backoff": 1.0, "reconnect_backoff_max": 0.5},
    ],
)
def test_bounds_out_of_range_are_refused_before_connecting(keywords: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="reconnect_"):
        client.RemoteDevice("ws://127.0.0.1:1", **keywords)  # type: ignore[arg-type]


def test_kept_messages_are_forgotten_once_acknowledged() -> None:
    kept = Retained(keep=True)
    for number in range(1, 6):
        kept.add(number, f"message {number}")
    assert kept.ack(2) and not kept.ack(1)  # news once
    assert kept.since(3) == ["message 4", "message 5"] and len(kept) == 2
    off = Retained(keep=False)
    off.add(1, "message 1")
    assert len(off) == 0 and off.since(0) == []


@pytest.mark.server
def test_a_large_upload_is_acknowledged_before_its_call_returns(url: str) -> None:
    with client.RemoteDevice(url) as dev:
        conn = dev._conn  # noqa: SLF001 - what the connection keeps
        data = np.arange(1 << 20, dtype=np.float64)  # 8 MiB: sent before the call returns
        x = client.namespace(dev).asarray(data)
        assert conn._sent.acked == conn._batches  # noqa: SLF001 - the server has it all
        data[:] = -1  # the caller's memory is the caller's again
        assert np.array_equal(x.numpy(), np.arange(1 << 20, dtype=np.float64))


@pytest.mark.server
def test_a_sender_that_never_reads_keeps_a_bounded_number_of_messages(url: str) -> None:
    with client.RemoteDevice(url) as dev:
        conn = dev._conn  # noqa: SLF001
        x = client.namespace(dev).zeros(4)
        most = 0
        for _ in range(400):
            x += 1.0
            dev.flush()  # one message each, no read
            most = max(most, len(conn._sent))  # noqa: SLF001
        assert most <= RETAINED_MOST + 1, most
        assert np.array_equal(x.numpy(), np.full(4, 400.0))


def _within(seconds: float, work: Callable[[], None]) -> bool:
    """Whether ``work``, run in a daemon thread, returned within ``seconds``."""
    done = threading.Event()

    def run() -> None:
        work()
        done.set()

    threading.Thread(target=run, daemon=True).start()
    return done.wait(seconds)


@pytest.mark.server
def test_more_replies_unacknowledged_than_the_server_keeps_leave_senders_unblocked(
    url: str,
) -> None:
    """Past what the server keeps for a resumption (its outbox let go), it still
    acknowledges: a sender waiting for acknowledgements goes on."""
    with client.RemoteDevice(url) as dev:
        conn = dev._conn  # noqa: SLF001
        many = KEPT_MOST + 100
        replies = [conn.request(lambda rid: Stats(request_id=rid)) for _ in range(many)]
        for reply in replies:
            reply.result()
        xp = client.namespace(dev)
        kept: list[client.RemoteArray] = []

        def flushes() -> None:
            for _ in range(RETAINED_MOST + 16):
                kept.append(xp.ones(2))
                dev.flush()

        assert _within(10, flushes)


@pytest.mark.server
def test_a_large_upload_flushed_with_many_frees_returns(url: str) -> None:
    """A flush of more frees than one message holds splits: the upload is in the first."""
    with client.RemoteDevice(url) as dev:
        xp = client.namespace(dev)
        handles = [xp.ones(1) for _ in range(MAX_FREES + 1000)]
        handles[-1].numpy()
        del handles  # freed at the next flush: more than one message
        uploaded: list[client.RemoteArray] = []
        data = np.ones(1 << 19, dtype=np.float32)  # 2 MiB: waits for its acknowledgement
        assert _within(10, lambda: uploaded.append(xp.asarray(data)))
        assert np.array_equal(uploaded[0].numpy(), data)
