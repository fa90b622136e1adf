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


def _cycles(xp: client.Namespace, count: int) -> None:
    data = np.ones(256, dtype=np.float32)
    for _ in range(count):
        x = xp.asarray(data)
        y = x * 2.0
        del x, y  # both ids travel as frees with the next flush


def create_free(cycles: int, tick: Tick) -> Figure:
    """Server RSS growth over ``cycles`` upload/op/free cycles, after as many to warm up.

    Runs on a fresh server of its own, so no earlier workload's memory moves the figure.
    """
    with _procs.server() as (url, proc), client.RemoteDevice(url) as dev:
        return _create_free(dev, proc.pid, cycles, tick)


def _create_free(dev: client.RemoteDevice, pid: int, cycles: int, tick: Tick) -> Figure:
    xp = client.namespace(dev)
    held = dev.stats().tensors
    _cycles(xp, cycles)
    dev.sync()
    before = _procs.rss(pid)
    tick()
    _cycles(xp, cycles)
    dev.sync()
    after = _procs.rss(pid)
    left = dev.stats().tensors - held
    tick()
    if left:
        raise RuntimeError(f"{left} tensors were not freed by create/free cycles")
    growth = after - before
    return Figure(f"{cycles} create/free cycles", "server memory growth (KiB)", growth / KIB,
                  Goal("<=", GROWTH_ALLOWED / KIB), Stat.of([after / KIB], "KiB"),
                  Stat.of([before / KIB], "KiB"), "before")  # fmt: skip


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
    return Figure(f"{sessions} idle sessions", "server memory per session (KiB)", per,
                  Goal("<=", 200), Stat.of([after / KIB], "KiB"),
                  Stat.of([before / KIB], "KiB"), "before")  # fmt: skip
