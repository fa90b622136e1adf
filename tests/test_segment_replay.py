"""Segment replay (client/_segments.py, server/segments.py) through a real server: everything a
stream of ops does one by one, it does replayed, bit for bit — the numbers, the errors (type
and text) at the same reads, views and in-place updates, frees, failed tensors — on the
training examples' steps and on randomised op streams; and the switch, the bound on registered
segments and a refused registration."""

from __future__ import annotations

import gc
import random
import socket
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import client
from client import _segments
from client.autodiff import Autodiff
from client.errors import RemoteError

from .older_servers import without_feature
from .servers import run_server

pytestmark = pytest.mark.server

Outcome = tuple[str, Any]  # ("value", (dtype, shape, bytes)) or ("error", (type, text))


@pytest.fixture(autouse=True)
def short_segments(monkeypatch: pytest.MonkeyPatch) -> None:
    """Segments of any length are replayed here (by default, only from MIN_OPS ops on): the
    streams below are short, to make each case plain."""
    monkeypatch.setattr(_segments, "MIN_OPS", 1)


def _read(array: Any) -> Outcome:
    try:
        values = array.numpy()
    except RemoteError as exc:
        return ("error", (type(exc).__name__, str(exc)))
    return ("value", (str(values.dtype), values.shape, values.tobytes()))


def _pair(url: str) -> tuple[client.RemoteDevice, client.RemoteDevice]:
    return (
        client.RemoteDevice(url, segment_replay=False),
        client.RemoteDevice(url, segment_replay=True),
    )


# --- the training examples' steps ---------------------------------------------------------------


def test_digits_mlp_steps_are_bit_identical(url: str) -> None:
    from bench.training import DIGITS, Trainer

    off, on = _pair(url)
    with off, on:
        trainers = [Trainer(Autodiff(client.namespace(d)), DIGITS, 256) for d in (off, on)]
        for trainer in trainers:
            trainer.run(10)
        assert trainers[0].losses == trainers[1].losses
        for a, b in zip(trainers[0].net.parameters(), trainers[1].net.parameters(), strict=True):
            assert a.array.numpy().tobytes() == b.array.numpy().tobytes()
        stats = on.segment_stats()
        assert stats.hits >= 5 and stats.registered >= 1, stats
        assert off.segment_stats().hits == 0
        assert _held(on) == _held(off)


def _held(dev: client.RemoteDevice) -> tuple[int, int, int]:
    """The session's tensors, their bytes and its failed ones, once every dropped handle is
    freed (a read's error holds its frame, and so a handle, until the collector runs)."""
    gc.collect()
    stats = dev.stats()
    return stats.tensors, stats.tensor_bytes, stats.failed


def test_a_scheduled_learning_rate_is_replayed(url: str) -> None:
    """A cosine schedule writes the device's learning rate before every step (a ``full`` of
    a new value): the steps still replay, that value a parameter of each run."""
    from bench.training import DIGITS, Trainer
    from client import optim

    def train(dev: client.RemoteDevice) -> tuple[list[float], list[bytes]]:
        trainer = Trainer(Autodiff(client.namespace(dev)), DIGITS, 256)
        schedule = optim.CosineAnnealingLR(trainer.opt, T_max=7)
        for _ in range(12):
            trainer.run(1)
            schedule.step()
        return trainer.losses, [p.array.numpy().tobytes() for p in trainer.net.parameters()]

    off, on = _pair(url)
    with off, on:
        assert train(on) == train(off)
        stats = on.segment_stats()
        assert stats.hits >= 6 and stats.registered == 1, stats


def test_cnn_steps_are_bit_identical(url: str) -> None:
    from client import nn, optim

    def steps(dev: client.RemoteDevice) -> tuple[list[float], list[bytes]]:
        ad = Autodiff(client.namespace(dev))
        rng = np.random.default_rng(3)
        x = ad.asarray(rng.standard_normal((8, 1, 8, 8)).astype(np.float32))
        y = ad.asarray(rng.integers(0, 3, 8))
        init = np.random.default_rng(4)
        net = nn.Sequential(
            nn.Conv2d(1, 4, 3, ad=ad, rng=init),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Linear(36, 3, ad=ad, rng=init),
        )
        opt = optim.Adam(net.parameters(), lr=1e-2)
        losses = []
        for _ in range(6):
            loss = nn.cross_entropy(net(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(float(loss))
        return losses, [p.array.numpy().tobytes() for p in net.parameters()]

    off, on = _pair(url)
    with off, on:
        assert steps(off) == steps(on)
        assert on.segment_stats().hits >= 2, on.segment_stats()


# --- randomised op streams ---------------------------------------------------------------------

SHAPE = (4, 4)
NAMES = ("a", "b", "c", "d", "e")


def _instruction(rng: random.Random) -> tuple[Any, ...]:
    """One step of a stream, on variables named in NAMES (each a (4, 4) float64 array, a
    view of one, or a failed tensor)."""
    kind = rng.choice(
        ["binary", "scalar", "view", "inplace", "setitem", "inv", "free", "upload", "unary", "fill"]
    )
    x, y, z = (rng.choice(NAMES) for _ in range(3))
    if kind == "binary":
        return (kind, x, y, z, rng.choice(["add", "multiply", "subtract", "matmul"]))
    if kind == "scalar":
        return (kind, x, y, rng.choice([0.5, 2, -0.0, 0.0, 1.5, True]))
    if kind == "view":
        return (kind, x, y, rng.choice(["T", "flip", "all"]))
    if kind == "inplace":
        return (kind, x, y, rng.choice(["add", "scale"]))
    if kind == "setitem":
        return (kind, x, y, rng.choice([0, 1, 2]))
    if kind == "upload":
        return (kind, x, rng.randrange(3))
    if kind == "unary":
        return (kind, x, y, rng.choice(["exp", "sqrt", "negative"]))
    return (kind, x, y)


def _data(seed: int) -> np.ndarray[Any, Any]:
    values = np.random.default_rng(seed).standard_normal(SHAPE)
    if seed == 2:
        values[:, 0] = 0.0  # singular: inv of it fails on the server
    return values


def _apply(xp: Any, env: dict[str, Any], step: tuple[Any, ...], number: int) -> None:
    """Apply ``step`` in segment ``number`` (a fill's value changes with it, as a learning
    rate a schedule writes does)."""
    kind, x = step[0], step[1]
    if kind == "fill":
        if env.get(x) is not None and number % 2:
            env[x][...] = xp.full(SHAPE, 0.25 * number - 1.0)  # written into, as an optimizer's
        else:
            env[x] = xp.full(SHAPE, 1.5 / (number + 1))
        return
    if kind == "upload":
        env[x] = xp.asarray(_data(step[2]))
        return
    if kind == "free":
        env[x] = None
        return
    y = env[step[2]] if step[2] in env and env[step[2]] is not None else None
    if y is None:
        return
    if kind == "binary":
        z = env.get(step[3])
        if z is not None:
            env[x] = getattr(xp, step[4])(y, z)
    elif kind == "scalar":
        env[x] = y * step[3]
    elif kind == "unary":
        env[x] = getattr(xp, step[3])(y)
    elif kind == "view":
        env[x] = {"T": lambda: y.T, "flip": lambda: y[::-1], "all": lambda: y[...]}[step[3]]()
    elif kind == "inv":
        env[x] = xp.linalg.inv(y)
    elif kind == "inplace" and env.get(x) is not None:
        if step[3] == "add":
            env[x] += y
        else:
            env[x] *= 0.5
    elif kind == "setitem" and env.get(x) is not None:
        env[x][step[3] : step[3] + 2] = y[1:3]


def _stream(seed: int) -> list[list[tuple[Any, ...]]]:
    """Segments: a few templates, each repeated several times in a row, between new ones."""
    rng = random.Random(seed)
    templates = [[_instruction(rng) for _ in range(rng.randrange(3, 12))] for _ in range(3)]
    segments: list[list[tuple[Any, ...]]] = []
    for _ in range(8):
        if rng.random() < 0.3:
            segments.append([_instruction(rng) for _ in range(rng.randrange(1, 10))])
        else:
            segments += [rng.choice(templates)] * rng.randrange(2, 6)
    return segments


def _run(dev: client.RemoteDevice, segments: list[list[tuple[Any, ...]]]) -> list[Outcome]:
    xp = client.namespace(dev)
    env: dict[str, Any] = {name: xp.asarray(_data(n)) for n, name in enumerate(NAMES)}
    seen: list[Outcome] = []
    for number, segment in enumerate(segments):
        for step in segment:
            _apply(xp, env, step, number)
        live = [name for name in NAMES if env.get(name) is not None]
        if live:
            seen.append(_read(env[live[number % len(live)]]))
    seen += [_read(env[name]) for name in NAMES if env.get(name) is not None]
    seen.append(("stats", _held(dev)))
    return seen


@pytest.mark.parametrize("seed", range(12))
def test_random_streams_are_bit_identical(url: str, seed: int) -> None:
    segments = _stream(seed)
    off, on = _pair(url)
    with off, on:
        direct = _run(off, segments)
        replayed = _run(on, segments)
        assert replayed == direct
        if seed == 0:
            assert on.segment_stats().hits > 0, on.segment_stats()


def test_streams_replay_and_fail_somewhere(url: str) -> None:
    """The property test above exercises what it claims: hits, errors read, and replayed
    segments whose fill values changed from run to run."""
    hits = errors = varied = 0
    for seed in range(12):
        with client.RemoteDevice(url) as dev:
            errors += sum(kind == "error" for kind, _ in _run(dev, _stream(seed)))
            hits += dev.segment_stats().hits
        varied += any(s[0] == "fill" for segment in _stream(seed) for s in segment)
    assert hits > 20 and errors > 0 and varied > 3, (hits, errors, varied)


# --- errors -------------------------------------------------------------------------------------


def _inverting(dev: client.RemoteDevice, singular_at: set[int]) -> list[Outcome]:
    """A repeated step that inverts a matrix, singular in the steps ``singular_at``: the
    registered plan fails at the inversion, and the ops after it run as they would alone."""
    xp = client.namespace(dev)
    a = xp.asarray(_data(0))
    seen = []
    for step in range(10):
        m = a * (0.0 if step in singular_at else 1.0)
        inverse = xp.linalg.inv(m)
        total = xp.sum(inverse + a)
        other = a * 2.0
        seen += [_read(total), _read(other)]
    return seen


def test_an_error_in_a_replayed_segment_is_the_one_alone(url: str) -> None:
    off, on = _pair(url)
    with off, on:
        assert _inverting(on, {6, 7}) == _inverting(off, {6, 7})
        assert on.segment_stats().hits >= 4
    with client.RemoteDevice(url) as dev:
        kinds = [kind for kind, _ in _inverting(dev, {6})]
        assert kinds.count("error") == 1
    with client.RemoteDevice(url) as dev:
        seen = _inverting(dev, {6})
        error = seen[12][1]
        assert error[0] == "RemoteError" and "inv(#" in error[1], error


def test_a_failed_input_fails_the_same_ops(url: str) -> None:
    """A segment whose input is a failed tensor: the ops that read it inherit its failure,
    the others run."""

    def run(dev: client.RemoteDevice) -> list[Outcome]:
        xp = client.namespace(dev)
        good, bad = xp.asarray(_data(0)), xp.linalg.inv(xp.asarray(_data(2)))
        seen = []
        for step in range(9):
            x = bad if step == 6 else good
            y = x * 2.0
            z = good + 1.0
            seen += [_read(y), _read(z)]
        return seen

    off, on = _pair(url)
    with off, on:
        assert run(on) == run(off)
        assert on.segment_stats().hits >= 3


# --- switches and bounds ------------------------------------------------------------------------


def _repeat(dev: client.RemoteDevice, times: int = 6, shapes: int = 1) -> list[Outcome]:
    xp = client.namespace(dev)
    seen = []
    for _ in range(times):
        for n in range(shapes):
            x = xp.ones((n + 1, 3)) * 2.0
            seen.append(_read(xp.exp(x) + 1.0))
    return seen


def test_short_segments_go_op_by_op(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_segments, "MIN_OPS", 5)
    with client.RemoteDevice(url) as dev:
        _repeat(dev)  # four ops a segment
        assert dev.segment_stats() == _segments.SegmentStats()


def test_the_switches(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    with client.RemoteDevice(url) as dev:
        _repeat(dev)
        assert dev.segment_stats().hits > 0  # on by default
    with client.RemoteDevice(url, segment_replay=False) as dev:
        _repeat(dev)
        assert dev.segment_stats() == _segments.SegmentStats()
    monkeypatch.setenv(_segments.ENV, "0")
    with client.RemoteDevice(url) as dev:
        _repeat(dev)
        assert dev.segment_stats() == _segments.SegmentStats()
    with client.RemoteDevice(url, segment_replay=True) as dev:  # the option wins
        _repeat(dev)
        assert dev.segment_stats().hits > 0


def test_least_recently_used_out(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_segments, "MOST_SEGMENTS", 2)
    off, on = _pair(url)
    with off, on:
        assert _repeat(on, times=8, shapes=3) == _repeat(off, times=8, shapes=3)
        stats = on.segment_stats()
        assert stats.segments <= 2 and stats.evicted > 0, stats
        assert _held(on) == _held(off)


@pytest.fixture(scope="module")
def few_graphs() -> Iterator[str]:
    with run_server("--max-graphs", "1") as proc:
        yield proc.url


def test_a_refused_registration_goes_op_by_op(few_graphs: str) -> None:
    off, on = _pair(few_graphs)
    with off, on:
        assert _repeat(on, times=8, shapes=3) == _repeat(off, times=8, shapes=3)
        stats = on.segment_stats()
        assert stats.refused >= 1 and stats.hits > 0, stats


def test_an_old_server_is_spoken_to_op_by_op(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A server that does not offer the feature: no segment is ever registered."""
    without_feature(monkeypatch, "segments")
    with client.RemoteDevice(url) as dev:
        _repeat(dev)
        assert dev.segment_stats() == _segments.SegmentStats()


# --- a resumed session, threads -----------------------------------------------------------------


def _cut(dev: client.RemoteDevice) -> None:
    """Lose the connection (no close frame, then a reset): the client resumes the session."""
    sock = dev._conn._ws.socket  # noqa: SLF001 - the transport's socket, to break it
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    sock.shutdown(socket.SHUT_RDWR)


def test_a_resumed_session_keeps_its_segments(url: str) -> None:
    def run(dev: client.RemoteDevice) -> list[Outcome]:
        xp = client.namespace(dev)
        w = xp.asarray(_data(0))
        seen = []
        for step in range(12):
            if step == 6:
                _cut(dev)
            w[...] = xp.tanh(w @ w.T) * 0.5
            seen.append(_read(w))
        return seen

    off, on = _pair(url)
    with off, on:
        assert run(on) == run(off)
        stats = on.segment_stats()
        assert stats.hits >= 8 and stats.registered == 1, stats  # replayed after the cut too


def test_threads_sharing_a_device(url: str) -> None:
    """Two threads' ops interleave in one segment as they come; whatever was replayed, each
    thread reads what its own ops made."""
    with client.RemoteDevice(url) as dev:
        xp = client.namespace(dev)
        failures: list[BaseException] = []

        def work(scale: float) -> None:
            try:
                x = xp.asarray(_data(1)) * scale
                for _ in range(30):
                    y = xp.exp(x) + scale
                    expected = np.exp(_data(1) * scale) + scale
                    assert np.array_equal(y.numpy(), expected)
            except BaseException as exc:  # noqa: BLE001 - reported by the main thread
                failures.append(exc)

        threads = [threading.Thread(target=work, args=(s,)) for s in (0.5, 2.0)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert not failures, failures


@pytest.fixture(scope="module")
def small_headers() -> Iterator[str]:
    with run_server("--max-header-size", "4096") as proc:
        yield proc.url


def test_a_registration_too_large_to_take_fails_nothing(small_headers: str) -> None:
    """A segment whose ops fit a message but whose registration does not: the server drops
    the registration's own message (nothing else in it), and the segment goes op by op."""

    def run(dev: client.RemoteDevice) -> list[Outcome]:
        xp = client.namespace(dev)
        x = xp.ones(4)
        seen = []
        for _ in range(6):
            kept = [x * float(n) for n in range(40)]  # held: the graph declares each
            seen.append(_read(kept[-1] + kept[0]))
        dev.sync()  # raises if the server reported a message it could not use
        return seen

    off, on = _pair(small_headers)
    with off, on:
        assert run(on) == run(off)
        stats = on.segment_stats()
        assert stats.refused >= 1 and stats.hits == 0, stats
