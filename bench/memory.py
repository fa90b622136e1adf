"""Memory workloads: create/free cycles, idle sessions. Server RSS from ``/proc``."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

import client

from . import _procs
from ._report import Figure, Goal, Stat

Tick = Callable[[], None]
KIB = 1024
GROWTH_ALLOWED = 1 << 20  # RSS moves by allocator pages; "no growth" means under this
BLOCKS = 5  # measured blocks of create/free cycles
# Blocks run before measuring: a session's receive queue holds up to 8 parsed batches
# (server/receiving.py), about 3.5 MB each here (2048 parsed ops, 1024 upload buffers), and the
# client gets that far ahead only now and then, so the server's RSS reaches that bound over the
# first blocks and then stays: a fresh server grew 33300, 4400, 2032 and 132 KiB in the first
# four blocks of 10k cycles and 0-764 KiB in each of the next ten (tracemalloc near the peak:
# 21 MB of parsed headers and 10 MB of upload buffers in flight).
WARMUP_BLOCKS = 4


def _cycles(xp: client.Namespace, count: int) -> None:
    data = np.ones(256, dtype=np.float32)
    for _ in range(count):
        x = xp.asarray(data)
        y = x * 2.0
        del x, y  # both ids travel as frees with the next flush


def create_free(cycles: int, tick: Tick) -> Figure:
    """Server RSS growth per ``cycles`` upload/op/free cycles: the median over
    :data:`BLOCKS` blocks of ``cycles``, after :data:`WARMUP_BLOCKS` blocks to warm up.

    A leak grows every block, so the median shows it; glibc keeping freed pages now and then
    (a step of up to about 1 MiB in one block, which ``malloc_trim`` gives back) moves only
    the maximum. Runs on a fresh server of its own, so no earlier workload's memory moves it.
    """
    with _procs.server() as (url, proc), client.RemoteDevice(url) as dev:
        return _create_free(dev, proc.pid, cycles, tick)


def _create_free(dev: client.RemoteDevice, pid: int, cycles: int, tick: Tick) -> Figure:
    xp = client.namespace(dev)
    held = dev.stats().tensors
    for _ in range(WARMUP_BLOCKS):
        _cycles(xp, cycles)
    dev.sync()
    before = _procs.rss(pid)
    tick()
    growth, last = [], before
    for _ in range(BLOCKS):
        _cycles(xp, cycles)
        dev.sync()
        now = _procs.rss(pid)
        growth.append((now - last) / KIB)
        last = now
    left = dev.stats().tensors - held
    tick()
    if left:
        raise RuntimeError(f"{left} tensors were not freed by create/free cycles")
    stat = Stat.of(growth, "KiB")
    return Figure(
        f"{cycles} create/free cycles",
        "server memory growth (KiB)",
        stat.median,
        Goal("<=", GROWTH_ALLOWED / KIB),
        stat,
        Stat.of([before / KIB], "KiB"),
        "RSS before",
    )


def idle_sessions(sessions: int, tick: Tick) -> Figure:
    """Server memory per idle session: RSS with ``sessions`` open, minus before, over count.

    Runs on a fresh server of its own, so no earlier workload's memory moves the figure.
    """
    with _procs.server() as (url, proc):
        return _idle_sessions(url, proc.pid, sessions, tick)


def _idle_sessions(url: str, pid: int, sessions: int, tick: Tick) -> Figure:
    with client.RemoteDevice(url) as warm:  # the first session's one-off costs
        warm.sync()
    before = _procs.rss(pid)
    devices = []
    try:
        for _ in range(sessions):
            dev = client.RemoteDevice(url)
            devices.append(dev)
            dev.sync()
        after = _procs.rss(pid)
    finally:
        for dev in devices:
            dev.close()
    tick()
    per = (after - before) / sessions / KIB
    return Figure(
        f"{sessions} idle sessions",
        "server memory per session (KiB)",
        per,
        Goal("<=", 200),
        Stat.of([after / KIB], "KiB"),
        Stat.of([before / KIB], "KiB"),
        "before",
    )
