"""Tensorwire server: ``python -m server --device ndarray``.

Programmatic use::

    config = server.ServerConfig(device=protocol.parse_device_spec("ndarray"), port=0)
    await server.serve(config)          # raises UnsupportedDeviceError before binding

The names below load their modules on first use (PEP 562), so ``python -m server.healthcheck``
(the container health check, run every few seconds) does not import numpy and websockets.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .app import Server as Server
    from .app import serve as serve
    from .config import ServerConfig as ServerConfig
    from .config import UnsupportedDeviceError as UnsupportedDeviceError
    from .config import validate_host_device as validate_host_device

_EXPORTS = {
    "Server": ".app",
    "serve": ".app",
    "ServerConfig": ".config",
    "UnsupportedDeviceError": ".config",
    "validate_host_device": ".config",
}
__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'server' has no attribute {name!r}")
    return getattr(import_module(_EXPORTS[name], __name__), name)
