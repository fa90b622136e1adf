"""``tensorwire``: everyday commands for a Tensorwire server, from the client's side.

::

    tensorwire version              # this installation's version and protocol
    tensorwire ping [URL]           # connect, time round trips, show the server's version
    tensorwire stats [URL]          # the server's counts and metrics, as a table

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

from prometheus_client.parser import text_string_to_metric_families

from protocol.version import version_text

from ._environment import server_token, server_url
from .device import RemoteDevice
from .errors import TensorwireError

PROG = "tensorwire"
HEALTH_TIMEOUT = 5.0  # seconds GET /healthz may take


def _http(url: str, path: str) -> str:
    """``url``'s ``path`` over http (``ws://``) or https (``wss://``): the server's port."""
    parts = urlsplit(url)
    scheme = "https" if parts.scheme == "wss" else "http"
    return urlunsplit((scheme, parts.netloc, path, "", ""))


def health(url: str, ca_file: str | None = None) -> dict[str, Any]:
    """The server's ``GET /healthz`` answer (status, protocol, device, version): the same port
    as its websocket, over http (``ws://``) or https (``wss://``). 503 while draining still
    answers.

    Raises:
        OSError: no answer, or not JSON.
    """
    target = _http(url, "/healthz")
    context = _context(target, ca_file)
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


def _context(target: str, ca_file: str | None) -> ssl.SSLContext | None:
    return ssl.create_default_context(cafile=ca_file) if target.startswith("https:") else None


def server_metrics(url: str, token: str | None, ca_file: str | None) -> dict[str, float] | str:
    """The unlabelled series of the server's ``GET /metrics``, labelled ones summed, by sample
    name; or why there are none (one line: served on another port, or refused)."""
    target = _http(url, "/metrics")
    request = urllib.request.Request(target)  # noqa: S310 - http(s) of the user's server
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(  # noqa: S310 - as above
            request, timeout=HEALTH_TIMEOUT, context=_context(target, ca_file)
        ) as r:
            text = r.read().decode()
    except urllib.error.HTTPError as exc:
        return f"GET /metrics: HTTP {exc.code} (--metrics-port serves it on a port of its own)"
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
    return totals


def _metric_rows(found: dict[str, float] | str) -> list[tuple[str, str]]:
    if isinstance(found, str):
        return [("metrics", found)]
    rows = [
        ("sessions opened", f"{found.get('tensorwire_sessions_opened_total', 0):.0f}"),
        ("ops run", f"{found.get('tensorwire_ops_total', 0):.0f}"),
        ("ops failed", f"{found.get('tensorwire_op_errors_total', 0):.0f}"),
        ("refusals", f"{found.get('tensorwire_refusals_total', 0):.0f}"),
    ]
    if "tensorwire_memory_budget_bytes" in found:
        rows.append(("memory budget", _size(int(found["tensorwire_memory_budget_bytes"]))))
    if "process_resident_memory_bytes" in found:
        rows += [
            ("resident memory", _size(int(found["process_resident_memory_bytes"]))),
            ("CPU seconds", f"{found['process_cpu_seconds_total']:.1f}"),
            ("up for", f"{time.time() - found['process_start_time_seconds']:.0f} s"),
        ]
    return rows


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


def _token(args: argparse.Namespace) -> str | None:
    """--token-file's token, else the environment's (``client._environment``)."""
    return server_token(Path(args.token_file).read_text().strip() if args.token_file else None)


def _open(args: argparse.Namespace) -> RemoteDevice:
    return RemoteDevice(args.url, token=_token(args), ca_file=args.ca_file)


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
    """The server's health answer, the counts a new session's ``stats`` reports and the
    server's metrics (when ``/metrics`` is on its port)."""
    with _open(args) as dev:
        counts = dev.stats()
        url, server_id, devices = dev.url, dev.server_id, dev.device_count
    said = health(url, args.ca_file)
    found = server_metrics(url, _token(args), args.ca_file)
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
            *_metric_rows(found),
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
