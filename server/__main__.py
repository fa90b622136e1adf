"""``python -m server``: parse flags, validate the device, and only then bind and serve.

Exit status: 0 after SIGINT or SIGTERM, 2 for a bad command line or a device the server must not
host (one line on stderr, no traceback, nothing bound).
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from typing import NoReturn

import anyio
from pydantic import ValidationError

from protocol import DeviceSpecError, parse_device_spec
from protocol.devices import VALID_KINDS

from .app import Server
from .config import ServerConfig, UnsupportedDeviceError

PROG = "python -m server"


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
    p.add_argument("--token", default=None, help="token clients must present in their hello")
    p.add_argument("--log-level", default="WARNING", help="logging level (default: WARNING)")
    return p


def _fail(message: str) -> NoReturn:
    sys.stderr.write(f"{PROG}: error: {message}\n")
    raise SystemExit(2)


def build_server(argv: list[str] | None = None) -> Server:
    """Parse and validate everything; nothing binds here."""
    args = _parser().parse_args(argv)
    try:
        device = parse_device_spec(args.device)
        config = ServerConfig(device=device, host=args.host, port=args.port, token=args.token)
        return Server(config)
    except (DeviceSpecError, UnsupportedDeviceError) as exc:
        _fail(str(exc))
    except ValidationError as exc:
        first = exc.errors()[0]
        _fail(f"--{first['loc'][0]}: {first['msg']}")


async def _main(server: Server) -> None:
    async with anyio.create_task_group() as tg:
        with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            port = await tg.start(server.serve)
            host = server.config.host
            shown = f"[{host}]" if ":" in host else host
            print(f"listening on ws://{shown}:{port}", flush=True)
            async for _ in signals:
                break
        tg.cancel_scope.cancel()


def main(argv: list[str] | None = None) -> int:
    args_preview = [a for a in (argv if argv is not None else sys.argv[1:])]
    server = build_server(args_preview)
    logging.basicConfig(
        level=logging.WARNING,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    anyio.run(_main, server, backend="asyncio")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
