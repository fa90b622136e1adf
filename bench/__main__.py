"""``python -m bench [--quick] [--json PATH] [--only NAME ...] [--markdown]``: run the suite.

Starts a server (``python -m server --port 0``) and the ceiling peer (``bench._peer``), runs
every workload, prints one table and writes the figures as JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib.metadata
import os
import platform
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pydantic

import client
from protocol.version import version_text

from . import _procs, compute, consumer, latency, memory, models, servers, training, transfer
from ._params import FULL, QUICK, Params
from ._progress import Progress
from ._report import Failure, Figure, markdown, print_table, write_json

WORKLOADS = (
    "transfer",
    "upload-memory",
    "latency",
    "pipelined",
    "matmul",
    "clients",
    "idle-load",
    "cycles",
    "sessions",
    "consumer",
    "training",
    "replay",
    "models",
    "servers",
)
Tick = Callable[[], None]


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--version", action="version", version=version_text())
    parser.add_argument("--quick", action="store_true", help="a seconds-long smoke version")
    parser.add_argument(
        "--json", type=Path, default=Path(__file__).parent / "results.json", help="output path"
    )
    parser.add_argument("--only", action="append", choices=WORKLOADS, help="run just these")
    parser.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    return parser.parse_args(argv)


def _plan(
    p: Params, url: str, ports: dict[str, int], dev: client.RemoteDevice, server_pid: int
) -> dict[str, tuple[int, Callable[[Tick], list[Figure]]]]:
    """Each workload's tick count and how to run it."""
    n = p.matmul_n
    return {
        "transfer": (
            sum(r for _, r in p.sizes) + p.streams,
            lambda t: (
                transfer.throughput(dev, (ports["tcp"], ports["ws"], ports["floor"]), p.sizes, t)
                + transfer.streamed(dev, ports["tcp"], p.streams, t)
            ),
        ),
        "upload-memory": (1, lambda t: [transfer.peak_upload_memory(p.peak_upload, t)]),
        "latency": (
            2,
            lambda t: latency.reads(dev, (ports["ws"], ports["floor"]), p.pings, t, server_pid),
        ),
        "pipelined": (p.ops_reps, lambda t: compute.pipelined(dev, p.ops, p.ops_reps, t)),
        "matmul": (
            p.matmul_reps,
            lambda t: [compute.matmul_chain(dev, n, p.matmul_chain, p.matmul_reps, t)],
        ),
        "clients": (
            2 * p.client_reps,
            lambda t: [compute.many_clients(url, p.clients, p.client_ops, p.client_reps, t)],
        ),
        "idle-load": (
            1,
            lambda t: [compute.idle_under_load(dev, url, p.heavy_clients, n, p.idle_pings, t)],
        ),
        "cycles": (2, lambda t: [memory.create_free(p.cycles, t)]),
        "sessions": (1, lambda t: [memory.idle_sessions(p.sessions, t)]),
        "consumer": (
            p.consumer_reps,
            lambda t: consumer.fit(dev, p.consumer_n, p.consumer_reps, t),
        ),
        "training": (
            2 * p.training_reps,
            lambda t: (
                training.steps_per_second(
                    dev, training.DIGITS, p.training_steps, p.training_reps, t
                )
                + training.steps_per_second(
                    dev, training.WIDE, p.training_wide_steps, p.training_reps, t
                )
            ),
        ),
        "replay": (
            2 * p.training_reps,
            lambda t: (
                training.replayed_steps(url, p.training_steps, p.training_reps, t)
                + [
                    training.replayed_against_local(
                        dev, training.WIDE, p.training_wide_steps, p.training_reps, t
                    )
                ]
            ),
        ),
        "models": (
            2 * p.model_reps,
            lambda t: (
                models.steps(dev, url, models.CNN, p.cnn_steps, p.model_reps, t)
                + models.steps(dev, url, models.TRANSFORMER, p.transformer_steps, p.model_reps, t)
            ),
        ),
        "servers": (
            p.server_reps + p.training_reps,
            lambda t: (
                servers.between_servers(ports["tcp"], p.server_transfer, p.server_reps, t)
                + servers.data_parallel(p.parallel_steps, p.training_reps, t)
            ),
        ),
    }


def _meta(quick: bool) -> dict[str, Any]:
    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "quick": quick,
        "load_before": _procs.cpu_load(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "websockets": importlib.metadata.version("websockets"),
        "pydantic": pydantic.VERSION,
        "platform": platform.platform(),
    }


def run(quick: bool, only: list[str] | None) -> tuple[dict[str, Any], list[Figure], list[Failure]]:
    """Run the chosen workloads against a fresh server and peer; return meta, figures and the
    workloads that failed.

    A workload that raises an exception is recorded as a :class:`Failure` and the next one
    runs, on a new session (the failure may have broken the old one); Ctrl-C
    (KeyboardInterrupt, not an Exception) still ends the run.
    """
    params = QUICK if quick else FULL
    meta = _meta(quick)
    figures: list[Figure] = []
    failures: list[Failure] = []
    with (
        _procs.server() as (url, server),
        _procs.child(["-m", "bench._peer"]) as peer,
        Progress() as progress,
    ):
        words = peer.line.split()  # "tcp PORT ws PORT floor PORT"
        ports = {name: int(port) for name, port in zip(words[::2], words[1::2], strict=True)}
        dev: client.RemoteDevice | None = None
        try:
            for name in only or WORKLOADS:
                try:
                    if dev is None:
                        dev = client.RemoteDevice(url)
                    ticks, work = _plan(params, url, ports, dev, server.pid)[name]
                    with progress.step(name, ticks) as tick:
                        figures.extend(work(tick))
                except Exception as exc:
                    failures.append(Failure.of(name, exc))
                    if dev is not None:
                        with contextlib.suppress(Exception):  # what broke it may break this
                            dev.close()
                        dev = None
        finally:
            if dev is not None:
                dev.close()
    meta["load_after"] = _procs.cpu_load()
    return meta, figures, failures


def main(argv: list[str] | None = None) -> int:
    """Run, print the table, write the JSON; exit status 1 when a workload failed."""
    args = _parse(argv)
    meta, figures, failures = run(args.quick, args.only)
    mode = "quick" if args.quick else "full"
    title = f"Tensorwire benchmarks ({mode}; load average {meta['load_after']})"
    if args.markdown:
        print(f"{title}\n\n{markdown(figures, failures)}")
    else:
        print_table(figures, title, failures)
    write_json(args.json, meta, figures, failures)
    print(f"wrote {args.json}", file=sys.stderr)
    if failures:
        names = ", ".join(f.workload for f in failures)
        print(f"failed: {names} (see the table and the tracebacks above)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
