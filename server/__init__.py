"""Tensorwire server: ``python -m server --device ndarray``.

Programmatic use::

    config = server.ServerConfig(device=protocol.parse_device_spec("ndarray"), port=0)
    await server.serve(config)          # raises UnsupportedDeviceError before binding
                                        # (InsecureConfigError: exposed without a token)
"""

from __future__ import annotations

from .app import Server as Server
from .app import serve as serve
from .config import InsecureConfigError as InsecureConfigError
from .config import ServerConfig as ServerConfig
from .config import UnsupportedDeviceError as UnsupportedDeviceError
from .config import validate_host_device as validate_host_device
from .config import validate_security as validate_security
