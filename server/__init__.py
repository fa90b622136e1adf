"""Tensorwire server: ``python -m server --device ndarray``.

Programmatic use::

    config = server.ServerConfig(device=protocol.parse_device_spec("ndarray"), port=0)
    await server.serve(config)          # raises UnsupportedDeviceError before binding
                                        # (InsecureConfigError: exposed without a token)

The names below load their modules on first use (PEP 562), so ``python -m server.healthcheck``
(the container health check, run every few seconds) does not import numpy and websockets.
"""

from __future__ import annotations

from importlib import import_module
from pathlib import Path
from runpy import run_path
from typing import TYPE_CHECKING, Any

# protocol/shadowing.py by its path: ``import protocol`` could be a user's protocol.py
run_path(str(Path(__file__).parent.parent / "protocol" / "shadowing.py"))["refuse_shadowing"](
    __file__
)

if TYPE_CHECKING:
    from protocol import __version__ as __version__

    from .app import Server as Server
    from .app import serve as serve
    from .config import InsecureConfigError as InsecureConfigError
    from .config import ServerConfig as ServerConfig
    from .config import UnsupportedDeviceError as UnsupportedDeviceError
    from .config import validate_host_device as validate_host_device
    from .config import validate_security as validate_security

_EXPORTS = {
    "Server": ".app",
    "serve": ".app",
    "ServerConfig": ".config",
    "UnsupportedDeviceError": ".config",
    "validate_host_device": ".config",
    "InsecureConfigError": ".config",
    "validate_security": ".config",
    "__version__": "protocol",  # the package metadata's version, as protocol reads it
}
__all__ = [name for name in _EXPORTS if name != "__version__"]


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'server' has no attribute {name!r}")
    return getattr(import_module(_EXPORTS[name], __name__), name)
