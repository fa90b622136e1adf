"""Refused messages must cost nothing: an attacker that sends large headers the server refuses,
and reconnects each time, must not grow the server's memory (issue 17). The server collects
garbage rarely (``server/__main__.py``) and not when a connection is lost, so neither a
refused message nor a closed connection may leave what it held in a reference cycle
(bench/REASONS.md, 'Collecting closed connections')."""

from __future__ import annotations

import time

import numpy as np
import pytest

import client
from bench._procs import rss
from protocol import Batch
from protocol.codec import encode, to_frames
from protocol.ops import AnyOp, Binary

from .servers import run_server

pytestmark = pytest.mark.server

MIB = 2**20


def _refused_header() -> bytes:
    """A 7.7 MB header of 100k ops whose first op names no operation: refused by the sliced
    validation at its first piece (``bad_message``)."""
    ops: list[AnyOp] = [Binary(op="add", out=10**12 + i, x1=1, x2=1) for i in range(100_000)]
    frames = to_frames(encode(Batch(ops=ops)))
    whole = frames if isinstance(frames, bytes) else b"".join(bytes(f) for f in frames)
    return whole.replace(b'"op":"add"', b'"op":"adx"', 1)


def test_refused_headers_on_new_connections_do_not_grow_the_server() -> None:
    bad = _refused_header()
    with run_server("--memory-budget", "256MiB", "--session-quota", "64MiB") as proc:
        time.sleep(0.5)
        peak, deadline, refused = rss(proc.pid), time.monotonic() + 10, 0
        while time.monotonic() < deadline:
            with client.RemoteDevice(proc.url) as dev:
                transport = dev._conn._ws  # noqa: SLF001 - raw messages, as an attacker's
                for _ in range(20):
                    with transport.send_lock:
                        transport.send(bad)
                try:
                    dev.sync()
                except client.ServerProtocolError:
                    refused += 1
            peak = max(peak, rss(proc.pid))
        assert refused > 0
        assert peak < 1024 * MIB, f"server RSS reached {peak / MIB:.0f} MiB"
        with client.RemoteDevice(proc.url) as dev:  # and the server still serves
            assert float(client.namespace(dev).sum(client.namespace(dev).asarray(np.ones(3)))) == 3
