"""The remote namespace as an importable module, for tools that take a module name (the Array
API conformance suite: ``ARRAY_API_TESTS_MODULE=client.array_api``).

Importing it connects to the server named by ``TENSORWIRE_URL`` (device ``TENSORWIRE_DEVICE``,
default 0); every attribute is the namespace's.

Raises (on import):
    RuntimeError: ``TENSORWIRE_URL`` is not set.
    HandshakeError, ConnectionLost: as :class:`~client.RemoteDevice` does.
"""

from __future__ import annotations

import os
from typing import Any

from .device import RemoteDevice
from .namespace import Namespace
from .namespace import namespace as _namespace

_url = os.environ.get("TENSORWIRE_URL")
if not _url:
    raise RuntimeError("set TENSORWIRE_URL to the server's ws:// address to import this module")

device = RemoteDevice(_url, index=int(os.environ.get("TENSORWIRE_DEVICE", "0")))
namespace = _namespace(device)  # the same object as x.__array_namespace__()
__array_api_version__ = Namespace.__array_api_version__
linalg = namespace.linalg
fft = namespace.fft


def __getattr__(name: str) -> Any:
    return getattr(namespace, name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | {n for n in dir(namespace) if not n.startswith("_")})
