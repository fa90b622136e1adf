"""Server configuration and the startup validator.

Rule: imports ``protocol`` and pydantic only; nothing here binds, spawns or starts a loop.

The validator is the seed of this project (from Burn's remote backend): a server must never host
a *remote* device (it would forward ops to another server, forever) nor a *capture* device (it
records ops instead of executing them). It runs before anything binds.
"""

from __future__ import annotations

import os
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from protocol import CaptureSpec, DeviceSpec, NdArraySpec, RemoteSpec


class UnsupportedDeviceError(ValueError):
    """The server was asked to host a device it must never host (remote or capture)."""


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
