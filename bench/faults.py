"""``python -m bench.faults [--seconds N] [--clients N] [--json PATH]``: the fault soak.

One server with the soak's small limits (``bench/soak.py``). For ``--seconds`` (default 1800),
``--clients`` training clients (default 8), each a process of its own, train through their own
cutting proxy (``bench/cutting_proxy.py``), which resets every connection every 2 to 5 s,
while each one's uncut twin trains the same rounds at the same time on a direct connection
(``bench/_twins.py``); the soak's attackers (every kind, ``--attack`` picks) run beside
them. The server's RSS is sampled twice a second.

The goals: every client's numbers equal its twin's, round by round, bit for bit, and no call
of theirs failed (a cut session resumes by itself); the server's RSS drifts less than 5% after
warm-up (the first 10% of the run): the median of the last 10% of the samples against the
median of the 10% after warm-up; the proxies really cut; the server lives. The p99 latency of
the training reads (``float(loss)`` after each step) with cuts is reported beside the twins'
p99 without cuts, measured over the same time and load.

Before the soak, the proxy's cost: plain TCP through the proxy against direct on loopback, and
a 64 MiB upload (``xp.asarray``, ``sync``) through the proxy, not cutting, against direct.
"""

from __future__ import annotations

import argparse
import multiprocessing
import queue
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

import client
from protocol.version import version_text

from . import _procs, _progress, _twins, soak
from .attacks import ATTACKS, attack_until
from .cutting_proxy import CuttingProxy, address

MIB = 2**20
WARM_UP = 0.10  # the share of the run before the RSS reference is taken
DRIFT_LIMIT = 0.05
GRACE_S = 120.0  # how long a client may take past the deadline to finish its last round


def _sink() -> tuple[socket.socket, threading.Thread]:
    """A loopback listener that reads one connection to its end."""
    listener = socket.create_server(("127.0.0.1", 0))

    def drain() -> None:
        conn, _ = listener.accept()
        buffer = bytearray(MIB)
        with conn:
            while conn.recv_into(buffer):
                pass

    thread = threading.Thread(target=drain, daemon=True)
    thread.start()
    return listener, thread


def _tcp_mib_s(total_mib: int, through_proxy: bool) -> float:
    listener, drained = _sink()
    with listener:
        target = listener.getsockname()
        proxy = CuttingProxy(target) if through_proxy else None
        port = proxy.port if proxy is not None else target[1]
        block = bytes(MIB)
        start = time.perf_counter()
        with socket.create_connection(("127.0.0.1", port)) as sock:
            for _ in range(total_mib):
                sock.sendall(block)
            sock.shutdown(socket.SHUT_WR)
            drained.join()
        seconds = time.perf_counter() - start
        if proxy is not None:
            proxy.close()
    return total_mib / seconds


def _upload_s(url: str, values: np.ndarray, repeats: int = 3) -> float:
    """The best of ``repeats`` uploads of ``values`` to ``url``, in seconds."""
    best = float("inf")
    with client.RemoteDevice(url) as dev:
        xp = client.namespace(dev)
        for _ in range(repeats):
            start = time.perf_counter()
            x = xp.asarray(values)
            dev.sync()
            best = min(best, time.perf_counter() - start)
            del x
    return best


def proxy_cost(url: str, tcp_mib: int = 1024) -> dict[str, float]:
    """The proxy against direct: plain TCP (MiB/s) and a 64 MiB upload to ``url`` (s)."""
    values = np.ones(8 * MIB)  # 64 MiB of float64
    with CuttingProxy(address(url)) as proxy:
        proxied = _upload_s(proxy.url(), values)
    return {
        "tcp_direct_mib_s": _tcp_mib_s(tcp_mib, through_proxy=False),
        "tcp_proxied_mib_s": _tcp_mib_s(tcp_mib, through_proxy=True),
        "upload_64mib_direct_s": _upload_s(url, values),
        "upload_64mib_proxied_s": proxied,
    }


def _drift(samples: list[tuple[float, int]], seconds: float) -> tuple[float, float, float]:
    """RSS after warm-up and at the end (MiB, medians), and the drift between them."""
    start = samples[0][0] if samples else 0.0
    after = [r for t, r in samples if WARM_UP * seconds <= t - start < 2 * WARM_UP * seconds]
    end = [r for t, r in samples if t - start >= (1 - WARM_UP) * seconds]
    if not after or not end:
        return float("nan"), float("nan"), float("nan")
    reference, final = float(np.median(after)), float(np.median(end))
    return reference / MIB, final / MIB, final / reference - 1


def _watch(pid: int, seconds: float, deadline: float) -> list[tuple[float, int]]:
    """Sample the server's RSS twice a second until ``deadline``, with a progress bar."""
    samples: list[tuple[float, int]] = []
    with _progress.Progress() as progress, progress.step("fault soak", int(seconds)) as tick:
        ticked = 0
        start = time.time()
        while (now := time.time()) < deadline:
            samples.append((now, _procs.rss(pid)))
            while ticked < int(now - start):
                tick()
                ticked += 1
            time.sleep(0.5)
    return samples


def _collect(results: Any, count: int, clients: list[Any]) -> list[dict[str, Any]]:
    collected: list[dict[str, Any]] = []
    until = time.time() + GRACE_S
    while len(collected) < count and time.time() < until:
        try:
            collected.append(results.get(timeout=1.0))
        except queue.Empty:
            if not any(c.is_alive() for c in clients):
                break
    for proc in clients:
        proc.join(timeout=5)
        if proc.is_alive():
            proc.kill()
    return sorted(collected, key=lambda r: int(r["index"]))


def _curve(samples: list[tuple[float, int]], every: float = 5.0) -> list[list[float]]:
    """The server's RSS over the run, in MiB, one sample per ``every`` seconds."""
    curve: list[list[float]] = []
    for at, rss in samples:
        t = at - samples[0][0]
        if not curve or t - curve[-1][0] >= every:
            curve.append([round(t, 1), round(rss / MIB, 1)])
    return curve


def plot(figures: dict[str, Any], path: Path) -> None:
    """Draw the server's RSS over the run, the windows the drift compares shaded, as a PNG
    (matplotlib, of the examples' extra)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    seconds = figures["seconds"]
    t, rss = zip(*figures["rss_mib"], strict=True)
    fig, ax = plt.subplots(figsize=(8, 3.5))
    ax.plot(t, rss, lw=1)
    ax.axvspan(WARM_UP * seconds, 2 * WARM_UP * seconds, alpha=0.15, label="after warm-up")
    ax.axvspan((1 - WARM_UP) * seconds, seconds, alpha=0.15, color="C1", label="end")
    ax.set(xlabel="seconds", ylabel="server RSS (MiB)", title="fault soak: server RSS")
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def _p99_ms(reads: list[float]) -> float:
    return float(np.percentile(reads, 99) * 1e3) if reads else float("nan")


def faults(seconds: float, clients: int = 8, attacks: list[str] | None = None) -> dict[str, Any]:
    """Run the fault soak for ``seconds``; the figures (see the module docstring)."""
    with _procs.server(*soak.SERVER_FLAGS) as (url, proc):
        cost = proxy_cost(url)
        spawn = multiprocessing.get_context("spawn")
        results = spawn.Queue()
        deadline = time.time() + seconds
        trainers = [
            spawn.Process(target=_twins.client_process, args=(i, url, deadline, results))
            for i in range(clients)
        ]
        attackers = [
            spawn.Process(target=attack_until, args=(name, url, deadline), daemon=True)
            for name in attacks or ATTACKS
        ]
        for process in trainers + attackers:
            process.start()
        samples = _watch(proc.pid, seconds, deadline)
        grace = time.time() + 2  # the stalled upload sleeps: two seconds for them all
        for attacker in attackers:
            attacker.join(timeout=max(0.0, grace - time.time()))
            if attacker.is_alive():
                attacker.kill()
        per_client = _collect(results, clients, trainers)
        alive = proc.process.poll() is None
    reference, final, drift = _drift(samples, seconds)
    reads_cut = [r for c in per_client for r in c.pop("reads_cut")]
    reads_uncut = [r for c in per_client for r in c.pop("reads_uncut")]
    return {
        "seconds": seconds,
        "clients": clients,
        "clients_reported": len(per_client),
        "server_alive": alive,
        "cuts": sum(c["cuts"] for c in per_client),
        "rounds_compared": sum(c["rounds_compared"] for c in per_client),
        "rounds_differing": sum(len(c["rounds_differing"]) for c in per_client),
        "failed_calls": sum(c["failed_calls"] for c in per_client),
        "twin_failed_calls": sum(c["twin_failed_calls"] for c in per_client),
        "reads_cut": len(reads_cut),
        "read_p99_cut_ms": _p99_ms(reads_cut),
        "read_p99_uncut_ms": _p99_ms(reads_uncut),
        "rss_after_warm_up_mib": reference,
        "rss_end_mib": final,
        "rss_drift": drift,
        "rss_mib": _curve(samples),
        "proxy": cost,
        "per_client": per_client,
    }


def verdict(figures: dict[str, Any]) -> dict[str, bool]:
    """Each goal, met or not."""
    return {
        "every client equals its twin, no call failed": figures["clients_reported"]
        == figures["clients"]
        and figures["rounds_differing"] == 0
        and figures["failed_calls"] == 0
        and all(c["rounds_compared"] > 0 for c in figures["per_client"]),
        "RSS drift after warm-up < 5%": abs(figures["rss_drift"]) < DRIFT_LIMIT,
        "the proxies cut": figures["cuts"] > 0,
        "server alive": figures["server_alive"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.faults", description=__doc__)
    parser.add_argument("--version", action="version", version=version_text())
    parser.add_argument("--seconds", type=float, default=1800.0)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--quick", action="store_true", help="20 s, 2 clients (a smoke run)")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument(
        "--plot", type=Path, default=None, help="draw the server's RSS over the run (PNG)"
    )
    parser.add_argument(
        "--attack", action="append", choices=list(ATTACKS), help="only these (default: all)"
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.seconds, args.clients = 20.0, 2
    figures = faults(args.seconds, args.clients, args.attack)
    if args.plot is not None:
        plot(figures, args.plot)
    return soak.report(figures, verdict(figures), args.json, unprinted=("per_client", "rss_mib"))


if __name__ == "__main__":
    sys.exit(main())
