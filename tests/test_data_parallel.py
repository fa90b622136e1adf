"""Data-parallel training (issue 18): the ring all-reduce of ``client.parallel`` on real servers
and on devices of one server (the mean to 1e-12, the same bits on every replica), the
replicas' gradients those of the whole batch, and examples/train_data_parallel.py on two
servers against one server and numpy."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from types import ModuleType
from typing import Any

import array_api_strict
import numpy as np
import pytest

import client
from client import nn, optim
from client.autodiff import Autodiff
from client.parallel import DataParallel, Replica, all_reduce_mean

from .example_runs import imported, run_main
from .servers import ROOT, ServerProcess, run_server

TOKEN = "dp-token"  # noqa: S105 - a test's token
# the servers pull chunks from each other, on ports only known once they listen
LOOPBACK_PEERS = ("--peers", "ws://127.0.0.1:*", "--allow-any-peer-port")
EXAMPLE = ROOT / "examples" / "train_data_parallel.py"
HELD_OUT = 360  # digits held out by train_mlp.digits: one sample is 1/360 of the accuracy


@pytest.fixture(scope="module")
def servers() -> Iterator[list[ServerProcess]]:
    """Three servers, each its own process."""
    with ExitStack() as stack:
        yield [stack.enter_context(run_server("--token", TOKEN, *LOOPBACK_PEERS)) for _ in "abc"]


@pytest.fixture(scope="module")
def three_devices() -> Iterator[ServerProcess]:
    """One server with three devices."""
    with run_server("--token", TOKEN, "--device", "ndarray:3", *LOOPBACK_PEERS) as proc:
        yield proc


def _devices(stack: ExitStack, places: list[tuple[str, int]]) -> list[client.RemoteDevice]:
    return [stack.enter_context(client.RemoteDevice(u, i, token=TOKEN)) for u, i in places]


# --- the all-reduce ---------------------------------------------------------------------------
def _received(dev: client.RemoteDevice) -> int:
    return int(dev._conn._ws.received_bytes)  # noqa: SLF001 - the bytes that crossed the client


@pytest.mark.parametrize("count", [2, 3])
@pytest.mark.parametrize("layout", ["servers", "devices of one server"])
def test_all_reduce_gives_the_mean_with_the_same_bits_on_every_replica(
    count: int, layout: str, servers: list[ServerProcess], three_devices: ServerProcess
) -> None:
    """The mean, and a weighted mean, to 1e-12 of numpy's, the same bits on every replica;
    the chunks move server to server (or inside the server), not through the client; nothing
    is left behind on the servers."""
    rng = np.random.default_rng(count)
    inputs = [rng.standard_normal(100_001) for _ in range(count)]  # chunks of unequal lengths
    places = (
        [(proc.url, 0) for proc in servers[:count]]
        if layout == "servers"
        else [(three_devices.url, index) for index in range(count)]
    )
    with ExitStack() as stack:
        devices = _devices(stack, places)
        vectors = [client.namespace(d).asarray(v) for d, v in zip(devices, inputs, strict=True)]
        held = [d.stats().tensors for d in devices]
        weights = rng.dirichlet(np.ones(count))
        average = np.average(inputs, axis=0, weights=weights)
        for given, expected in [(None, np.mean(inputs, axis=0)), (list(weights), average)]:
            before = sum(_received(d) for d in devices)
            reduced = all_reduce_mean(vectors, given)
            for d in devices:
                d.sync()
            assert sum(_received(d) for d in devices) - before < inputs[0].nbytes // 8
            assert [r.device for r in reduced] == devices  # each stays on its replica
            values = [np.asarray(r) for r in reduced]
            np.testing.assert_allclose(values[0], expected, rtol=0, atol=1e-12)
            assert all(v.tobytes() == values[0].tobytes() for v in values[1:])
            del reduced
        assert [d.stats().tensors for d in devices] == held


def test_summing_in_each_replicas_own_order_would_not_give_the_same_bits() -> None:
    """What the bit-identity checks above guard against: three replicas each adding the three
    vectors from its own place in the ring disagree on these inputs (the ring computes each
    chunk's sum on one replica and copies it)."""
    rng = np.random.default_rng(3)
    a, b, c = (rng.standard_normal(1001) / 3 for _ in range(3))
    assert ((a + b) + c).tobytes() != ((b + c) + a).tobytes()


@pytest.mark.parametrize("count", [1, 2, 3, 4])
@pytest.mark.parametrize("length", [0, 2, 9])
def test_all_reduce_moves_arrays_only_by_to_device(count: int, length: int) -> None:
    """On array_api_strict's devices, which refuse any op mixing two of them: each replica's
    result stays on its device, with the same bits, even with empty chunks (length < count)."""
    devices = array_api_strict.__array_namespace_info__().devices()[:3]
    rng = np.random.default_rng(length)
    inputs = [rng.standard_normal(length) for _ in range(count)]
    vectors = [array_api_strict.asarray(v, device=devices[r % 3]) for r, v in enumerate(inputs)]
    reduced = all_reduce_mean(vectors)
    assert [r.device for r in reduced] == [v.device for v in vectors]
    cpu = devices[0]
    values = [np.asarray(r.to_device(cpu)) for r in reduced]
    np.testing.assert_allclose(values[0], np.mean(inputs, axis=0), rtol=0, atol=1e-12)
    assert all(v.tobytes() == values[0].tobytes() for v in values[1:])


def test_all_reduce_refuses_what_it_cannot_average() -> None:
    with pytest.raises(ValueError, match="no vectors"):
        all_reduce_mean([])
    with pytest.raises(ValueError, match="1-D of one length"):
        all_reduce_mean([np.zeros(3), np.zeros(4)])
    with pytest.raises(ValueError, match="1-D of one length"):
        all_reduce_mean([np.zeros((2, 2)), np.zeros((2, 2))])
    with pytest.raises(ValueError, match="1 weights for 2 vectors"):
        all_reduce_mean([np.zeros(3), np.zeros(3)], [1.0])


# --- the replicas, on numpy -------------------------------------------------------------------
def _model(ad: Autodiff, dtype: str = "float32") -> nn.Module:
    rng = np.random.default_rng(5)
    return nn.Sequential(
        nn.Linear(4, 8, ad=ad, rng=rng, dtype=dtype),
        nn.Tanh(),
        nn.Linear(8, 3, ad=ad, rng=rng, dtype=dtype),
    )


def _data(dtype: str = "float32") -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(6)
    return rng.standard_normal((10, 4)).astype(dtype), rng.integers(0, 3, 10)


def _shard_loss(x: np.ndarray, y: np.ndarray) -> Any:
    def loss(replica: Replica, rows: np.ndarray) -> Any:
        return nn.cross_entropy(replica.model(x[rows]), replica.namespace.asarray(y[rows]))

    return loss


def test_averaged_gradients_are_the_whole_batch_gradient_with_a_remainder() -> None:
    """10 rows on 3 replicas (shards of 4, 3 and 3), weighted by shard size: every replica gets
    the gradient of the whole batch's mean loss, the same bits on each."""
    x, y = _data("float64")
    spaces = [Autodiff(np) for _ in range(3)]
    dp = DataParallel(
        _model(spaces[0], "float64"),
        spaces,
        lambda ad: _model(ad, "float64"),
        lambda params: optim.SGD(params, lr=0.1),
    )
    batch = np.arange(10)
    shards = dp.split(batch)
    assert [len(s) for s in shards] == [4, 3, 3]
    for replica, shard in zip(dp.replicas, shards, strict=True):
        _shard_loss(x, y)(replica, shard).backward()
    dp.average_gradients([len(s) / len(batch) for s in shards])
    whole = _model(Autodiff(np), "float64")
    nn.cross_entropy(whole(x), y).backward()
    for name, _ in whole.named_parameters():
        got = [_grad(model, name) for model in dp.models]
        np.testing.assert_allclose(got[0], _grad(whole, name), rtol=0, atol=1e-12)
        assert all(g.tobytes() == got[0].tobytes() for g in got[1:])


def test_one_replica_trains_exactly_as_the_model_alone() -> None:
    x, y = _data()
    alone = _model(Autodiff(np))
    opt = optim.Adam(alone.parameters(), lr=0.05)
    space = Autodiff(np)
    dp = DataParallel(_model(space), [space], _model, lambda p: optim.Adam(p, lr=0.05))
    for step in range(5):
        rows = np.arange(10)[step % 2 :: 2]
        opt.zero_grad()
        nn.cross_entropy(alone(x[rows]), y[rows]).backward()
        opt.step()
        dp.step(_shard_loss(x, y), rows)
    for (name, mine), theirs in zip(
        alone.named_parameters(), dp.models[0].parameters(), strict=True
    ):
        assert mine.array.tobytes() == theirs.array.tobytes(), name


class _WithUnused(nn.Module):
    def __init__(self, ad: Autodiff) -> None:
        super().__init__()
        self.body = _model(ad)
        self.unused = nn.Linear(2, 2, ad=ad)  # no loss reaches it

    def forward(self, x: Any) -> Any:
        return self.body(x)


def _grad(model: nn.Module, name: str) -> np.ndarray:
    grad = dict(model.named_parameters())[name].grad
    assert grad is not None, name
    return np.asarray(grad.array)


def test_gradients_missing_on_some_replicas_count_as_zero_and_on_all_stay_missing() -> None:
    spaces = [Autodiff(np), Autodiff(np)]
    dp = DataParallel(_WithUnused(spaces[0]), spaces, _WithUnused, lambda p: optim.SGD(p, lr=0.1))
    x, _ = _data()
    for replica in dp.replicas:  # replica 1's loss does not reach the last layer
        layers = replica.model.body if replica.index == 0 else replica.model.body[:2]
        replica.namespace.sum(layers(x) ** 2).backward()
    last = _grad(dp.models[0], "body.2.weight")
    dp.average_gradients()
    for model in dp.models:
        assert _grad(model, "body.2.weight").tobytes() == (last * np.float32(0.5)).tobytes()
        assert dict(model.named_parameters())["unused.weight"].grad is None


def test_diverged_names_a_parameter_one_bit_off_and_split_refuses_a_short_batch() -> None:
    spaces = [Autodiff(np), Autodiff(np)]
    dp = DataParallel(_model(spaces[0]), spaces, _model, lambda p: optim.SGD(p, lr=0.1))
    assert dp.models[0] is not dp.models[1] and dp.diverged() == []
    bias = dict(dp.models[1].named_parameters())["2.bias"].array
    bias.view(np.uint32)[1] ^= 1  # the replicas' memory is their own: replica 0 keeps its bit
    assert dp.diverged() == ["2.bias"]
    with pytest.raises(ValueError, match="a batch of 1 rows cannot be split among 2 replicas"):
        dp.split(np.arange(1))


# --- the example ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def example() -> Iterator[ModuleType]:
    """examples/train_data_parallel.py imported (it imports train_mlp beside it)."""
    with imported("train_data_parallel") as module:
        yield module


def _epochs(lines: list[str]) -> list[str]:
    return [line for line in lines if line.startswith("epoch")]


def _accuracy(lines: list[str]) -> float:
    (line,) = [line for line in lines if line.startswith("held-out accuracy")]
    return float(line.split()[-1])


@pytest.mark.e2e
def test_example_on_two_servers_reaches_one_servers_accuracy_with_identical_replicas(
    example: ModuleType,
    servers: list[ServerProcess],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """As a user runs it, on two servers: the goal reached, the replicas bit-identical. The same
    epochs as two numpy replicas, number for number (the same numpy ops). Against one server,
    whose gradient is not split in two and summed, so rounds differently: "the same held-out
    accuracy" is within one held-out sample (measured: equal, in every epoch)."""
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    common = ("--epochs", "10", "--token-file", str(token))
    two = subprocess.run(
        [
            sys.executable,
            str(EXAMPLE),
            "--url",
            servers[0].url,
            "--url",
            servers[1].url,
            *common,
            "--plot",
            str(tmp_path / "two.png"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert two.returncode == 0, two.stdout + two.stderr
    lines = two.stdout.splitlines()
    assert lines[0].startswith(f"training on {servers[0].url} device 0 (server ")
    assert "replicas bit-identical: yes, all 6 parameters" in lines
    assert _accuracy(lines) >= 0.95
    assert (tmp_path / "two.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    one_status, one, _ = run_main(
        example, capsys, "--url", servers[2].url, *common, "--plot", str(tmp_path / "one.png")
    )
    assert one_status == 0
    assert abs(_accuracy(one) - _accuracy(lines)) <= 1 / HELD_OUT
    local_status, local, _ = run_main(
        example,
        capsys,
        "--local",
        "--replicas",
        "2",
        "--epochs",
        "10",
        "--plot",
        str(tmp_path / "local.png"),
    )
    assert local_status == 0
    assert _epochs(local) == _epochs(lines) and len(_epochs(lines)) == 10


def test_example_on_three_devices_of_one_server_trains_as_three_numpy_replicas(
    example: ModuleType,
    three_devices: ServerProcess,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two epochs (exit 1: short of the goal), the same epochs as on numpy."""
    monkeypatch.setenv("TENSOR_SERVER_TOKEN", TOKEN)
    plot = str(tmp_path / "c.png")
    status, lines, err = run_main(
        example,
        capsys,
        "--url",
        three_devices.url,
        "--epochs",
        "2",
        "--devices-per-server",
        "3",
        "--plot",
        plot,
    )
    assert status == 1, err
    assert lines[0].count(f"{three_devices.url} device ") == 3
    assert "replicas bit-identical: yes, all 6 parameters" in lines
    assert _accuracy(lines) < 0.95
    _, local, _ = run_main(
        example, capsys, "--local", "--replicas", "3", "--epochs", "2", "--plot", plot
    )
    assert _epochs(lines) == _epochs(local) and len(_epochs(local)) == 2


def test_example_with_one_replica_is_train_mlp_exactly(
    example: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plot = str(tmp_path / "p.png")
    status, lines, _ = run_main(
        example, capsys, "--local", "--replicas", "1", "--epochs", "3", "--plot", plot
    )
    assert status == 1  # three epochs are short of the goal
    assert lines[0] == "training on 1 numpy replica"
    train_mlp = sys.modules["train_mlp"]
    assert train_mlp.main(["--local", "--epochs", "3", "--plot", plot]) == 1
    assert _epochs(lines) == _epochs(capsys.readouterr().out.splitlines())


def test_example_exits_1_when_the_replicas_differ(
    example: ModuleType,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(example, "GOAL", 0.0)  # the accuracy passes: only the replicas fail
    monkeypatch.setattr(DataParallel, "diverged", lambda self: ["0.bias"])
    status, lines, _ = run_main(
        example, capsys, "--local", "--epochs", "1", "--plot", str(tmp_path / "p.png")
    )
    assert status == 1
    assert "replicas bit-identical: no, 0.bias differ" in lines


def test_example_refuses_an_unreachable_or_refusing_server_in_one_line(
    example: ModuleType,
    servers: list[ServerProcess],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Exit 2 and one line, before any training: not a traceback, not 1."""
    monkeypatch.delenv("TENSOR_SERVER_TOKEN", raising=False)
    monkeypatch.delenv("TENSOR_SERVER_TOKEN_FILE", raising=False)
    plot, token = str(tmp_path / "p.png"), tmp_path / "token"
    token.write_text(TOKEN)
    for args, says in [
        (
            ["--url", servers[0].url, "--url", "ws://127.0.0.1:1", "--token-file", str(token)],
            "ConnectionLost",
        ),
        (["--url", servers[0].url], "AuthenticationError"),  # no token
        (["--url", "http://127.0.0.1:1"], "DeviceSpecError: unknown device spec"),
        (["--local", "--plot", str(tmp_path / "missing" / "p.png")], "no such directory"),
    ]:
        status, lines, err = run_main(example, capsys, "--epochs", "1", "--plot", plot, *args)
        assert status == 2, lines
        assert err.startswith("train_data_parallel.py: ") and err.count("\n") == 1
        assert says in err
