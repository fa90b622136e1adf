"""``python -m server``: read settings, validate the device, and only then bind and serve.

Every :class:`~server.config.ServerConfig` field is a flag here and a ``TENSOR_SERVER_*``
variable (``--help`` lists both); a flag beats the variable. ``--check-config`` validates
everything, prints the effective settings (token hidden; the memory budget and session quota as
the numbers that will apply) and exits 0 without binding.

Exit status: 0 after SIGINT or SIGTERM (the first one drains: see :meth:`Server.drain`; a second
one cuts the drain short), 2 for a bad command line, a bad setting, a device the server must
not host, or an unsafe exposure (a non-loopback bind without a token; unreadable TLS files):
one line on stderr, no traceback, nothing bound; 1 when the address cannot be bound (one line
on stderr). Warnings (``--insecure``, a token without TLS off loopback) go to stderr, one line
each, before the ``listening on`` line.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import signal
import sys
import threading
from typing import Any, NoReturn

import anyio
import prometheus_client
from pydantic import ValidationError
from pydantic.fields import FieldInfo
from pydantic_settings import SettingsError

from protocol import DeviceSpecError
from protocol.version import version_text

from . import logs
from .app import Server
from .config import ENV_PREFIX, InsecureConfigError, ServerConfig, UnsupportedDeviceError
from .setting_values import NEW_ENV_PREFIX

PROG = "python -m server"
_SHOWN_DEFAULTS = {"device": "ndarray", "worker_threads": "the number of cores"}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, not usage + message
        self.exit(2, f"{PROG}: error: {message} (see --help)\n")


def flag(name: str) -> str:
    """The command-line flag of a settings field: ``max_message_size`` -> ``--max-message-size``."""
    return "--" + name.replace("_", "-")


def env_var(name: str) -> str:
    """The environment variable of a settings field: ``port`` -> ``TENSOR_SERVER_PORT``."""
    return ENV_PREFIX + name.upper()


def _help(name: str, info: FieldInfo) -> str:
    default = _SHOWN_DEFAULTS.get(name, info.default)
    shown = "unset" if default is None else default
    text = f"{info.description} (default: {shown}) [env: {env_var(name)}]"
    return text.replace("%", "%%")  # argparse formats help with %


def _metavar(name: str, info: FieldInfo) -> str:
    choices = getattr(info.annotation, "__args__", None)
    if choices and all(isinstance(c, str) for c in choices):
        return "{" + ",".join(choices) + "}"
    return name.upper()


def parser(model: type[ServerConfig] = ServerConfig) -> argparse.ArgumentParser:
    """A flag for every field of ``model``, plus ``--check-config``. Flags not given are absent
    from the parsed namespace, so the environment and the defaults apply to them. A ``bool``
    field ``x`` becomes ``--x``/``--no-x``."""
    p = _Parser(
        prog=PROG,
        description="Serve numpy tensor ops to Tensorwire clients over websockets. Every flag "
        f"can also be set with the environment variable shown ({ENV_PREFIX}*), or the same "
        f"with the prefix {NEW_ENV_PREFIX} (which wins where both are set); a flag wins over "
        "both.",
        argument_default=argparse.SUPPRESS,
    )
    for name, info in model.model_fields.items():
        if info.annotation is bool:
            p.add_argument(
                flag(name), action=argparse.BooleanOptionalAction, help=_help(name, info)
            )
        else:
            p.add_argument(
                flag(name), dest=name, metavar=_metavar(name, info), help=_help(name, info)
            )
    p.add_argument("--version", action="version", version=version_text())
    p.add_argument(
        "--check-config",
        action="store_true",
        default=False,
        help="validate the settings (flags, environment, token file, device), print them with "
        "the token hidden, and exit 0 without binding; exit 2 if they are invalid",
    )
    return p


def _fail(message: str, status: int = 2) -> NoReturn:
    sys.stderr.write(f"{PROG}: error: {message}\n")
    raise SystemExit(status)


def _os_error(exc: BaseException) -> OSError | None:
    """The OSError (a failed bind) inside ``exc``, unwrapping single-exception groups."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc if isinstance(exc, OSError) else None


def _describe(exc: ValidationError) -> str:
    """One line for the first error, naming the flag and its variable."""
    first = exc.errors()[0]
    cause = first.get("ctx", {}).get("error")
    if isinstance(cause, DeviceSpecError):
        return str(cause)  # already one line naming the spec and the valid kinds
    message = str(cause) if isinstance(cause, ValueError) else first["msg"]
    if not first["loc"]:
        return message
    name = str(first["loc"][0])
    return f"{flag(name)} ({env_var(name)}): {message}"


def _settings(values: dict[str, Any]) -> ServerConfig:
    try:
        return ServerConfig(**values)
    except ValidationError as exc:
        _fail(_describe(exc))
    except SettingsError as exc:
        _fail(str(exc))


def build_server(argv: list[str] | None = None) -> Server:
    """Parse flags, read the environment and validate everything; nothing binds here.
    Exits 2 with one line on stderr for anything invalid."""
    values = vars(parser().parse_args(argv))
    values.pop("check_config")
    config = _settings(values)
    try:
        return Server(config)
    except (DeviceSpecError, UnsupportedDeviceError, InsecureConfigError) as exc:
        _fail(str(exc))


def describe_config(config: ServerConfig) -> str:
    """The effective settings as one JSON line, with the tokens hidden: what the server will
    apply, so an unset memory budget or session quota shows the number its default works out
    to on this machine."""
    shown = config.model_dump(mode="json")
    shown["memory_budget"] = config.effective_memory_budget
    shown["session_quota"] = config.effective_session_quota
    for secret in ("token", "peer_token"):
        if shown[secret] is not None:
            shown[secret] = "<hidden>"
    shown["device"] = str(config.device)
    return json.dumps(shown, sort_keys=True)


async def _main(server: Server) -> None:
    async with anyio.create_task_group() as tg:
        with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            port = await tg.start(server.serve)
            host = server.config.host
            shown = f"[{host}]" if ":" in host else host
            print(f"listening on {server.scheme}://{shown}:{port}", flush=True)
            async for _ in signals:
                break
            async with anyio.create_task_group() as draining:

                async def second_signal() -> None:
                    async for _ in signals:
                        draining.cancel_scope.cancel()  # a second signal: stop waiting

                draining.start_soon(second_signal)
                await server.drain()
                draining.cancel_scope.cancel()
        tg.cancel_scope.cancel()


def main(argv: list[str] | None = None) -> int:
    args = list(argv if argv is not None else sys.argv[1:])
    check = parser().parse_args(args).check_config
    server = build_server(args)
    if check:
        print(f"config ok: {describe_config(server.config)}", flush=True)
        return 0
    logs.configure(server.config.log_level, server.config.log_format, server.config.log_rate)
    for warning in server.warnings:  # one WARNING event each, in the chosen log format
        logging.getLogger("tensorwire.server").warning(
            "insecure", extra=logs.fields(reason=warning)
        )
    prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]  # *_created: noise
    # A large batch is many small objects (its ops), and CPython's default collects its youngest
    # generation every 700 allocations: under a stream of 100k-op batches, full collections over
    # them hold the event loop for long (bench/REASONS.md, 'Garbage collector thresholds').
    # What the server keeps at startup is frozen out of every collection.
    gc.freeze()
    gc.set_threshold(50_000, 20, 100)
    try:
        anyio.run(_main, server, backend="asyncio")
    except (OSError, BaseExceptionGroup) as exc:
        error = _os_error(exc)
        if error is None:
            raise
        _fail(str(error), status=1)  # e.g. the port is in use: one line, no traceback
    if threading.active_count() > 1:  # a worker thread still inside numpy: do not wait for it
        logging.shutdown()  # the log's last line: what it dropped, if anything
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
