"""``open_device``: one device-spec grammar on both sides (``protocol.devices`` parses it).

The same strings the server's ``--device`` takes open a device here: ``ws://HOST:PORT`` (or
``wss://``, or ``remote:URL``) a session on a server; ``ndarray`` a local, in-process device
that runs the server's own executor; ``capture:`` a record-only capture device, and
``capture:SPEC`` a capture device over SPEC.
"""

from __future__ import annotations

from protocol import CaptureSpec, NdArraySpec, RemoteSpec, parse_device_spec

from .capture.device import CaptureDevice
from .device import Device, RemoteDevice
from .errors import CaptureError


def open_device(
    spec: str,
    index: int = 0,
    *,
    token: str | None = None,
    ca_file: str | None = None,
    open_timeout: float = 10.0,
) -> Device:
    """The device ``spec`` names (device ``index`` of a server or of ``ndarray:N``).

    Raises:
        DeviceSpecError: ``spec`` names no valid device (the message lists the valid kinds).
        CaptureError: a capture device over a capture device.
        HandshakeError, ConnectionLost: as :class:`~client.RemoteDevice` raises them.
    """
    return _open(parse_device_spec(spec), index, token, ca_file, open_timeout)


def _open(
    spec: NdArraySpec | RemoteSpec | CaptureSpec,
    index: int,
    token: str | None,
    ca_file: str | None,
    open_timeout: float,
) -> Device:
    if isinstance(spec, RemoteSpec):
        return RemoteDevice(spec.url, index, token, open_timeout=open_timeout, ca_file=ca_file)
    if isinstance(spec, NdArraySpec):
        from .local import LocalDevice  # the server's executor, loaded only when asked for

        return LocalDevice(index=index, count=spec.count)
    if isinstance(spec.inner, CaptureSpec):
        raise CaptureError(f"{spec}: a capture device over a capture device is not supported")
    inner = None if spec.inner is None else _open(spec.inner, index, token, ca_file, open_timeout)
    return CaptureDevice(inner)
