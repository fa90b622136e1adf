"""``tensorwire``: everyday commands for a Tensorwire server, from the client's side.

::

    tensorwire version              # this installation's version and protocol
    tensorwire ping [URL]           # connect, time round trips, show the server's version
    tensorwire stats [URL]          # the server's and this session's counts, as a table

``URL`` defaults to ``TENSORWIRE_URL``; the token to ``TENSORWIRE_TOKEN`` or
``TENSORWIRE_TOKEN_FILE`` (``client._environment``), or ``--token-file``. Exit status 0 on
success, 2 (one line on stderr) when the server cannot be reached or refuses the session.
"""

from __future__ import annotations

import argparse
import json
import ssl
import statistics
import sys
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from protocol.version import version_text

from ._environment import server_url
from .device import RemoteDevice
from .errors import TensorwireError

PROG = "tensorwire"
HEALTH_TIMEOUT = 5.0  # seconds GET /healthz may take


def health(url: str, ca_file: str | None = None) -> dict[str, Any]:
    """The server's ``GET /healthz`` answer (status, protocol, device, version): the same port
    as its websocket, over http (``ws://``) or https (``wss://``). 503 while draining still
    answers.

    Raises:
        OSError: no answer, or not JSON.
    """
    parts = urlsplit(url)
    scheme = "https" if parts.scheme == "wss" else "http"
    target = urlunsplit((scheme, parts.netloc, "/healthz", "", ""))
    context = ssl.create_default_context(cafile=ca_file) if scheme == "https" else None
    try:
        # the URL is the user's server, http(s) only (the scheme is set above)
        with urllib.request.urlopen(target, timeout=HEALTH_TIMEOUT, context=context) as r:  # noqa: S310
            body = r.read(4096)
    except urllib.error.HTTPError as exc:  # 503: draining, with the same body
        body = exc.read(4096)
    try:
        answer: dict[str, Any] = json.loads(body)
    except ValueError as exc:
        raise OSError(f"{target}: not a Tensorwire health answer") from exc
    return answer


def _size(n: int) -> str:
    """``n`` bytes in the largest binary unit that keeps it at or above 1."""
    value, unit = float(n), "B"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            break
        value /= 1024
    return f"{n} B" if unit == "B" else f"{value:.1f} {unit} ({n} B)"


def table(rows: Sequence[tuple[str, str]]) -> str:
    """Two aligned columns, one row a line."""
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name.ljust(width)}  {value}" for name, value in rows)


def _open(args: argparse.Namespace) -> RemoteDevice:
    token = Path(args.token_file).read_text().strip() if args.token_file else None
    return RemoteDevice(args.url, token=token, ca_file=args.ca_file)


def ping(args: argparse.Namespace) -> str:
    """Connect (timed), time ``--count`` round trips (syncs), and name the server."""
    started = time.perf_counter()
    with _open(args) as dev:
        connected = time.perf_counter() - started
        trips = []
        for _ in range(args.count):
            started = time.perf_counter()
            dev.sync()
            trips.append(time.perf_counter() - started)
        url, server_id = dev.url, dev.server_id
    said = health(url, args.ca_file)
    ms = [t * 1000 for t in trips]
    return (
        f"{url}: tensorwire {said.get('version', '?')} (protocol {said.get('protocol', '?')}), "
        f"device {said.get('device', '?')}, {said.get('status', '?')}, server {server_id}\n"
        f"connected in {connected * 1000:.1f} ms; round trip min {min(ms):.2f} ms, median "
        f"{statistics.median(ms):.2f} ms, max {max(ms):.2f} ms ({len(ms)} syncs)"
    )


def stats(args: argparse.Namespace) -> str:
    """The server's health answer and the counts a new session's ``stats`` reports."""
    with _open(args) as dev:
        counts = dev.stats()
        url, server_id, devices = dev.url, dev.server_id, dev.device_count
    said = health(url, args.ca_file)
    return table(
        [
            ("server", url),
            ("version", f"{said.get('version', '?')} (protocol {said.get('protocol', '?')})"),
            ("status", str(said.get("status", "?"))),
            ("server id", server_id),
            ("devices", f"{devices} ({said.get('device', '?')})"),
            ("open sessions", str(counts.connections)),
            ("tensor bytes held, all sessions", _size(counts.server_tensor_bytes)),
            ("this session's tensors", str(counts.tensors)),
            ("this session's tensor bytes", _size(counts.tensor_bytes)),
            ("this session's failed tensors", str(counts.failed)),
        ]
    )


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    p.add_argument("--version", action="version", version=version_text())
    commands = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    commands.add_parser("version", help="print this installation's version and protocol")
    for name, about in (("ping", "time round trips to a server"), ("stats", "a server's counts")):
        command = commands.add_parser(name, help=about, description=about)
        command.add_argument(
            "url", nargs="?", default=None, help="ws://HOST:PORT (default: $TENSORWIRE_URL)"
        )
        command.add_argument(
            "--token-file", default=None, help="file holding the token (default: the environment)"
        )
        command.add_argument(
            "--ca-file", default=None, help="PEM CA certificates for wss:// (default: the system's)"
        )
        if name == "ping":
            command.add_argument("--count", type=int, default=5, help="round trips (default: 5)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.command == "version":
        print(version_text())
        return 0
    if getattr(args, "count", 1) < 1:
        print(f"{PROG}: error: --count must be at least 1", file=sys.stderr)
        return 2
    try:
        args.url = server_url(args.url)
        print(ping(args) if args.command == "ping" else stats(args), flush=True)
    except (TensorwireError, OSError, ValueError) as exc:
        print(f"{PROG} {args.command}: error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
