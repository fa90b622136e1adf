"""A well-behaved session beside an attack: how long its reads and ``/healthz`` wait."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np

import client

from .ops_helpers import http_get
from .servers import ServerProcess


@contextmanager
def waits_meanwhile(server: ServerProcess) -> Iterator[list[float]]:
    """While the block runs, another session reads a one-element tensor and ``/healthz`` over
    and over (the read checked); yields the seconds each pair took, filled in as they come."""
    with client.RemoteDevice(server.url) as victim:
        one = client.namespace(victim).asarray(np.ones(1))
        one.numpy()
        waits: list[float] = []
        done = threading.Event()

        def probe() -> None:
            while not done.is_set():
                started = time.monotonic()
                np.testing.assert_array_equal(one.numpy(), np.ones(1))
                assert http_get(server.port, "/healthz")[0] == 200
                waits.append(time.monotonic() - started)

        prober = threading.Thread(target=probe)
        prober.start()
        try:
            yield waits
        finally:
            done.set()
            prober.join()
