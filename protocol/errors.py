"""Errors that travel on the wire, and the protocol's own exceptions.

Exception tree::

    ProtocolError (ValueError)          bytes or a message that breaks protocol v1
    └── DecodeError                     malformed bytes, truncated buffers, unknown message
    DeviceSpecError (ValueError)        a device spec string that names no valid device

Every error that crosses the wire is an :class:`ErrorInfo` with a stable :class:`ErrorCode`;
clients map codes to exceptions, never the other way round (nothing is pickled).
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict


class ErrorCode(StrEnum):
    """Stable error codes. Never renumber or reuse one; add new ones at the end."""

    BAD_MESSAGE = "bad_message"  # bytes that do not decode to a valid message
    VERSION_MISMATCH = "version_mismatch"  # handshake: unsupported protocol version
    BAD_DEVICE_INDEX = "bad_device_index"  # handshake: no such device on this server
    AUTH_FAILED = "auth_failed"  # handshake: missing or wrong token
    UNKNOWN_TENSOR = "unknown_tensor"  # an op or read names an id the session lacks
    DUPLICATE_TENSOR = "duplicate_tensor"  # an op's output id is already in use
    INVALID_OP = "invalid_op"  # shape/dtype checks refused the op before it ran
    EXECUTION_FAILED = "execution_failed"  # numpy raised while running a checked op
    INTERNAL = "internal"  # a server bug; the message says what


class ErrorInfo(BaseModel):
    """A typed error on the wire: a stable code, a human message and the op that failed."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)
    code: ErrorCode
    message: str
    op: str | None = None  # a one-line description of the failed op, e.g. "matmul(#3, #4) -> #5"


class ProtocolError(ValueError):
    """A message or byte string that breaks protocol v1."""

    code = ErrorCode.BAD_MESSAGE


class DecodeError(ProtocolError):
    """Bytes that do not decode: bad header, truncated or extra buffer bytes, bad JSON."""


class DeviceSpecError(ValueError):
    """A device spec string that names no valid device."""
