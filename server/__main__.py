"""``python -m server``: parse flags, validate the device, and only then bind and serve.

Exit status: 0 after SIGINT or SIGTERM, 2 for a bad command line, a device the server must not
host, or an unsafe exposure (a non-loopback bind without a token): one line on stderr, no
traceback, nothing bound. Warnings (``--insecure``, a token without TLS) go to stderr, one line
each, before the ``listening on`` line.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import signal
import sys
import threading
from typing import NoReturn

import anyio
from pydantic import ValidationError

from protocol import DeviceSpecError, parse_device_spec
from protocol.devices import VALID_KINDS

from .app import Server
from .config import InsecureConfigError, ServerConfig, UnsupportedDeviceError

PROG = "python -m server"
TOKEN_ENV = "TENSOR_SERVER_TOKEN"  # noqa: S105 - the variable's name, not a token
_SIZE = re.compile(r"^\s*(\d+)\s*([kmgt]i?b?)?\s*$", re.IGNORECASE)
_UNITS = {"k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}


def byte_size(text: str) -> int:
    """``1048576``, ``64MiB``, ``2G``: a byte count (binary units)."""
    match = _SIZE.match(text)
    if match is None:
        raise argparse.ArgumentTypeError(f"not a byte size: {text!r} (e.g. 1048576, 64MiB, 2GiB)")
    number, unit = match.groups()
    return int(number) * (_UNITS[unit[0].lower()] if unit else 1)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, not usage + message
        self.exit(2, f"{PROG}: error: {message} (see --help)\n")


def _parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog=PROG, description="Serve numpy tensor ops to Tensorwire clients over websockets."
    )
    p.add_argument(
        "--device",
        default="ndarray",
        help=f"device to host (default: ndarray); kinds: {VALID_KINDS}; only ndarray can be hosted",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1)")
    p.add_argument(
        "--port", type=int, default=8765, help="port to bind; 0 picks a free one (default: 8765)"
    )
    p.add_argument(
        "--token",
        default=os.environ.get(TOKEN_ENV) or None,
        help=f"token clients must present (default: ${TOKEN_ENV}); required off loopback",
    )
    p.add_argument("--log-level", default="WARNING", help="logging level (default: WARNING)")
    _security_flags(p)
    return p


def _security_flags(p: argparse.ArgumentParser) -> None:
    """Flags for ServerConfig's security and limit fields; None keeps the config default."""
    g = p.add_argument_group("security and limits (README: Security)")
    g.add_argument(
        "--insecure",
        action="store_true",
        default=None,
        help="allow a non-loopback bind without a token (loudly)",
    )
    g.add_argument("--tls-cert", help="PEM certificate chain: serve wss://")
    g.add_argument("--tls-key", help="PEM private key for --tls-cert")
    g.add_argument(
        "--allow-origin",
        dest="allowed_origins",
        action="append",
        metavar="ORIGIN",
        help="a browser Origin to allow (repeatable); none by default",
    )
    g.add_argument("--max-connections", type=int, help="open connections (default 256)")
    g.add_argument("--handshake-timeout", type=float, help="seconds to upgrade and hello (10)")
    g.add_argument("--idle-timeout", type=float, help="seconds of client silence (600)")
    g.add_argument("--ping-interval", type=float, help="keepalive ping interval, s (20)")
    g.add_argument("--ping-timeout", type=float, help="keepalive pong timeout, s (20)")
    g.add_argument("--send-timeout", type=float, help="seconds a client may take a reply (300)")
    g.add_argument("--write-limit", type=byte_size, help="outgoing buffer per client (1MiB)")
    g.add_argument("--max-queued", type=int, help="messages queued per session (8)")
    g.add_argument("--max-message-size", type=byte_size, help="one websocket message (2GiB)")
    g.add_argument("--max-header-size", type=byte_size, help="one message header (16MiB)")
    g.add_argument("--max-op-bytes", type=byte_size, help="one op's output (2GiB)")
    g.add_argument("--max-ndim", type=int, help="dimensions of any tensor (64)")
    g.add_argument("--memory-budget", type=byte_size, help="tensor bytes, all sessions (RAM/2)")
    g.add_argument("--session-quota", type=byte_size, help="tensor bytes per session (budget/4)")
    g.add_argument("--op-deadline", type=float, help="seconds one op may run (600)")


def _fail(message: str) -> NoReturn:
    sys.stderr.write(f"{PROG}: error: {message}\n")
    raise SystemExit(2)


def build_server(argv: list[str] | None = None) -> Server:
    """Parse and validate everything; nothing binds here."""
    args = _parser().parse_args(argv)
    try:
        device = parse_device_spec(args.device)
        given = {k: v for k, v in vars(args).items() if v is not None}
        given.pop("log_level", None)
        if "allowed_origins" in given:
            given["allowed_origins"] = tuple(given["allowed_origins"])
        config = ServerConfig(**{**given, "device": device})
        return Server(config)
    except (DeviceSpecError, UnsupportedDeviceError, InsecureConfigError) as exc:
        _fail(str(exc))
    except ValidationError as exc:
        first = exc.errors()[0]
        _fail(f"--{str(first['loc'][0]).replace('_', '-')}: {first['msg']}")


async def _main(server: Server) -> None:
    async with anyio.create_task_group() as tg:
        with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            port = await tg.start(server.serve)
            host = server.config.host
            shown = f"[{host}]" if ":" in host else host
            print(f"listening on {server.scheme}://{shown}:{port}", flush=True)
            async for _ in signals:
                break
        tg.cancel_scope.cancel()


def main(argv: list[str] | None = None) -> int:
    args_preview = [a for a in (argv if argv is not None else sys.argv[1:])]
    server = build_server(args_preview)
    for warning in server.warnings:
        sys.stderr.write(f"{PROG}: {warning}\n")
    logging.basicConfig(
        level=logging.WARNING,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    anyio.run(_main, server, backend="asyncio")
    if threading.active_count() > 1:  # a worker thread still inside numpy: do not wait for it
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
