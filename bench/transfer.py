"""Transfer workloads: upload/download throughput, one-element read latency, upload memory.

Ceilings: a plain TCP transfer of the same bytes to and from the peer process
(:mod:`bench._peer`), received into a fresh array as the server does; and a bare websockets
ping-pong with the peer.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable

import numpy as np
from websockets.asyncio.client import connect

import client

from . import _procs
from ._params import MIB
from ._peer import COMMAND, recv_exactly
from ._report import Figure, Goal, Stat

Tick = Callable[[], None]


def _timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


class TcpCeiling:
    """Plain TCP transfers to and from the peer over loopback."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def upload(self, data: np.ndarray) -> float:
        def run() -> None:
            self.sock.sendall(COMMAND.pack(b"U", data.nbytes))
            self.sock.sendall(data.data)
            recv_exactly(self.sock, memoryview(bytearray(1)))

        return _timed(run)

    def download(self, nbytes: int) -> float:
        self.sock.sendall(COMMAND.pack(b"P", nbytes))
        recv_exactly(self.sock, memoryview(bytearray(1)))

        def run() -> None:
            self.sock.sendall(COMMAND.pack(b"D", 0))
            recv_exactly(self.sock, np.empty(nbytes, dtype=np.uint8).data)

        return _timed(run)

    def close(self) -> None:
        self.sock.close()


def _size_name(nbytes: int) -> str:
    return f"{nbytes // MIB} MiB"


def throughput(
    dev: client.RemoteDevice, tcp_port: int, sizes: tuple[tuple[int, int], ...], tick: Tick
) -> list[Figure]:
    """Upload and download float32 tensors of each size, interleaved with the TCP ceiling."""
    xp = client.namespace(dev)
    ceiling = TcpCeiling(tcp_port)
    figures = []
    try:
        for nbytes, reps in sizes:
            data = np.random.default_rng(0).random(nbytes // 4, dtype=np.float32)
            up, down, tcp_up, tcp_down = [], [], [], []
            for _ in range(reps):
                start = time.perf_counter()
                x = xp.asarray(data)
                dev.sync()
                up.append(time.perf_counter() - start)
                down.append(_timed(x.numpy))
                del x
                dev.sync()  # the free travels; nothing of this size stays on the server
                tcp_up.append(ceiling.upload(data))
                tcp_down.append(ceiling.download(nbytes))
                tick()
            for name, ours, tcp in (("upload", up, tcp_up), ("download", down, tcp_down)):
                rate = Stat.of([nbytes / t / 1e9 for t in ours], "GB/s")
                tcp_rate = Stat.of([nbytes / t / 1e9 for t in tcp], "GB/s")
                figures.append(
                    Figure(
                        f"{name} {_size_name(nbytes)} float32",
                        "throughput / plain TCP",
                        rate.median / tcp_rate.median,
                        Goal(">=", 0.6),
                        rate,
                        tcp_rate,
                        "TCP loopback",
                    )
                )
    finally:
        ceiling.close()
    return figures


def peak_upload_memory(nbytes: int, tick: Tick) -> Figure:
    """Peak server memory above its resting size during one upload, over the tensor's size.

    Runs on a fresh server of its own, so nothing else has raised its peak.
    """
    data = np.ones(nbytes // 4, dtype=np.float32)
    with _procs.server() as (url, proc), client.RemoteDevice(url) as dev:
        dev.sync()
        _procs.reset_peak(proc.pid)
        resting = _procs.rss(proc.pid)
        x = client.namespace(dev).asarray(data)
        dev.sync()
        peak = _procs.peak_rss(proc.pid) - resting
        del x
    tick()
    return Figure(
        f"one {_size_name(nbytes)} upload",
        "peak server memory / tensor",
        peak / nbytes,
        Goal("<=", 1.5),
        Stat.of([peak / MIB], "MiB"),
        Stat.of([nbytes / MIB], "MiB"),
        "tensor",
    )


async def _ping_pong(port: int, count: int) -> list[float]:
    payload = bytes(64)
    samples = []
    async with connect(f"ws://127.0.0.1:{port}", compression=None, proxy=None) as ws:
        for _ in range(count + count // 10):
            start = time.perf_counter()
            await ws.send(payload)
            await ws.recv()
            samples.append(time.perf_counter() - start)
    return samples[count // 10 :]


def latency(dev: client.RemoteDevice, ws_port: int, count: int, tick: Tick) -> list[Figure]:
    """Round trips of reading a one-element tensor, against a bare websockets ping-pong."""
    x = client.namespace(dev).asarray(np.ones(1, dtype=np.float32))
    for _ in range(count // 10):
        x.numpy()  # warm up
    ours = [_timed(x.numpy) * 1e6 for _ in range(count)]
    tick()
    bare = [t * 1e6 for t in asyncio.run(_ping_pong(ws_port, count))]
    tick()
    rtt, ref = Stat.of(ours, "us", p99=True), Stat.of(bare, "us", p99=True)
    assert rtt.p99 is not None and ref.p99 is not None
    name = "read one-element tensor"
    return [
        Figure(
            name,
            "median round trip / ping-pong",
            rtt.median / ref.median,
            Goal("<=", 1.5),
            rtt,
            ref,
            "bare websockets",
        ),  # fmt: skip
        Figure(
            name, "p99 round trip / ping-pong", rtt.p99 / ref.p99, None, rtt, ref, "bare websockets"
        ),  # fmt: skip
    ]
