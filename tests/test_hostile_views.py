"""Issue 30, row 4, through real servers: a write through a view of a tensor that an exposure
(or a read reply) still sends moves all of its root to fresh memory first, and an exposure of
a small view copies it. Both copies are costed as an op's work: a large one runs in a worker
thread, never on the event loop, so other sessions are answered meanwhile (before: every
session stalled for the whole copy, 1.2-1.7 s for the issue's 512 MiB root), and counts
against ``--max-op-cost``. Their memory is charged before the copy is made
(``tests/test_views_in_store.py`` checks the accounting itself)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest

import client
from protocol import Batch, ErrorCode, Expose
from protocol.ops import Full
from server.outcome import Job

from .servers import ServerProcess, run_server
from .victims import waits_meanwhile

MIB = 1 << 20
ROOT = 192 * MIB  # the tensor written or exposed: its copy takes 0.1-0.5 s here
# 4 KiB pages: a fresh page's fault costs about the same each time (with numpy's huge pages
# the copy of a root took 14 to 330 ms from one run to the next)
STEADY_FAULTS = {"NUMPY_MADVISE_HUGEPAGE": "0"}


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    budget, quota = str(8 * ROOT), str(6 * ROOT)
    with run_server("--memory-budget", budget, "--session-quota", quota, env=STEADY_FAULTS) as p:
        yield p


def _write_after_expose(dev: client.RemoteDevice, peer: str) -> Callable[[], float]:
    """A one-element write through a small view of a tensor just exposed (its root moves;
    the write alone would run on the event loop): the seconds from the write to its end."""
    x = client.namespace(dev).zeros(ROOT // 8)
    view = x[:2]
    dev.sync()

    def attack() -> float:
        dev.expose(x.tensor_id, peer).result()
        started = time.monotonic()
        view[0] = 1.0
        dev.sync()
        return time.monotonic() - started

    return attack


def _expose_a_large_slice(dev: client.RemoteDevice, peer: str) -> Callable[[], float]:
    """An exposure of a view just under half its root (a compact copy of the view): its
    seconds."""
    x = client.namespace(dev).zeros(ROOT // 8)
    part = x[: ROOT // 8 // 2 - 1]
    dev.sync()

    def attack() -> float:
        started = time.monotonic()
        dev.expose(part.tensor_id, peer).result()
        return time.monotonic() - started

    return attack


ATTACKS = {
    "a write after an expose": _write_after_expose,
    "an expose of a large slice": _expose_a_large_slice,
}


@pytest.mark.serial
@pytest.mark.parametrize("attack", list(ATTACKS))
def test_a_large_copy_leaves_the_event_loop_to_other_sessions(
    server: ServerProcess, attack: str
) -> None:
    """Another session's one-element read and ``/healthz``, sent over and over, wait far less
    than the attacker's copying call takes (before: as long, the event loop copying)."""
    with client.RemoteDevice(server.url) as attacker:
        run = ATTACKS[attack](attacker, attacker.server_id)  # one server: one id
        with waits_meanwhile(server) as waits:
            calls = [run() for _ in range(3)]
    assert max(waits) < max(calls) / 2, f"reads waited {max(waits):.3f} s, calls took {calls}"


@pytest.mark.server
def test_a_move_counts_against_the_work_cap() -> None:
    """With ``--max-op-cost`` under a move of the root, a one-element write through a view of
    an exposed tensor is refused (``limit_exceeded``) and the session goes on; without an
    exposure the same write runs."""
    with (
        run_server("--max-op-cost", str(8 * MIB)) as capped,
        client.RemoteDevice(capped.url) as dev,
    ):
        xp = client.namespace(dev)
        x = xp.zeros(4 * MIB // 8)  # a move of 4 MiB: counted 16 Mi units
        view = x[:2]
        view[0] = 1.0
        dev.expose(x.tensor_id, "0123456789abcdef").result()
        view[1] = 2.0
        with pytest.raises(client.RemoteError) as info:
            view.numpy()
        assert info.value.code == ErrorCode.LIMIT_EXCEEDED
        assert "--max-op-cost" in str(info.value)
        assert float(xp.sum(x).numpy()) == 1.0  # the refused write never ran


def test_the_deadline_names_an_expose_or_the_frees_once_the_ops_ran() -> None:
    """An expose's compact copy runs in a worker step, watched by the per-op deadline, in a
    batch that may hold no op: the deadline's message names it (it indexed the batch's ops:
    past the deadline, an expose-only batch closed its connection with 1011)."""
    expose = Expose(request_id=1, tensor=1, audience="0123456789abcdef")
    job = Job(Batch(ops=[], requests=[expose]), [])
    job.exposing = [0]
    assert job.running() == "an expose of the batch"
    job.exposing = []
    assert job.running() == "the batch's frees"
    job = Job(Batch(ops=[Full(out=1, shape=(), dtype="int64", value=0)], requests=[]), [])
    assert job.running() == "full() -> #1"
