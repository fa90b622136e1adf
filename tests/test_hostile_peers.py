"""Pulls from peers that misbehave (issue 30): a real target server pulling from a malicious
peer (``bench/fake_peers.py``) allocates no more than the pull reserved; spellings of one
source share one kept session; a peer of another protocol version is refused at once; a
silent peer holds no worker thread that other sessions' ops need; and a server with a token
names its peers' ports unless its operator accepts the risk."""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

import numpy as np
import pytest
from anyio.from_thread import start_blocking_portal

import client
import server
from bench.fake_peers import (
    Claims,
    fake_peer,
    lies_about_size,
    refused_as_v1,
    silent,
    strays,
    welcome,
)
from client.device import Device
from protocol import PROTOCOL_VERSION, TensorMeta
from protocol.ops import Pull
from server import Server, ServerConfig

from .servers import ServerProcess, run_server
from .test_hostile_memory import assert_within_budget, peak_growth

pytestmark = pytest.mark.server

LOOPBACK_PEERS = ("--peers", "ws://127.0.0.1:*", "--allow-any-peer-port")
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
def test_a_pull_allocates_no_more_than_it_reserved(lie: Callable[[int], Claims]) -> None:
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


def test_a_failed_pull_leaves_no_reference_cycle() -> None:
    """The server collects garbage rarely (``server/__main__.py``): a failed pull's error may
    not keep the pull's frames alive in a cycle (the claim's future held the error, whose
    traceback held the frames that held the future: the pull's and the reply's own
    ``result``), nor what they hold."""
    srv = Server(ServerConfig(port=0, peers=("ws://127.0.0.1:*",), allow_any_peer_port=True))
    with fake_peer(lies_about_size(LIE)) as peer, start_blocking_portal("asyncio") as portal:
        future, _ = portal.start_task(srv.serve)
        with client.RemoteDevice(f"ws://127.0.0.1:{srv.port}") as dev:
            for _ in range(3):
                with pytest.raises(client.TransferError):
                    _pull(dev, peer.url, TensorMeta((1,), "float64")).numpy()
        gc.collect()
        gc.set_debug(gc.DEBUG_SAVEALL)
        try:
            with client.RemoteDevice(f"ws://127.0.0.1:{srv.port}") as dev:
                with pytest.raises(client.TransferError):
                    _pull(dev, peer.url, TensorMeta((1,), "float64")).numpy()
            gc.collect()
            frames = [o.f_code.co_filename for o in gc.garbage if type(o) is FrameType]
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
        future.cancel()
    server_dir = str(Path(server.__file__).parent)
    assert not [f for f in frames if f.startswith(server_dir)], frames


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


@pytest.mark.parametrize(
    "answer", [refused_as_v1(), welcome(version=3)], ids=["v1-refuses", "v3-welcomes"]
)
def test_a_peer_of_another_protocol_version_is_refused_at_once(answer: bytes) -> None:
    """A source that speaks another version fails the pull at its hello, within a second and
    naming both versions: no claim is sent, nothing waits for one."""
    with (
        fake_peer(silent, answer) as peer,
        _target() as target,
        client.RemoteDevice(target.url) as b,
    ):
        started = time.monotonic()
        pulled = _pull(b, peer.url, TensorMeta((2,), "float64"))
        with pytest.raises(client.TransferError) as refused:
            pulled.numpy()
        took = time.monotonic() - started
        message = str(refused.value)
        assert refused.value.code == "transfer_failed" and peer.url in message
        assert "speaks protocol v" in message and f"speaks v{PROTOCOL_VERSION}" in message, message
        assert "--peer-token" not in message  # not a matter of credentials
        assert peer.claims == 0
        assert took < 2.0, took


@pytest.mark.serial
def test_a_silent_peer_holds_no_worker_that_ops_need() -> None:
    """A pull from a peer that never answers its claim (but answers pings) waits, up to its
    bound, without the worker thread that other sessions' heavy ops run in: with one worker,
    another session's matmul is answered meanwhile; the pull fails once the peer goes, and
    the ops its batch holds after it run then."""
    with (
        _target("--worker-threads", "1") as target,
        client.RemoteDevice(target.url) as waiting,
        client.RemoteDevice(target.url, timeout=20) as other,
    ):
        with fake_peer(silent) as peer:
            pulled = _pull(waiting, peer.url, TensorMeta((2,), "float64"))
            after = client.namespace(waiting).ones((300, 300))
            after = after @ after  # in the pull's batch: a heavy op behind it
            waiting.flush()
            deadline = time.monotonic() + 10
            while peer.claims == 0 and time.monotonic() < deadline:
                time.sleep(0.02)
            assert peer.claims == 1  # the pull waits for its reply
            xp = client.namespace(other)
            x = xp.ones((400, 400))
            started = time.monotonic()
            assert float((x @ x)[0, 0].numpy()) == 400.0  # over the cost the loop runs inline
            took = time.monotonic() - started
            assert took < 5.0, took
        with pytest.raises(client.TransferError, match="cut off"):
            pulled.numpy()  # the peer went
        assert float(after[0, 0].numpy()) == 300.0


def test_the_ops_after_a_pull_in_its_batch_run_in_process() -> None:
    """The in-process device runs a batch as the server does, a pull in a step of its own
    (it fails there: no server to pull from), and the ops after it in the next."""
    dev = client.open_device("ndarray")
    pulled = _pull(dev, "ws://127.0.0.1:1", TensorMeta((2,), "float64"))
    after = client.namespace(dev).ones(3) + 1  # in the pull's batch
    np.testing.assert_array_equal(after.numpy(), np.full(3, 2.0))
    with pytest.raises(client.TransferError, match="client's process"):
        pulled.numpy()


def test_a_peer_token_goes_to_any_port_only_when_the_operator_says_so(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A server with a token refuses to start with a --peers pattern of any port (a client
    could have it present its peer token to any listener on that host) unless
    --allow-any-peer-port says so, and then warns; a named port, or no token, is fine."""
    from server.__main__ import build_server

    any_port = ["--token", "t", "--peers", "ws://127.0.0.1:*"]
    with pytest.raises(SystemExit) as refused:
        build_server(any_port)
    assert refused.value.code == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert "any port matches" in line and "--allow-any-peer-port" in line
    (warning,) = build_server([*any_port, "--allow-any-peer-port"]).warnings
    assert warning.startswith("--peers ws://127.0.0.1:*: any port matches")
    assert build_server(["--token", "t", "--peers", "ws://127.0.0.1:8765"]).warnings == []
    assert build_server(["--peers", "ws://127.0.0.1:*"]).warnings == []  # no token to send
