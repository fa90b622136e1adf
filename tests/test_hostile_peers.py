"""Pulls from peers that misbehave (issue 30): a real target server pulling from a malicious
peer (``tests/fake_peers.py``) allocates no more than the pull reserved; spellings of one
source share one kept session."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest

import client
from client.device import Device
from protocol import TensorMeta
from protocol.ops import Pull

from .fake_peers import fake_peer, lies_about_size, strays
from .servers import ServerProcess, run_server
from .test_hostile_memory import assert_within_budget, peak_growth

pytestmark = pytest.mark.server

LOOPBACK_PEERS = ("--peers", "ws://127.0.0.1:*")
MIB = 1 << 20
LIE = 256 * MIB  # what a lying peer declares for an 8-byte pull: 4x the target's budget
CAPABILITY = "A" * 43  # a fake peer takes any


def _pull(dev: Device, source: str, meta: TensorMeta, capability: str = CAPABILITY) -> Any:
    op = Pull(
        out=dev.new_id(), source=source, capability=capability, shape=meta.shape, dtype=meta.dtype
    )
    return dev.submit_unchecked(op, meta)


@contextmanager
def _target(*args: str) -> Iterator[ServerProcess]:
    budget = ("--memory-budget", "64MiB", "--session-quota", "32MiB")
    with run_server(*LOOPBACK_PEERS, *budget, *args) as proc:
        yield proc


@pytest.mark.parametrize("lie", [lies_about_size, strays], ids=["lies-about-size", "answers-none"])
def test_a_pull_allocates_no_more_than_it_reserved(lie: Any) -> None:
    """A peer that answers an 8-byte pull with a reply declaring 256 MiB (for the claim, or
    for no request at all) is refused once its reply's header is read: the target's peak RSS
    stays within its budget's bound, the pull fails as transfer_failed, and the session and
    its accounting go on as before."""
    with fake_peer(lie(LIE)) as peer, _target() as target, client.RemoteDevice(target.url) as b:
        baseline = b.stats()
        with peak_growth(target) as growth:
            pulled = _pull(b, peer.url, TensorMeta((1,), "float64"))
            with pytest.raises(client.TransferError) as refused:
                pulled.numpy()
        assert_within_budget(growth())
        assert refused.value.code == "transfer_failed", refused.value
        assert f"declares {LIE} bytes" in str(refused.value) and peer.url in str(refused.value)
        del pulled
        stats = b.stats()
        assert (stats.tensor_bytes, stats.server_tensor_bytes) == (
            baseline.tensor_bytes,
            baseline.server_tensor_bytes,
        )
        assert float(client.namespace(b).sum(client.namespace(b).ones(3)).numpy()) == 3.0


def _sessions(proc: ServerProcess) -> int:
    """The server's open sessions, counting the one that asks."""
    with client.RemoteDevice(proc.url) as probe:
        return probe.stats().connections


def test_spellings_of_one_port_share_one_kept_session() -> None:
    """Pulls that name one source with its port spelled eight ways (leading zeros, a slash)
    hold one session on it, not one per spelling."""
    with (
        run_server() as source,
        run_server(*LOOPBACK_PEERS) as target,
        client.RemoteDevice(source.url) as a,
        client.RemoteDevice(target.url) as b,
    ):
        port = source.url.rsplit(":", 1)[1]
        spellings = [f"ws://127.0.0.1:{'0' * zeros}{port}" for zeros in range(7)]
        spellings.append(f"{source.url}/")
        x = client.namespace(a).asarray(np.arange(4.0))
        for spelling in spellings:
            capability = a.expose(x.tensor_id, b.server_id).result().capability
            np.testing.assert_array_equal(_pull(b, spelling, x.meta, capability).numpy(), x.numpy())
        assert _sessions(source) == 3  # the probe, a, and the one the target keeps
