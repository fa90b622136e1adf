"""``python -m bench.soak [--seconds N] [--json PATH]``: a soak under hostile clients, on loopback.

One server with small limits (``--memory-budget 256MiB --session-quota 64MiB``) that may pull
from loopback peers. Beside it, for ``--seconds`` (default 600), attackers of every kind
(``bench/attacks.py``: :data:`~bench.attacks.ATTACKS`, ``--attack`` picks) run, each in its own
process, while well-behaved sessions in this process do what training code does and check
every result, and a prober opens a new connection every second.

The goals: the well-behaved sessions' p99 read latency under 100 ms, no new
connection waiting more than 1 s, the server's RSS under 1.5x the memory budget plus its RSS
at rest, and every well-behaved result correct. The figures are printed and written as JSON.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

import client
from protocol.version import version_text

from . import _procs
from .attacks import ATTACKS, MIB, PEERS, attack_until

BUDGET, QUOTA = 256 * MIB, 64 * MIB
LIMITS = ("--memory-budget", "256MiB", "--session-quota", "64MiB", "--max-connections", "64")
SERVER_FLAGS = (*LIMITS, *PEERS)


# --- the well-behaved side ------------------------------------------------------------------


class Observed:
    """What the well-behaved sessions, the prober and the sampler saw."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.reads: list[float] = []  # seconds, one per well-behaved read
        self.wrong = 0  # results that differed from numpy's
        self.failed: list[str] = []  # well-behaved calls that raised
        self.connects: list[float] = []  # seconds to open a new session
        self.rss: list[int] = []


def _well_behaved(url: str, seed: int, deadline: float, seen: Observed) -> None:
    """A training-like loop: upload, a few ops, one read, checked against numpy."""
    rng = np.random.default_rng(seed)
    with client.RemoteDevice(url) as dev:
        xp = client.namespace(dev)
        w = rng.standard_normal((32, 8))
        weights = xp.asarray(w)
        while time.time() < deadline:
            x = rng.standard_normal((16, 32))
            start = time.perf_counter()
            try:
                got = xp.sum(xp.tanh(xp.asarray(x) @ weights) * 0.5, axis=0).numpy()
            except (client.TensorwireError, ConnectionError) as exc:
                with seen.lock:
                    seen.failed.append(f"{type(exc).__name__}: {exc}")
                return
            took = time.perf_counter() - start
            expected = np.sum(np.tanh(x @ w) * 0.5, axis=0)
            with seen.lock:
                seen.reads.append(took)
                seen.wrong += int(not np.allclose(got, expected, rtol=1e-12, atol=1e-12))
            time.sleep(0.01)


def _prober(url: str, deadline: float, seen: Observed) -> None:
    while time.time() < deadline:
        start = time.perf_counter()
        try:
            with client.RemoteDevice(url, open_timeout=30) as dev:
                dev.sync()
        except (client.TensorwireError, ConnectionError) as exc:
            with seen.lock:
                seen.failed.append(f"connect: {type(exc).__name__}: {exc}")
        with seen.lock:
            seen.connects.append(time.perf_counter() - start)
        time.sleep(1.0)


def _sampler(pid: int, deadline: float, seen: Observed) -> None:
    while time.time() < deadline:
        seen.rss.append(_procs.rss(pid))
        time.sleep(0.5)


def soak(seconds: float, sessions: int = 3, attacks: list[str] | None = None) -> dict[str, Any]:
    """Run the soak for ``seconds``; the figures (see the module docstring)."""
    with _procs.server(*SERVER_FLAGS) as (url, proc):
        time.sleep(1.0)
        at_rest = _procs.rss(proc.pid)
        deadline = time.time() + seconds
        seen = Observed()
        spawn = multiprocessing.get_context("spawn")
        attackers = [
            spawn.Process(target=attack_until, args=(name, url, deadline), daemon=True)
            for name in attacks or ATTACKS
        ]
        threads = [
            threading.Thread(target=_well_behaved, args=(url, n, deadline, seen))
            for n in range(sessions)
        ]
        threads += [
            threading.Thread(target=_prober, args=(url, deadline, seen)),
            threading.Thread(target=_sampler, args=(proc.pid, deadline, seen)),
        ]
        for attacker in attackers:
            attacker.start()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        grace = time.time() + 2  # the stalled upload sleeps: no need to wait
        for attacker in attackers:  # two seconds for them all, not two each
            attacker.join(timeout=max(0.0, grace - time.time()))
            if attacker.is_alive():
                attacker.kill()
        alive = proc.process.poll() is None
    reads = np.array(seen.reads or [float("nan")])
    return {
        "seconds": seconds,
        "server_alive": alive,
        "well_behaved_reads": len(seen.reads),
        "read_p50_ms": float(np.percentile(reads, 50) * 1e3),
        "read_p99_ms": float(np.percentile(reads, 99) * 1e3),
        "read_max_ms": float(reads.max() * 1e3),
        "wrong_results": seen.wrong,
        "failed_calls": seen.failed[:10],
        "connects": len(seen.connects),
        "connect_max_s": max(seen.connects, default=float("nan")),
        "rss_at_rest_mib": at_rest / MIB,
        "rss_peak_mib": max(seen.rss, default=0) / MIB,
        "rss_limit_mib": (1.5 * BUDGET + at_rest) / MIB,
    }


def verdict(figures: dict[str, Any]) -> dict[str, bool]:
    """Each goal, met or not."""
    return {
        "p99 read < 100 ms": figures["read_p99_ms"] < 100,
        "new connection < 1 s": figures["connect_max_s"] < 1.0,
        "RSS < 1.5x budget + at rest": figures["rss_peak_mib"] < figures["rss_limit_mib"],
        "every result correct": figures["wrong_results"] == 0 and not figures["failed_calls"],
        "server alive": figures["server_alive"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__)
    parser.add_argument("--version", action="version", version=version_text())
    parser.add_argument("--seconds", type=float, default=600.0)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument(
        "--attack", action="append", choices=list(ATTACKS), help="run only these (default: all)"
    )
    args = parser.parse_args(argv)
    figures = soak(args.seconds, attacks=args.attack or list(ATTACKS))
    return report(figures, verdict(figures), args.json)


def report(
    figures: dict[str, Any],
    met: dict[str, bool],
    path: Path | None,
    unprinted: tuple[str, ...] = (),
) -> int:
    """Print the figures (all but those named in ``unprinted``) and the goals, write both to
    ``path`` as JSON; the exit status: 0 if every goal is met."""
    for key, value in figures.items():
        if key not in unprinted:
            print(f"{key:22} {value}")
    for goal, ok in met.items():
        print(f"{'met' if ok else 'MISSED':7} {goal}")
    if path is not None:
        path.write_text(json.dumps({"figures": figures, "goals": met}, indent=2) + "\n")
    return 0 if all(met.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
