"""Transfer workloads: upload/download throughput, streamed uploads, upload memory.

Ceilings: a plain TCP transfer of the same bytes to and from the peer process
(:mod:`bench._peer`), received into a fresh array as the server does; for the confirmed 1 MiB
upload, the floor of uploads (masked frames into a bare asyncio receiver). Explanatory rows:
the websocket library alone, TCP into a reused array, the floor against TCP.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import numpy as np

import client

from . import _procs
from ._params import MIB
from ._report import Figure, Goal, Stat
from .ceilings import FloorCeiling, TcpCeiling, WsCeiling, timed

# Accepted as measured (bench/README.md, Goals): what a confirmed upload of 1 MiB or less
# reaches of the floor, and 64 streamed uploads of plain TCP; a regression still shows.
CONFIRMED_GOAL = 0.6
STREAMED_GOAL = 0.55

Tick = Callable[[], None]
BURST_BYTES = 8 << 20  # bytes each contender moves in its turn of a repetition, at least one
FLOOR_JUDGED = 1 * MIB  # uploads up to this size are judged against the floor, not TCP
STREAM = 64  # uploads of 1 MiB in a stream, confirmed by one sync, as training code uploads


def _size_name(nbytes: int) -> str:
    return f"{nbytes // MIB} MiB"


def throughput(
    dev: client.RemoteDevice,
    ports: tuple[int, int, int],
    sizes: tuple[tuple[int, int], ...],
    tick: Tick,
) -> list[Figure]:
    """Upload and download float32 tensors of each size, interleaved with the TCP ceiling and
    the upload floor (``ports``: the peer's TCP, websocket and floor ports) and with
    explanatory rows, without goals: the websocket library alone, TCP into a reused array."""
    peers = TcpCeiling(ports[0]), WsCeiling(ports[1]), FloorCeiling(ports[2])
    figures = []
    try:
        for nbytes, reps in sizes:
            times = _measure(dev, *peers, nbytes, reps, tick)
            size = _size_name(nbytes)
            for name, index in (("upload", 0), ("download", 1)):
                ours, tcp, ws = (times[k][index] for k in ("ours", "tcp", "ws"))
                floor = times["floor"][0] if index == 0 else None
                figures += _throughput_figures(f"{name} {size}", nbytes, ours, tcp, ws, floor)
            for name, index in (("upload", 0), ("download", 1)):
                figures.append(
                    _reused_figure(name, nbytes, times["ours"][index], times["reused"][index])
                )
    finally:
        for peer in peers:
            peer.close()
    return figures


Contenders = dict[str, Callable[[], tuple[float, ...]]]
Times = dict[str, tuple[list[float], ...]]


def _measure(
    dev: client.RemoteDevice,
    ceiling: TcpCeiling,
    bare: WsCeiling,
    floor: FloorCeiling,
    nbytes: int,
    reps: int,
    tick: Tick,
) -> Times:
    """Seconds per transfer, upload then download, for each contender: ``ours``
    (Tensorwire), ``tcp`` (plain TCP), ``ws`` (websockets alone), ``floor`` (uploads only)
    and ``reused`` (plain TCP into arrays reused from one repetition to the next, as the
    server reuses freed tensors' memory for uploads and the client its receive buffers for
    downloads). Each repetition gives each contender a turn of :func:`burst` transfers."""
    data = np.random.default_rng(0).random(nbytes // 4, dtype=np.float32)
    target = np.empty(nbytes, dtype=np.uint8)
    xp = client.namespace(dev)
    contenders: Contenders = {
        "ours": lambda: _ours(dev, xp, data),
        "tcp": lambda: (ceiling.upload(data), ceiling.download(nbytes)),
        "ws": lambda: (bare.upload(data), bare.download(nbytes)),
        "floor": lambda: (floor.upload(data),),
        "reused": lambda: (
            ceiling.upload(data, reused=True),
            ceiling.download(nbytes, into=target),
        ),
    }
    return rotated(contenders, reps, burst(nbytes), tick)


def rotated(contenders: Contenders, reps: int, turns: int, tick: Tick) -> Times:
    """``reps`` repetitions, in each of which every contender takes a turn of ``turns`` calls;
    the seconds each call returns, kept by contender (one list per figure of a call)."""
    results: Times = {}
    names = list(contenders)
    for rep in range(reps):
        # Whoever goes first touches fresh memory first, which costs far more than a copy on
        # a VM: rotate the order, so that no contender always pays it.
        for i in range(len(names)):
            name = names[(rep + i) % len(names)]
            for _ in range(turns):
                seconds = contenders[name]()
                kept = results.setdefault(name, tuple([] for _ in seconds))
                for samples, value in zip(kept, seconds, strict=True):
                    samples.append(value)
        tick()
    return results


def burst(nbytes: int) -> int:
    """Transfers of ``nbytes`` in one contender's turn: several for small sizes, whose single
    transfers last about a millisecond and so vary most with the machine's scheduling."""
    return max(1, BURST_BYTES // nbytes)


def _ours(dev: client.RemoteDevice, xp: client.Namespace, data: np.ndarray) -> tuple[float, float]:
    start = time.perf_counter()
    x = xp.asarray(data)
    dev.sync()
    up = time.perf_counter() - start
    down = timed(x.numpy)
    del x
    dev.sync()  # the free travels; nothing of this size stays on the server
    return up, down


def streamed(dev: client.RemoteDevice, tcp_port: int, reps: int, tick: Tick) -> list[Figure]:
    """:data:`STREAM` uploads of 1 MiB, then one ``sync``, as training code uploads batches;
    against plain TCP moving the same bytes the same way (:meth:`TcpCeiling.stream`: every
    upload unacknowledged, into a fresh array the peer holds, then one confirmation). The two
    take turns, the order alternating each repetition."""
    arrays = list(np.random.default_rng(1).random((STREAM, MIB // 4), dtype=np.float32))
    xp = client.namespace(dev)
    ceiling = TcpCeiling(tcp_port)
    contenders: Contenders = {
        "ours": lambda: (_ours_streamed(dev, xp, arrays),),
        "tcp": lambda: (ceiling.stream(arrays),),
    }
    try:
        times = rotated(contenders, reps, 1, tick)
    finally:
        ceiling.close()
    rate, tcp_rate = rates(STREAM * MIB, times["ours"][0], times["tcp"][0])
    return [
        Figure(
            f"upload {STREAM} x 1 MiB float32, then one sync",
            "throughput / plain TCP",
            rate.median / tcp_rate.median,
            Goal(">=", STREAMED_GOAL),
            rate,
            tcp_rate,
            "TCP loopback",
        )
    ]


def _ours_streamed(
    dev: client.RemoteDevice, xp: client.Namespace, arrays: Sequence[np.ndarray]
) -> float:
    start = time.perf_counter()
    held = [xp.asarray(data) for data in arrays]
    dev.sync()
    seconds = time.perf_counter() - start
    del held
    dev.sync()  # the frees travel; the next repetition starts from the same server
    return seconds


def rates(nbytes: int, *times: list[float]) -> list[Stat]:
    """Each list of seconds per transfer of ``nbytes``, as GB/s."""
    return [Stat.of([nbytes / t / 1e9 for t in s], "GB/s") for s in times]


def _throughput_figures(
    name: str,
    nbytes: int,
    ours: list[float],
    tcp: list[float],
    ws: list[float],
    floor: list[float] | None = None,
) -> list[Figure]:
    """Ours and websockets alone against plain TCP; for uploads (``floor`` given), the floor
    (:class:`FloorCeiling`) against plain TCP, explanatory: a server that also parses frames,
    decodes a message, runs it and answers does strictly more per upload. Up to
    :data:`FLOOR_JUDGED`, where the floor itself stays well under plain TCP (what any Python
    websocket server loses on a confirmed upload of that size), ours is judged against the
    floor instead of plain TCP."""
    rate, tcp_rate, ws_rate = rates(nbytes, ours, tcp, ws)
    on_floor = floor is not None and nbytes <= FLOOR_JUDGED
    figures = [
        Figure(
            f"{name} float32",
            "throughput / plain TCP",
            rate.median / tcp_rate.median,
            None if on_floor else Goal(">=", 0.6),
            rate,
            tcp_rate,
            "TCP loopback",
        ),
        Figure(
            f"{name}, websockets alone",
            "throughput / plain TCP",
            ws_rate.median / tcp_rate.median,
            None,
            ws_rate,
            tcp_rate,
            "TCP loopback",
        ),
    ]
    if floor is None:
        return figures
    (floor_rate,) = rates(nbytes, floor)
    figures.append(
        Figure(
            f"{name}, masked frames into bare asyncio",
            "throughput / plain TCP",
            floor_rate.median / tcp_rate.median,
            None,
            floor_rate,
            tcp_rate,
            "TCP loopback",
        )
    )
    if on_floor:
        figures.insert(
            0,
            Figure(
                f"{name} float32",
                "throughput / the floor",
                rate.median / floor_rate.median,
                Goal(">=", CONFIRMED_GOAL),
                rate,
                floor_rate,
                "the floor",
            ),
        )
    return figures


def _reused_figure(name: str, nbytes: int, ours: list[float], reused: list[float]) -> Figure:
    """An explanatory row: transfers against plain TCP into an array the receiver reuses, the
    ceiling without the page faults of fresh memory (which the server's spare memory and the
    client's buffer pool avoid too)."""
    rate, tcp_rate = rates(nbytes, ours, reused)
    return Figure(
        f"{name} {_size_name(nbytes)} float32",
        "throughput / TCP, reused array",
        rate.median / tcp_rate.median,
        None,
        rate,
        tcp_rate,
        "TCP into a reused array",
    )


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
