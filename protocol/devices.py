"""Typed device specs, shared by the server's ``--device`` and the client.

Grammar (one string, as on the command line), the same on both sides::

    ndarray            the numpy executor, one device (index 0)
    ndarray:N          the numpy executor hosting N devices, indices 0..N-1
    ws://HOST:PORT     a device on a server (also wss://; ``remote:URL`` says the same)
    capture:           a record-only capture device: ops are recorded, never executed
    capture:SPEC       a capture device over SPEC: ops are recorded and executed on SPEC

The client opens any of them (``client.open_device``). A server may only *host* an
``ndarray`` device; the startup validator in ``server.config`` refuses the other kinds
(a remote device would forward to another server; a capture device belongs on the client).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from .errors import DeviceSpecError

VALID_KINDS = "ndarray, ndarray:N, ws://HOST:PORT (or remote:URL), capture:, capture:SPEC"


class NdArraySpec(BaseModel):
    """The numpy executor. ``count`` devices share one server, indices 0..count-1."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    kind: Literal["ndarray"] = "ndarray"
    count: Annotated[int, Field(ge=1, le=1024)] = 1

    def __str__(self) -> str:
        return "ndarray" if self.count == 1 else f"ndarray:{self.count}"


class RemoteSpec(BaseModel):
    """A device on another Tensorwire server, reached at ``url``."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    kind: Literal["remote"] = "remote"
    url: Annotated[str, Field(pattern=r"^wss?://[^\s/]+(/\S*)?$")]

    def __str__(self) -> str:
        return f"remote:{self.url}"


class CaptureSpec(BaseModel):
    """A recording device: ops sent to it are recorded (for replay); with an ``inner``
    device they are also executed there, without one they are only recorded."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    kind: Literal["capture"] = "capture"
    inner: DeviceSpec | None = None

    def __str__(self) -> str:
        return f"capture:{'' if self.inner is None else self.inner}"


DeviceSpec = Annotated[NdArraySpec | RemoteSpec | CaptureSpec, Field(discriminator="kind")]
CaptureSpec.model_rebuild()

_ADAPTER: TypeAdapter[NdArraySpec | RemoteSpec | CaptureSpec] = TypeAdapter(DeviceSpec)


def parse_device_spec(text: str) -> NdArraySpec | RemoteSpec | CaptureSpec:
    """Parse a device spec string (see the module docstring for the grammar).

    Raises:
        DeviceSpecError: the string names no valid device; the message lists the valid kinds.
    """
    text = text.strip()
    kind, sep, rest = text.partition(":")
    try:
        if kind in ("ws", "wss"):
            return RemoteSpec(url=text)
        if kind == "ndarray":
            if not sep:
                return NdArraySpec()
            if not rest.isdigit():
                raise DeviceSpecError(
                    f"invalid device spec {text!r}: ndarray:N takes a device count N >= 1; "
                    f"valid kinds: {VALID_KINDS}"
                )
            return NdArraySpec(count=int(rest))
        if kind == "remote" and sep:
            return RemoteSpec(url=rest)
        if kind == "capture" and sep:
            return CaptureSpec(inner=parse_device_spec(rest) if rest.strip() else None)
    except ValidationError as exc:
        detail = exc.errors()[0]["msg"]
        raise DeviceSpecError(
            f"invalid device spec {text!r}: {detail}; valid kinds: {VALID_KINDS}"
        ) from None
    raise DeviceSpecError(f"unknown device spec {text!r}; valid kinds: {VALID_KINDS}")


def device_spec_adapter() -> TypeAdapter[NdArraySpec | RemoteSpec | CaptureSpec]:
    return _ADAPTER
