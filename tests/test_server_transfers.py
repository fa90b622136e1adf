"""Direct transfers (issue 18): ``x.to_device(dev)`` between two real servers on loopback moves
the bytes server to server, never through the client; between two devices of one server it is a
copy in memory; capabilities are single-use, bound to one server, expire, and are refused
clearly; a source that is gone fails the pulled tensor, and nothing leaks on either server."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import client
from client.device import Device
from protocol import DTYPES, TensorMeta, to_numpy
from protocol.ops import Pull

from .polling import wait_until
from .servers import ServerProcess, run_server

LOOPBACK_PEERS = ("--peers", "ws://127.0.0.1:*", "--allow-any-peer-port")
MIB = 1 << 20


@pytest.fixture(scope="module")
def source() -> Iterator[ServerProcess]:
    with run_server("--device", "ndarray:2", *LOOPBACK_PEERS) as proc:
        yield proc


@pytest.fixture(scope="module")
def target() -> Iterator[ServerProcess]:
    with run_server(*LOOPBACK_PEERS) as proc:
        yield proc


@pytest.fixture
def devs(source: ServerProcess, target: ServerProcess) -> Iterator[tuple[Any, Any]]:
    with client.RemoteDevice(source.url) as a, client.RemoteDevice(target.url) as b:
        yield a, b


def _received(dev: client.RemoteDevice) -> int:
    return int(dev._conn._ws.received_bytes)  # noqa: SLF001 - the bytes that crossed the client


def _values(dtype: str, shape: tuple[int, ...]) -> np.ndarray[Any, Any]:
    rng = np.random.default_rng(7)
    raw = rng.standard_normal(shape) * 100
    if dtype.startswith("complex"):
        raw = raw + 1j * rng.standard_normal(shape)
    return np.asarray(raw).astype(to_numpy(dtype))  # type: ignore[arg-type]


@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize("shape", [(), (0,), (3, 0, 2), (257, 3)])
def test_every_dtype_and_shape_moves_server_to_server(
    devs: tuple[client.RemoteDevice, client.RemoteDevice], dtype: str, shape: tuple[int, ...]
) -> None:
    a, b = devs
    expected = _values(dtype, shape)
    x = client.namespace(a).asarray(expected)
    y = x.to_device(b)
    assert y.device is b and y.shape == shape and y.dtype == expected.dtype
    np.testing.assert_array_equal(y.numpy(), expected)


def test_the_bytes_never_cross_the_client(
    devs: tuple[client.RemoteDevice, client.RemoteDevice],
) -> None:
    a, b = devs
    xp = client.namespace(a)
    x = xp.ones((4 * MIB,), dtype=xp.float64)  # 32 MiB made on the source
    a.sync()
    before = _received(a), _received(b)
    y = x.to_device(b)
    total = client.namespace(b).sum(y)  # used on the target, then one number read back
    assert float(total.numpy()) == 4 * MIB
    crossed = _received(a) - before[0] + _received(b) - before[1]
    assert crossed < 4096, crossed  # an expose reply and one read of 8 bytes: no tensor


def test_views_and_values_as_exposed(devs: tuple[client.RemoteDevice, client.RemoteDevice]) -> None:
    a, b = devs
    xp = client.namespace(a)
    base = xp.reshape(xp.arange(24, dtype=xp.int32), (4, 6))
    np.testing.assert_array_equal(base.T.to_device(b).numpy(), np.arange(24).reshape(4, 6).T)
    wide = xp.broadcast_to(xp.asarray([1.5]), (1000, 64))  # 8 bytes held, 512 KB exposed
    np.testing.assert_array_equal(wide.to_device(b).numpy(), np.full((1000, 64), 1.5))
    x = xp.zeros(6)
    head = x[:3]  # a view of x's memory
    y = x.to_device(b)  # exposed, and the pull queued on b, but b is not read yet
    x[0] = 99.0  # written on the source after the expose: the copy is the value before
    head[1] = 98.0  # and through another view of the same memory
    del x, head  # and freed: the exposure keeps the bytes until they are claimed
    a.sync()  # all of that has run on the source before the target claims
    np.testing.assert_array_equal(y.numpy(), np.zeros(6))


def test_a_small_view_of_a_large_tensor_keeps_only_its_own_bytes(
    source: ServerProcess, target: ServerProcess
) -> None:
    with client.RemoteDevice(source.url) as a, client.RemoteDevice(target.url) as b:
        xp = client.namespace(a)
        big = xp.arange(4 * MIB // 8, dtype=xp.float64)  # 4 MiB
        corner = big[:4]
        a.sync()
        held = a.stats().server_tensor_bytes
        capability = a.expose(corner.tensor_id, b.server_id).result().capability
        assert a.stats().server_tensor_bytes == held + 32  # a compact copy, not the 4 MiB base
        del big, corner
        assert a.stats().server_tensor_bytes == held + 32 - 4 * MIB  # the base is freed
        pulled = _pull(b, capability, source.url, TensorMeta((4,), "float64"))
        np.testing.assert_array_equal(pulled.numpy(), np.arange(4.0))


def test_two_devices_of_one_server_copy_in_memory(source: ServerProcess) -> None:
    # The target server here is the source itself, which pulls over no network: its --peers
    # name only 127.0.0.1 ports, and a same-server pull names no source at all.
    with client.RemoteDevice(source.url, 0) as d0, client.RemoteDevice(source.url, 1) as d1:
        x = client.namespace(d0).asarray(np.arange(10.0))
        sent: list[Any] = []
        submit = d1.submit
        d1.submit = lambda op: sent.append(op) or submit(op)  # type: ignore[func-returns-value]
        y = x.to_device(d1)
        assert isinstance(sent[0], Pull) and sent[0].source is None
        np.testing.assert_array_equal(y.numpy(), np.arange(10.0))


def _pull(dev: Device, capability: str, source: str | None, meta: TensorMeta) -> Any:
    op = Pull(
        out=dev.new_id(), source=source, capability=capability, shape=meta.shape, dtype=meta.dtype
    )
    return dev.submit_unchecked(op, meta)


def test_a_capability_works_once_for_its_server(
    devs: tuple[client.RemoteDevice, client.RemoteDevice], source: ServerProcess
) -> None:
    a, b = devs
    x = client.namespace(a).asarray(np.arange(6.0))
    capability = a.expose(x.tensor_id, b.server_id).result().capability
    first = _pull(b, capability, source.url, x.meta)
    again = _pull(b, capability, source.url, x.meta)
    np.testing.assert_array_equal(first.numpy(), np.arange(6.0))
    with pytest.raises(client.TransferError, match="already used") as used:
        again.numpy()
    assert used.value.code == "capability_refused" and source.url in str(used.value)
    elsewhere = a.expose(x.tensor_id, "0123456789abcdef").result().capability
    with pytest.raises(client.TransferError, match="bound to server 0123456789abcdef"):
        _pull(b, elsewhere, source.url, x.meta).numpy()
    with pytest.raises(client.TransferError, match="unknown to this server"):
        _pull(b, "A" * 43, source.url, x.meta).numpy()
    wrong = a.expose(x.tensor_id, b.server_id).result().capability
    with pytest.raises(client.TransferError, match="int64 of shape"):
        _pull(b, wrong, source.url, TensorMeta((6,), "int64")).numpy()
    assert float(client.namespace(b).sum(first).numpy()) == 15.0  # the session goes on


@pytest.mark.server
def test_a_capability_expires_and_its_bytes_come_back_unclaimed() -> None:
    with run_server("--transfer-ttl", "0.3") as proc, client.RemoteDevice(proc.url, 0) as a:
        with client.RemoteDevice(proc.url, 0) as b:
            x = client.namespace(a).ones(MIB // 8)
            a.sync()
            held = a.stats().server_tensor_bytes
            capability = a.expose(x.tensor_id, b.server_id).result().capability
            forgotten = a.expose(x.tensor_id, b.server_id).result().capability  # never claimed
            assert a.stats().server_tensor_bytes == held + 2 * MIB
            time.sleep(0.6)
            with pytest.raises(client.TransferError, match="expired"):
                _pull(b, capability, None, x.meta).numpy()
            wait_until(lambda: a.stats().server_tensor_bytes == held, "the expired bytes back")
            with pytest.raises(client.TransferError, match="expired"):
                _pull(b, forgotten, None, x.meta).numpy()


def test_a_capability_of_a_closed_session_is_withdrawn(source: ServerProcess) -> None:
    with client.RemoteDevice(source.url, 1) as b:
        alone = b.stats().connections
        with client.RemoteDevice(source.url, 0) as a:
            x = client.namespace(a).ones(3)
            capability = a.expose(x.tensor_id, b.server_id).result().capability
        wait_until(lambda: b.stats().connections == alone, "the server closed the session")
        with pytest.raises(client.TransferError, match="withdrawn: its session closed"):
            _pull(b, capability, None, x.meta).numpy()


def test_a_server_pulls_only_from_its_peers(source: ServerProcess) -> None:
    with run_server("--peers", "ws://10.0.0.1:8765") as lonely:
        with client.RemoteDevice(source.url) as a, client.RemoteDevice(lonely.url) as b:
            y = client.namespace(a).ones(4).to_device(b)
            with pytest.raises(client.TransferError, match="no credentials for ws://127") as e:
                y.numpy()
            assert e.value.code == "transfer_failed"
            stats = b.stats()
            assert (stats.tensor_bytes, stats.server_tensor_bytes) == (0, 0)  # nothing reserved


@pytest.mark.server
def test_servers_authenticate_to_each_other_with_their_token() -> None:
    token = {"TENSOR_SERVER_TOKEN": "s3cret-shared"}
    with (
        run_server(*LOOPBACK_PEERS, env=token) as first,
        run_server(*LOOPBACK_PEERS, env=token) as second,
        run_server(*LOOPBACK_PEERS) as tokenless,
    ):
        with (
            client.RemoteDevice(first.url, token="s3cret-shared") as a,
            client.RemoteDevice(second.url, token="s3cret-shared") as b,
            client.RemoteDevice(tokenless.url) as c,
        ):
            x = client.namespace(a).asarray(np.arange(3))
            np.testing.assert_array_equal(x.to_device(b).numpy(), np.arange(3))
            with pytest.raises(client.TransferError, match=f"{first.url} refused") as e:
                x.to_device(c).numpy()  # c has no credentials that first accepts
            assert "auth" in str(e.value).lower() or "401" in str(e.value)


@pytest.mark.parametrize("warm", [False, True], ids=["connecting", "claim-sent"])
def test_a_source_lost_midway_fails_the_pull_and_nothing_leaks(
    target: ServerProcess, warm: bool
) -> None:
    with (
        run_server(*LOOPBACK_PEERS) as doomed,
        client.RemoteDevice(target.url) as b,
    ):
        baseline = b.stats()
        a = client.RemoteDevice(doomed.url, ping_timeout=None)
        xp = client.namespace(a)
        if warm:  # the target's session with the source is open: the claim itself is lost
            np.testing.assert_array_equal(xp.ones(2).to_device(b).numpy(), np.ones(2))
            baseline = b.stats()
        x = xp.asarray(np.arange(1000.0))
        capability = a.expose(x.tensor_id, b.server_id).result().capability
        os.kill(doomed.pid, signal.SIGSTOP)  # the source stops answering
        y = _pull(b, capability, doomed.url, x.meta)
        b.flush()
        time.sleep(0.5)
        os.kill(doomed.pid, signal.SIGKILL)  # ... and then gone
        with pytest.raises(client.TransferError, match=doomed.url) as e:
            y.numpy()
        assert e.value.code == "transfer_failed"
        z = client.namespace(b).asarray(np.ones(2))
        assert float(client.namespace(b).sum(z).numpy()) == 2.0  # the session goes on
        del y, z
        stats = b.stats()
        assert (stats.tensor_bytes, stats.server_tensor_bytes) == (
            baseline.tensor_bytes,
            baseline.server_tensor_bytes,
        )


@pytest.mark.server
def test_servers_over_tls_verify_each_other(tmp_path: Any) -> None:
    import trustme

    ca = trustme.CA()
    ca.issue_cert("127.0.0.1").private_key_and_cert_chain_pem.write_to_path(tmp_path / "s.pem")
    ca.cert_pem.write_to_path(tmp_path / "ca.pem")
    tls = ("--tls-cert", str(tmp_path / "s.pem"), "--tls-key", str(tmp_path / "s.pem"))
    peers = ("--peers", "wss://127.0.0.1:*")
    trusting = ("--peer-ca-file", str(tmp_path / "ca.pem"))
    with (
        run_server(*tls, *peers) as source,
        run_server(*peers, *trusting) as trusts,
        run_server(*peers) as doubts,  # the system's CAs: not this one
    ):
        ca_file = str(tmp_path / "ca.pem")
        with (
            client.RemoteDevice(source.url, ca_file=ca_file) as a,
            client.RemoteDevice(trusts.url) as b,
            client.RemoteDevice(doubts.url) as c,
        ):
            x = client.namespace(a).asarray(np.arange(300_000.0))  # fragments over TLS
            np.testing.assert_array_equal(x.to_device(b).numpy(), np.arange(300_000.0))
            with pytest.raises(client.TransferError, match="CERTIFICATE_VERIFY_FAILED") as e:
                x.to_device(c).numpy()
            assert source.url in str(e.value)


def test_exposures_are_counted_until_claimed_or_withdrawn(target: ServerProcess) -> None:
    with (
        run_server(*LOOPBACK_PEERS) as source,  # its own: budget figures of no other test
        client.RemoteDevice(source.url) as a,
        client.RemoteDevice(target.url) as b,
    ):
        _counted_until_claimed_or_withdrawn(a, b, source)


def _counted_until_claimed_or_withdrawn(
    a: client.RemoteDevice, b: client.RemoteDevice, source: ServerProcess
) -> None:
    x = client.namespace(a).ones(MIB // 8)  # 1 MiB
    held = a.stats().server_tensor_bytes
    capability = a.expose(x.tensor_id, b.server_id).result().capability
    assert a.stats().server_tensor_bytes == held + MIB  # the exposure, until claimed
    y = _pull(b, capability, source.url, x.meta)
    b.sync()
    assert a.stats().server_tensor_bytes == held
    del y
    with client.RemoteDevice(source.url) as leaving:
        z = client.namespace(leaving).ones(MIB // 8)
        leaving.expose(z.tensor_id, b.server_id).result()  # never claimed
        assert leaving.stats().server_tensor_bytes == held + 2 * MIB
    for _ in range(100):  # the session's close withdraws it
        if a.stats().server_tensor_bytes == held:
            break
        time.sleep(0.05)
    assert a.stats().server_tensor_bytes == held


def test_the_in_process_device_moves_through_the_client(
    devs: tuple[client.RemoteDevice, client.RemoteDevice],
) -> None:
    _, b = devs
    local = client.open_device("ndarray")
    x = client.namespace(local).asarray(np.arange(4))
    np.testing.assert_array_equal(x.to_device(b).numpy(), np.arange(4))
    np.testing.assert_array_equal(
        client.namespace(b).asarray(np.arange(3)).to_device(local).numpy(), np.arange(3)
    )


PATTERNS = "ws://tensorwire-*.tensorwire:8765,ws://127.0.0.1:*"


@pytest.mark.parametrize(
    ("source", "allowed"),
    [
        ("ws://tensorwire-0.tensorwire:8765", True),
        ("ws://TENSORWIRE-1.tensorwire:8765/", True),
        ("ws://127.0.0.1:5555", True),
        # a user name, a path, another label under a wildcard, another port or scheme: never
        ("ws://tensorwire-a@evil.example:80/.tensorwire:8765", False),
        ("ws://tensorwire-0.evil.tensorwire:8765", False),
        ("ws://127.0.0.1:5555/x", False),
        ("ws://127.0.0.1:5555?x=1", False),
        ("ws://tensorwire-1.tensorwire:8766", False),
        ("wss://127.0.0.1:5555", False),
        ("ws://tensorwire-*.tensorwire:8765", False),
    ],
)
def test_peers_match_scheme_host_labels_and_port_only(source: str, allowed: bool) -> None:
    from server.config import ServerConfig
    from server.peers import PeerFetcher

    assert PeerFetcher(ServerConfig(peers=PATTERNS)).allows(source) is allowed


@pytest.mark.parametrize("pattern", ["ws://a@b:1", "ws://b:1/path", "http://b:1", "ws://b:1?q"])
def test_a_peer_pattern_with_more_than_scheme_host_and_port_is_refused(pattern: str) -> None:
    from pydantic import ValidationError

    from server.config import ServerConfig

    with pytest.raises(ValidationError):
        ServerConfig(peers=pattern)


@pytest.mark.server
def test_a_peer_token_of_its_own() -> None:
    with (
        run_server(*LOOPBACK_PEERS, env={"TENSOR_SERVER_TOKEN": "source-token"}) as source,
        run_server(
            *LOOPBACK_PEERS, "--token", "target-token", "--peer-token", "source-token"
        ) as target,
        client.RemoteDevice(source.url, token="source-token") as a,
        client.RemoteDevice(target.url, token="target-token") as b,
    ):
        x = client.namespace(a).asarray(np.arange(5))
        np.testing.assert_array_equal(x.to_device(b).numpy(), np.arange(5))


@pytest.mark.server
def test_a_kept_session_the_source_closed_is_renewed() -> None:
    with (
        run_server(*LOOPBACK_PEERS, "--idle-timeout", "1") as source,
        run_server(*LOOPBACK_PEERS) as target,
        client.RemoteDevice(target.url) as b,
    ):
        for value in (1.0, 2.0):  # the second after the source closed every idle session
            if value == 2.0:
                wait_until(lambda: _sessions(source) == 1, "the source to close the idle ones")
            with client.RemoteDevice(source.url) as a:
                x = client.namespace(a).full(2, value)
                np.testing.assert_array_equal(x.to_device(b).numpy(), np.full(2, value))


def _sessions(proc: ServerProcess) -> int:
    """The server's open sessions, counting the one that asks."""
    with client.RemoteDevice(proc.url) as probe:
        return probe.stats().connections


@pytest.mark.server
def test_the_peer_token_is_hidden_in_check_config() -> None:
    import subprocess
    import sys

    shown = subprocess.run(
        [sys.executable, "-m", "server", "--peer-token", "s3cret-peer", "--check-config"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert "s3cret-peer" not in shown and '"peer_token": "<hidden>"' in shown


@pytest.mark.parametrize(
    "source", ["ws://3232235777:8765", "ws://0x7f.0.0.1:8765", "ws://127.0.0.01:8765"]
)
def test_hosts_a_resolver_reads_as_other_addresses_never_match(source: str) -> None:
    from server.peer_urls import PeerPatterns

    assert (
        PeerPatterns(("ws://*:8765", "ws://*.*.*.*:8765", "ws://0x7f.*.*.*:8765")).match(source)
        is None
    )
    assert PeerPatterns(("ws://*.*.*.*:8765",)).match("ws://10.1.2.3:8765") is not None


def test_spellings_of_one_peer_share_one_session() -> None:
    from server.peer_urls import PeerPatterns, canonical

    peers = PeerPatterns(("ws://tensorwire-*.tensorwire:8765", "ws://*.*:*"))
    spellings = [
        "ws://TeNsorwire-0.tensorwire:8765",
        "ws://tensorwire-0.tensorwire:8765/",
        "ws://tensorwire-0.tensorwire:08765",
        "ws://tensorwire-0.tensorwire:000000000000008765/",
    ]
    keys = {canonical(parts) for parts in map(peers.match, spellings) if parts is not None}
    assert keys == {"ws://tensorwire-0.tensorwire:8765"}
    for other in ("ws://tensorwire-0.tensorwire:74301", "ws://tensorwire-0.:8765", "ws://a..b:1"):
        assert peers.match(other) is None  # a port past 65535, an empty label: no peer URL
