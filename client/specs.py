"""``open_device``: one device-spec grammar on both sides (``protocol.devices`` parses it).

The same strings the server's ``--device`` takes open a device here: ``ws://HOST:PORT`` (or
``wss://``, or ``remote:URL``) a session on a server; ``ndarray`` a local, in-process device
that runs the server's own executor; ``capture:`` a record-only capture device, and
``capture:SPEC`` a capture device over SPEC.
"""

from __future__ import annotations

from typing import Unpack

from protocol import CaptureSpec, NdArraySpec, RemoteSpec, parse_device_spec

from ._options import ConnectionKeywords
from .capture.device import CaptureDevice
from .device import Device, RemoteDevice
from .errors import CaptureError


def open_device(
    spec: str,
    index: int = 0,
    *,
    token: str | None = None,
    **keywords: Unpack[ConnectionKeywords],
) -> Device:
    """The device ``spec`` names (device ``index`` of a server or of ``ndarray:N``); ``token``
    and the connection's keyword arguments are :class:`~client.RemoteDevice`'s, for a server.

    Raises:
        DeviceSpecError: ``spec`` names no valid device (the message lists the valid kinds).
        CaptureError: a capture device over a capture device.
        HandshakeError, ConnectionLost: as :class:`~client.RemoteDevice` raises them.
    """
    return _open(parse_device_spec(spec), index, token, keywords)


def _open(
    spec: NdArraySpec | RemoteSpec | CaptureSpec,
    index: int,
    token: str | None,
    keywords: ConnectionKeywords,
) -> Device:
    if isinstance(spec, RemoteSpec):
        return RemoteDevice(spec.url, index, token, **keywords)
    if isinstance(spec, NdArraySpec):
        from .local import LocalDevice  # the server's executor, loaded only when asked for

        return LocalDevice(index=index, count=spec.count)
    if isinstance(spec.inner, CaptureSpec):
        raise CaptureError(f"{spec}: a capture device over a capture device is not supported")
    inner = None if spec.inner is None else _open(spec.inner, index, token, keywords)
    return CaptureDevice(inner)
