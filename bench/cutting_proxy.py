"""A loopback TCP proxy that cuts its connections, for fault tests and the fault soak.

:class:`CuttingProxy` listens on ``127.0.0.1`` (a free port) and forwards each connection it
accepts to ``target``, both directions, two threads per connection. While :attr:`cutting` is
true it cuts connections according to its policy:

- ``after_bytes=(lo, hi)``: each connection is cut once it has forwarded N bytes, both
  directions together, N drawn uniformly from ``[lo, hi]`` when it is accepted. The chunk that
  crosses N is forwarded only up to N, so cuts land mid-frame.
- ``every=(lo, hi)``: every T seconds, T drawn uniformly from ``[lo, hi]`` each time, every
  open connection is cut.
- ``max_cuts``: after that many cuts the proxy stops cutting (:attr:`cutting` becomes false),
  so that work whose every attempt would be cut still ends.

A cut is abrupt by default (``mode="reset"``): both sockets are closed with ``SO_LINGER`` 0,
which sends a TCP RST, whatever was in flight is lost. ``mode="blackhole"`` instead stops
forwarding and leaves both sockets open and silent, as a dead network path does, until the
proxy closes. Draws come from ``random.Random(seed)``. Standard library only.
"""

from __future__ import annotations

import random
import socket
import struct
import threading
from typing import Literal

CHUNK = 1 << 20  # bytes read at once: a 64 MiB upload in 64 reads
POLL = 0.1  # seconds a blocked read or write waits before it looks for a cut
Mode = Literal["reset", "blackhole"]


class _Link:
    """One accepted connection and its connection to the target."""

    def __init__(self, proxy: CuttingProxy, inbound: socket.socket, budget: int | None) -> None:
        self.proxy = proxy
        self.inbound = inbound
        self.outbound: socket.socket | None = None
        self.budget = budget  # bytes left before the cut; None: no cut by bytes
        self.cut = threading.Event()  # set: the pumps forward nothing more
        self.silent = False  # cut as a blackhole: the sockets stay open until the proxy closes
        self.claimed = False  # its cut is counted (the proxy's lock)
        self.pumps_left = 2
        self.lock = threading.Lock()

    def start(self) -> None:
        threading.Thread(target=self._open, name="proxy-up", daemon=True).start()

    def _open(self) -> None:
        try:
            self.outbound = socket.create_connection(self.proxy.target, timeout=10)
        except OSError:
            self.close(abrupt=True)
            return
        for sock in (self.inbound, self.outbound):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.settimeout(POLL)
        down = (self.outbound, self.inbound, "down")
        threading.Thread(target=self._pump, args=down, name="proxy-down", daemon=True).start()
        self._pump(self.inbound, self.outbound, "up")

    def allow(self, size: int) -> tuple[int, bool]:
        """How many of ``size`` bytes may be forwarded, and whether the link is cut after."""
        with self.lock:
            if self.cut.is_set() or self.budget == 0:  # 0: its cut is on the way
                return 0, False
            if self.budget is None or size < self.budget:
                self.budget = None if self.budget is None else self.budget - size
                return size, False
            if self.proxy.claim_cut(self):
                allowed, self.budget = self.budget, 0
                return allowed, True
            self.budget = None  # the proxy stopped cutting
            return size, False

    def _pump(self, src: socket.socket, dst: socket.socket, way: str) -> None:
        buffer = memoryview(bytearray(CHUNK))
        try:
            while not self.cut.is_set():
                try:
                    size = src.recv_into(buffer)
                except TimeoutError:
                    continue
                if size == 0:
                    if not self.cut.is_set():  # an orderly end, not a cut's wake-up: pass it on
                        dst.shutdown(socket.SHUT_WR)
                    return
                allowed, last = self.allow(size)
                self._send(dst, buffer[:allowed])
                self.proxy.count(way, allowed)
                if last:
                    self.stop()
        except OSError:
            self.cut.set()  # a side went away: end the link, no cut counted
        finally:
            self._pump_done()

    def _send(self, dst: socket.socket, data: memoryview) -> None:
        while data and not self.cut.is_set():
            try:
                sent = dst.send(data)
            except TimeoutError:
                continue
            data = data[sent:]

    def _pump_done(self) -> None:
        with self.lock:
            self.pumps_left -= 1
            last = self.pumps_left == 0
        if last and (not self.silent or not self.proxy.open):
            self.close(abrupt=self.cut.is_set())

    def stop(self) -> None:
        """Forward nothing more (the pumps see it within :data:`POLL` seconds); in ``reset``
        mode the pumps then close both sockets abruptly."""
        self.silent = self.proxy.mode == "blackhole"
        self.cut.set()
        for sock in (self.inbound, self.outbound):
            if sock is not None and not self.silent:
                try:
                    sock.shutdown(socket.SHUT_RD)  # wakes a blocked read; sends nothing
                except OSError:
                    pass

    def close(self, abrupt: bool) -> None:
        """Close both sockets: with ``SO_LINGER`` 0 (a TCP RST) if ``abrupt``."""
        for sock in (self.inbound, self.outbound):
            if sock is None:
                continue
            if abrupt:
                try:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                except OSError:
                    pass
            sock.close()
        self.proxy.forget(self)


class CuttingProxy:
    """``CuttingProxy(target, after_bytes=..., every=..., seed=...)``; :attr:`port` is where
    it listens, :attr:`cuts`, :attr:`bytes_up` (towards the target), :attr:`bytes_down` and
    :attr:`connections` what it did. Use it as a context manager (or call :meth:`close`).
    """

    def __init__(
        self,
        target: tuple[str, int],
        *,
        after_bytes: tuple[int, int] | None = None,
        every: tuple[float, float] | None = None,
        max_cuts: int | None = None,
        mode: Mode = "reset",
        seed: int = 0,
    ) -> None:
        self.target = target
        self.after_bytes = after_bytes
        self.every = every
        self.max_cuts = max_cuts
        self.mode: Mode = mode
        self.cutting = True
        self.open = True
        self.cuts = 0
        self.bytes_up = 0
        self.bytes_down = 0
        self.connections = 0
        self._random = random.Random(seed)
        self._lock = threading.Lock()
        self._links: set[_Link] = set()
        self._stopped = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        threading.Thread(target=self._accept, name="proxy-accept", daemon=True).start()
        if every is not None:
            threading.Thread(target=self._timer, name="proxy-timer", daemon=True).start()

    def url(self, scheme: str = "ws") -> str:
        """``scheme://127.0.0.1:PORT``: the proxy's address as a URL."""
        return f"{scheme}://127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while True:
            try:
                inbound, _ = self._listener.accept()
            except OSError:
                return  # closed
            with self._lock:
                budget = None
                if self.after_bytes is not None:
                    budget = self._random.randint(*self.after_bytes)
                link = _Link(self, inbound, budget)
                self._links.add(link)
                self.connections += 1
            link.start()

    def _timer(self) -> None:
        assert self.every is not None
        while True:
            with self._lock:
                wait = self._random.uniform(*self.every)
            if self._stopped.wait(wait):
                return
            with self._lock:
                links = list(self._links)
            for link in links:
                self.cut_link(link)

    def count(self, way: str, size: int) -> None:
        with self._lock:
            if way == "up":
                self.bytes_up += size
            else:
                self.bytes_down += size

    def claim_cut(self, link: _Link) -> bool:
        """Count a cut of ``link``: False if the proxy is not cutting or it was cut already."""
        with self._lock:
            if not self.cutting or link.claimed or link not in self._links:
                return False
            link.claimed = True
            self.cuts += 1
            if self.max_cuts is not None and self.cuts >= self.max_cuts:
                self.cutting = False
            return True

    def cut_link(self, link: _Link) -> None:
        """Cut ``link`` now, if the proxy is cutting and it was not cut already."""
        if self.claim_cut(link):
            link.stop()

    def cut_all(self) -> int:
        """Cut every connection now (if the proxy is cutting); how many were cut."""
        with self._lock:
            links = list(self._links)
        cut = 0
        for link in links:
            if self.claim_cut(link):
                link.stop()
                cut += 1
        return cut

    def forget(self, link: _Link) -> None:
        with self._lock:
            self._links.discard(link)

    def close(self) -> None:
        """Stop listening and close every connection (a silent one at once, the others as
        their pumps end)."""
        self.open = False
        self._stopped.set()
        self._listener.close()
        with self._lock:
            links = list(self._links)
        for link in links:
            link.stop()
            with link.lock:
                idle = link.pumps_left == 0
            if idle:
                link.close(abrupt=True)

    def __enter__(self) -> CuttingProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def address(url: str) -> tuple[str, int]:
    """The host and port of a server's URL (``ws://host:port/...``), a proxy's ``target``."""
    host, _, port = url.split("://", 1)[1].split("/", 1)[0].rpartition(":")
    return host.strip("[]"), int(port)
