"""``python -m bench.profile [--out DIR] [--ops N] [--mib N]``: where the time goes.

Profiles the pipelined workload, a large upload, a large download, small reads and training
steps of the digits MLP (``bench/training.py``), each on a fresh server: the server and a
client process are both sampled from outside with py-spy
(``--nonblocking``, so neither is paused; every thread, the client's event-loop thread too).
Writes, per scenario, ``NAME.server.txt`` and ``NAME.client.txt``: the hottest functions by own
and by total samples.
Needs the ``bench`` extra (``pip install -e '.[bench]'``) and permission to ptrace children
(Linux ``kernel.yama.ptrace_scope`` 0 or 1).
"""

from __future__ import annotations

import argparse
import collections
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

import client
from client.autodiff import Autodiff
from protocol.version import version_text

from . import _procs, training


def _pipelined(dev: client.RemoteDevice, ops: int) -> Callable[[], None]:
    xp = client.namespace(dev)
    a = xp.asarray(np.ones(16, dtype=np.float32))

    def run() -> None:
        x = a
        for _ in range(ops):
            x = x + a
        x.numpy()

    return run


def _upload(dev: client.RemoteDevice, mib: int) -> Callable[[], None]:
    data = np.ones(mib << 18, dtype=np.float32)
    xp = client.namespace(dev)

    def run() -> None:
        for _ in range(4):
            x = xp.asarray(data)
            dev.sync()
            del x

    return run


def _download(dev: client.RemoteDevice, mib: int) -> Callable[[], None]:
    x = client.namespace(dev).ones(mib << 18, dtype="float32")
    dev.sync()

    def run() -> None:
        for _ in range(4):
            x.numpy()

    return run


def _reads(dev: client.RemoteDevice, count: int) -> Callable[[], None]:
    x = client.namespace(dev).ones(1, dtype="float32")
    x.numpy()

    def run() -> None:
        for _ in range(count):
            x.numpy()

    return run


def _training(dev: client.RemoteDevice, steps: int) -> Callable[[], None]:
    """The digits MLP of bench/training.py, trained ``steps`` steps (one read each)."""
    trainer = training.Trainer(Autodiff(client.namespace(dev)), training.DIGITS, 256)
    trainer.run(3)

    def run() -> None:
        trainer.run(steps)

    return run


SCENARIOS = {
    "pipelined": _pipelined,
    "upload": _upload,
    "download": _download,
    "reads": _reads,
    "training": _training,
}


def _client(url: str, name: str, size: int) -> None:
    """The client side, in its own process: set up, say ``ready``, run on ``go``, report."""
    with client.RemoteDevice(url) as dev:
        run = SCENARIOS[name](dev, size)
        print("ready", flush=True)
        sys.stdin.readline()
        start = time.perf_counter()
        run()
        print(f"{time.perf_counter() - start:.3f}", flush=True)


def summarize(raw: str, top: int = 30) -> str:
    """py-spy's raw (collapsed stacks) output as the hottest frames by own and total samples."""
    own: collections.Counter[str] = collections.Counter()
    total: collections.Counter[str] = collections.Counter()
    samples = 0
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        n = int(count)
        samples += n
        frames = stack.split(";")
        own[frames[-1]] += n
        for frame in set(frames):
            total[frame] += n
    lines = [f"{samples} samples (active threads only)", "", "own samples:"]
    lines += [f"{n:7d} {100 * n / samples:5.1f}%  {f}" for f, n in own.most_common(top)]
    lines += ["", "total samples (frame on the stack):"]
    lines += [f"{n:7d} {100 * n / samples:5.1f}%  {f}" for f, n in total.most_common(top)]
    return "\n".join(lines) + "\n"


def _spy(pid: int, raw: Path) -> subprocess.Popen[bytes]:
    spy_bin = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    return subprocess.Popen(
        [
            spy_bin,
            "record",
            "-p",
            str(pid),
            "-f",
            "raw",
            "-o",
            str(raw),
            "-r",
            "1000",
            "--nonblocking",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def profile(name: str, size: int, out: Path) -> float:
    """Run scenario ``name`` on a fresh server, both processes sampled; return its wall time."""
    with _procs.server() as (url, server):
        args = [sys.executable, "-m", "bench.profile", "--client", url, name, str(size)]
        with subprocess.Popen(
            args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=_procs.ROOT
        ) as proc:
            assert proc.stdin is not None and proc.stdout is not None
            proc.stdout.readline()  # ready
            spies = [
                _spy(server.pid, out / f"{name}.server.raw"),
                _spy(proc.pid, out / f"{name}.client.raw"),
            ]
            time.sleep(1.0)  # py-spy attaches asynchronously; this only trims the start
            proc.stdin.write("go\n")
            proc.stdin.flush()
            elapsed = float(proc.stdout.readline())
            for spy in spies:
                spy.send_signal(2)
                spy.wait(60)
    for side in ("server", "client"):
        raw = out / f"{name}.{side}.raw"
        if raw.exists():
            text = f"{name}: {elapsed:.3f} s wall\n" + summarize(raw.read_text())
            (out / f"{name}.{side}.txt").write_text(text)
    return elapsed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.profile", description=__doc__)
    parser.add_argument("--version", action="version", version=version_text())
    parser.add_argument("--out", type=Path, default=Path("bench/profiles"))
    parser.add_argument("--ops", type=int, default=50_000)
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--reads", type=int, default=2000)
    parser.add_argument("--steps", type=int, default=1000, help="training steps (digits MLP)")
    parser.add_argument("--only", action="append")
    parser.add_argument("--client", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.client:
        url, name, size = args.client
        _client(url, name, int(size))
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    sizes = {
        "pipelined": args.ops,
        "upload": args.mib,
        "download": args.mib,
        "reads": args.reads,
        "training": args.steps,
    }
    for name, size in sizes.items():
        if args.only and name not in args.only:
            continue
        print(f"{name}: {profile(name, size, args.out):.2f} s -> {args.out}/{name}.*")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
