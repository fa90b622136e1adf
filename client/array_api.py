"""The remote namespace as an importable module, for tools that take a module name (the Array
API conformance suite: ``ARRAY_API_TESTS_MODULE=client.array_api``).

Importing it connects to the server named by ``TENSORWIRE_URL`` (device index
``TENSORWIRE_INDEX``, default 0; ``TENSORWIRE_DEVICE`` is the server's device spec) and puts
that device's :class:`~client.Namespace` in its place in ``sys.modules``: ``import
client.array_api as xp`` gives the very object that ``x.__array_namespace__()`` and
``client.namespace(device)`` return, so a tool that compares namespaces sees one.

Raises (on import):
    RuntimeError: ``TENSORWIRE_URL`` is not set.
    HandshakeError, ConnectionLost: as :class:`~client.RemoteDevice` does.
"""

from __future__ import annotations

import os
import sys

from .device import RemoteDevice
from .namespace import namespace as _namespace

_url = os.environ.get("TENSORWIRE_URL")
if not _url:
    raise RuntimeError("set TENSORWIRE_URL to the server's ws:// address to import this module")

device = RemoteDevice(_url, index=int(os.environ.get("TENSORWIRE_INDEX", "0")))
# The import system binds whatever sys.modules holds for this name once the module has run.
sys.modules[__name__] = _namespace(device)  # type: ignore[assignment]
