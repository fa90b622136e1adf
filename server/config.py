"""Server configuration and the startup validator.

Rule: imports ``protocol`` and pydantic only; nothing here binds, spawns or starts a loop.

The validator is the seed of this project (from Burn's remote backend): a server must never host
a *remote* device (it would forward ops to another server, forever) nor a *capture* device (it
records ops instead of executing them). It runs before anything binds.
"""

from __future__ import annotations

import ipaddress
import os
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from protocol import CaptureSpec, DeviceSpec, NdArraySpec, RemoteSpec


class UnsupportedDeviceError(ValueError):
    """The server was asked to host a device it must never host (remote or capture)."""


class InsecureConfigError(ValueError):
    """A configuration that would expose the server unsafely (see :func:`validate_security`)."""


def _physical_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # pragma: no cover - not on Linux/macOS
        return 8 * 2**30


MIB = 2**20
GIB = 2**30


class ServerConfig(BaseModel):
    """Everything ``python -m server`` takes. Validated as a whole before anything binds."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    device: DeviceSpec = NdArraySpec()
    host: str = "127.0.0.1"
    port: Annotated[int, Field(ge=0, le=65535)] = 8765
    token: str | None = None
    max_message_size: Annotated[int, Field(ge=1024)] = 2**31
    worker_threads: Annotated[int, Field(ge=1)] = max(1, os.cpu_count() or 1)
    handshake_timeout: Annotated[float, Field(gt=0)] = 10.0
    shutdown_grace: Annotated[float, Field(ge=0)] = 5.0
    # --- security (README "Security"; every limit below is in the README's limits table) ---
    insecure: bool = False  # allow a non-loopback bind without a token
    tls_cert: str | None = None
    tls_key: str | None = None
    allowed_origins: tuple[str, ...] = ()  # browser Origin values allowed; none by default
    max_connections: Annotated[int, Field(ge=1)] = 256
    idle_timeout: Annotated[float, Field(gt=0)] = 600.0
    ping_interval: Annotated[float, Field(gt=0)] = 20.0
    ping_timeout: Annotated[float, Field(gt=0)] = 20.0
    send_timeout: Annotated[float, Field(gt=0)] = 300.0
    write_limit: Annotated[int, Field(ge=1024)] = MIB
    max_queued: Annotated[int, Field(ge=1)] = 8
    max_header_size: Annotated[int, Field(ge=1024, le=64 * MIB)] = 16 * MIB
    max_op_bytes: Annotated[int, Field(ge=0)] = 2 * GIB
    max_ndim: Annotated[int, Field(ge=0, le=64)] = 64
    memory_budget: Annotated[int, Field(ge=0)] = _physical_memory() // 2
    session_quota: Annotated[int, Field(ge=0)] | None = None  # None: a quarter of the budget
    op_deadline: Annotated[float, Field(gt=0)] = 600.0

    @property
    def effective_session_quota(self) -> int:
        return self.memory_budget // 4 if self.session_quota is None else self.session_quota


def validate_host_device(device: NdArraySpec | RemoteSpec | CaptureSpec) -> NdArraySpec:
    """Return the local device a server may host, or refuse with the reason and the fix.

    Raises:
        UnsupportedDeviceError: ``device`` is a remote or a capture device. The message is one
            line, fit for stderr.
    """
    if isinstance(device, RemoteSpec):
        raise UnsupportedDeviceError(
            f"cannot host a remote server on a remote device ({device}): a server must execute "
            "ops itself; point it at a local backend such as --device ndarray, and never reuse "
            "a client's remote device config for the server"
        )
    if isinstance(device, CaptureSpec):
        inner = device.inner
        while isinstance(inner, CaptureSpec):
            inner = inner.inner
        raise UnsupportedDeviceError(
            f"cannot host a remote server on a capture device ({device}): a capture device "
            f"records ops instead of executing them; serve the inner device instead: "
            f"--device {inner}"
        )
    return device


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback addresses; False for anything else (names too)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def validate_security(config: ServerConfig) -> list[str]:
    """Refuse an exposed server without a token (like Redis's protected mode); return the
    warnings to print, one line each.

    Raises:
        InsecureConfigError: a non-loopback bind without a token or ``insecure``, or only one
            of ``tls_cert``/``tls_key``. The message is one line, fit for stderr.
    """
    if (config.tls_cert is None) != (config.tls_key is None):
        raise InsecureConfigError("--tls-cert and --tls-key must be given together")
    warnings: list[str] = []
    if is_loopback(config.host):
        return warnings
    if config.token is None and not config.insecure:
        raise InsecureConfigError(
            f"refusing to bind {config.host} without a token: anyone who can reach it could run "
            "ops and read every tensor; set --token or TENSOR_SERVER_TOKEN (or bind 127.0.0.1, "
            "or pass --insecure to accept the risk)"
        )
    if config.token is None:
        warnings.append(
            f"WARNING: --insecure: serving {config.host} with no token; anyone who can reach "
            "this port can run ops and read every tensor"
        )
    elif config.tls_cert is None:
        warnings.append(
            f"WARNING: serving {config.host} without TLS: the token and tensors travel in clear; "
            "use --tls-cert/--tls-key"
        )
    return warnings
