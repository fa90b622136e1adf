"""Read latency: round trips of reading a one-element tensor.

References, measured in the same run and interleaved block by block with the reads: the floor's
round trip (one small masked frame, the size of a read's request, into the peer's bare asyncio
receiver, which unmasks it and answers with one small frame the size of the read's reply),
and a bare websockets ping-pong with the peer (:mod:`bench._peer`). Explanatory: the same
ping-pong run on a loop thread while the caller waits, which is what two thread hops per call
cost (Tensorwire's client reads its replies in the calling thread to avoid them).
"""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import time

import numpy as np

import client
from protocol.framing import Opcode, apply_mask, frame_header

from ._peer import COMMAND, FLOOR_REQUEST
from ._procs import cpu_seconds
from ._report import Figure, Goal, Stat
from .ceilings import WsCeiling, timed
from .transfer import Tick

PING = b"E" + bytes(63)
READ_GOAL = 1.2  # the read's median against websockets' own ping-pong (bench/README.md, Goals)
BLOCKS = 10  # samples are taken in this many interleaved blocks


class WsPings(WsCeiling):
    """Ping-pongs of a 64-byte message with the peer's websocket server."""

    async def _ping(self) -> float:
        start = time.perf_counter()
        await self.ws.send(PING)
        await self.ws.recv()
        return time.perf_counter() - start

    def pings(self, count: int) -> list[float]:
        """``count`` round trips (after ``count // 10`` to warm up), in seconds, run on the
        event loop in the calling thread."""
        samples = [self.loop.run_until_complete(self._ping()) for _ in range(count + count // 10)]
        return samples[count // 10 :]

    def pings_via_thread(self, count: int) -> list[float]:
        """The same round trips run on a loop thread while this thread waits on a future for
        each: two thread hops per round trip, and nothing else."""
        thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        thread.start()
        samples = []
        try:
            for _ in range(count + count // 10):
                start = time.perf_counter()
                asyncio.run_coroutine_threadsafe(self._ping(), self.loop).result()
                samples.append(time.perf_counter() - start)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            thread.join()
        return samples[count // 10 :]


class FloorRoundTrips:
    """Round trips with the floor of a read (the peer's ``_FloorRoundTrips``): a masked frame
    of :data:`FLOOR_REQUEST` bytes, framed as Tensorwire's client frames a small request (a
    fresh key, one masking copy by :func:`protocol.framing.apply_mask`, header and payload in
    one ``sendmsg``), and the answer read with a blocking socket in the calling thread, as
    that client reads its replies."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.sendall(COMMAND.pack(b"E", 0))  # round trips from now on
        self._payload = bytes(FLOOR_REQUEST)
        self._inbox = memoryview(bytearray(1 << 16))

    def _round_trip(self) -> float:
        inbox, got = self._inbox, 0
        start = time.perf_counter()
        key = os.urandom(4)
        head = frame_header(Opcode.BINARY, True, len(self._payload), key)
        self.sock.sendmsg((head, apply_mask(self._payload, key)))
        while got < 2 or got < 2 + (inbox[1] & 0x7F):  # an unmasked frame under 126 bytes
            n = self.sock.recv_into(inbox[got:])
            if n == 0:
                raise ConnectionError("peer closed")
            got += n
        return time.perf_counter() - start

    def round_trips(self, count: int) -> list[float]:
        """``count`` round trips (after ``count // 10`` to warm up), in seconds."""
        samples = [self._round_trip() for _ in range(count + count // 10)]
        return samples[count // 10 :]

    def close(self) -> None:
        self.sock.close()


def reads(
    dev: client.RemoteDevice,
    ports: tuple[int, int],
    count: int,
    tick: Tick,
    server_pid: int | None = None,
) -> list[Figure]:
    """Round trips of reading a one-element tensor, against a bare websockets ping-pong and
    the floor's round trip (``ports``: the peer's websocket and floor ports); and the
    server's CPU per read (``server_pid``'s, over the blocks of reads)."""
    x = client.namespace(dev).asarray(np.ones(1, dtype=np.float32))
    for _ in range(count // 10):
        x.numpy()  # warm up
    names = ("ours", "floor", "ws", "hopped", "server cpu")
    samples: dict[str, list[float]] = {name: [] for name in names}
    ws, floor = WsPings(ports[0]), FloorRoundTrips(ports[1])
    try:
        block = max(1, count // BLOCKS)
        for i in range(BLOCKS):  # interleaved, so that a change of load hits all four alike
            before = cpu_seconds(server_pid) if server_pid is not None else 0.0
            samples["ours"] += [timed(x.numpy) for _ in range(block)]
            if server_pid is not None:
                samples["server cpu"].append((cpu_seconds(server_pid) - before) / block)
            samples["floor"] += floor.round_trips(block)
            samples["ws"] += ws.pings(block)
            samples["hopped"] += ws.pings_via_thread(block)
            if i % (BLOCKS // 2) == 0:
                tick()
    finally:
        ws.close()
        floor.close()
    cpu = samples.pop("server cpu")
    stats = {k: Stat.of([t * 1e6 for t in v], "us", p99=True) for k, v in samples.items()}
    figures = _figures(stats["ours"], stats["floor"], stats["ws"], stats["hopped"])
    if cpu:
        per_read = Stat.of([t * 1e6 for t in cpu], "us")
        figures.append(
            Figure(
                "read one-element tensor",
                "server CPU per read (us)",
                per_read.median,
                None,
                per_read,
            )
        )
    return figures


def _figures(rtt: Stat, floor: Stat, ws: Stat, hopped: Stat) -> list[Figure]:
    """Judged: the read's median against the ping-pong's and the floor's.
    Explanatory: the p99 against the ping-pong's, and the ping-pong through a loop thread."""
    assert rtt.p99 is not None and ws.p99 is not None
    name, median = "read one-element tensor", "median round trip / ping-pong"
    return [
        Figure(name, median, rtt.median / ws.median, Goal("<=", READ_GOAL), rtt, ws, "websockets"),
        Figure(
            name,
            "median round trip / floor round trip",
            rtt.median / floor.median,
            None,  # explanatory: no Python asyncio server reaches a bare socket's echo
            rtt,
            floor,
            "the floor",
        ),
        Figure(name, "p99 round trip / ping-pong", rtt.p99 / ws.p99, None, rtt, ws, "websockets"),
        Figure(
            "ping-pong via a loop thread",
            median,
            hopped.median / ws.median,
            None,
            hopped,
            ws,
            "websockets",
        ),
    ]
