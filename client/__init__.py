"""Tensorwire client SDK: arrays on a remote device, for plain training code.

::

    import client
    dev = client.RemoteDevice("ws://127.0.0.1:8765")
    xp = client.namespace(dev)
    b = xp.sum(xp.exp(xp.ones((2, 3))), axis=0)
    print(b.shape, b.dtype, b.numpy())
"""

from __future__ import annotations

from pathlib import Path
from runpy import run_path

# protocol/shadowing.py by its path: ``import protocol`` could be a user's protocol.py
run_path(str(Path(__file__).parent.parent / "protocol" / "shadowing.py"))["refuse_shadowing"](
    __file__
)

from protocol import __version__ as __version__

from . import _elements as _elements  # registers RemoteArray's iteration
from . import capture as capture
from ._printing import print_values as print_values
from ._stats import SegmentStats as SegmentStats
from ._stats import SessionStats as SessionStats
from .array import RemoteArray as RemoteArray
from .device import AsyncRemoteDevice as AsyncRemoteDevice
from .device import Device as Device
from .device import RemoteDevice as RemoteDevice
from .errors import AuthenticationError as AuthenticationError
from .errors import ConnectionLost as ConnectionLost
from .errors import DeviceClosedError as DeviceClosedError
from .errors import DeviceIndexError as DeviceIndexError
from .errors import FeatureNotSupportedError as FeatureNotSupportedError
from .errors import HandshakeError as HandshakeError
from .errors import MessageTooLargeError as MessageTooLargeError
from .errors import RemoteError as RemoteError
from .errors import ServerBusyError as ServerBusyError
from .errors import ServerNotResponding as ServerNotResponding
from .errors import ServerProtocolError as ServerProtocolError
from .errors import ServerShuttingDownError as ServerShuttingDownError
from .errors import SessionLost as SessionLost
from .errors import TensorwireError as TensorwireError
from .errors import TransferError as TransferError
from .errors import VersionMismatchError as VersionMismatchError
from .namespace import Namespace as Namespace
from .namespace import namespace as namespace
from .specs import open_device as open_device
