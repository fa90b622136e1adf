"""Errors that travel on the wire, and the protocol's own exceptions.

Exception tree::

    ProtocolError (ValueError)          bytes or a message that breaks the protocol
    ├── DecodeError                     malformed bytes, truncated buffers, unknown message
    │   └── MessageLimitError           a message declares more buffer bytes than allowed
    InvalidOpError                      an op its inference rule refuses; it never reaches numpy
    ├── OpShapeError (ValueError)       shapes that do not fit the op
    │   └── OpAxisError (IndexError)    an axis out of range
    ├── OpIndexError (IndexError)       an index that does not fit the array
    ├── OpDTypeError (TypeError)        dtypes the op does not accept
    ├── OpOverflowError (OverflowError) a Python integer the target dtype cannot hold
    ├── OpArgumentError (TypeError,     an argument the op cannot take (an array where a
    │   ValueError)                     scalar goes, a string for a number, none at all)
    └── GraphError (ValueError)         a graph whose ops, ids or signatures do not hold
    DeviceSpecError (ValueError)        a device spec string that names no valid device

The op errors carry the builtin the standard (and numpy) would raise, so code that catches
``ValueError`` or ``TypeError`` around an array call catches them too.

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
    LIMIT_EXCEEDED = "limit_exceeded"  # a size limit (message, op output, ndim) refused it
    QUOTA_EXCEEDED = "quota_exceeded"  # the session's memory quota is full; free tensors
    SERVER_MEMORY_EXHAUSTED = "server_memory_exhausted"  # the server-wide budget is full
    DEADLINE_EXCEEDED = "deadline_exceeded"  # an op ran past the per-op deadline
    TOO_MANY_CONNECTIONS = "too_many_connections"  # handshake: the connection limit is reached
    IDLE_TIMEOUT = "idle_timeout"  # the session sent nothing for too long
    SEND_TIMEOUT = "send_timeout"  # the client did not take a reply in time
    ORIGIN_REFUSED = "origin_refused"  # handshake: a browser Origin that is not allowed
    UNKNOWN_GRAPH = "unknown_graph"  # run_graph names a graph the session has not registered
    SHUTTING_DOWN = "shutting_down"  # the server drains: no new session; past its grace, cut off
    CAPABILITY_REFUSED = "capability_refused"  # a transfer capability unknown, used, expired...
    TRANSFER_FAILED = "transfer_failed"  # a pull's source refused, unreachable or lost midway
    SESSION_UNKNOWN = "session_unknown"  # resume: no such session here (or the wrong secret)
    SESSION_EXPIRED = "session_expired"  # resume: its resume window passed
    SESSION_DROPPED = "session_dropped"  # resume: the server ended it (a limit, a timeout, a drain)


class ErrorInfo(BaseModel):
    """A typed error on the wire: a stable code, a human message and the op that failed."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)
    code: ErrorCode
    message: str
    op: str | None = None  # a one-line description of the failed op, e.g. "matmul(#3, #4) -> #5"


class ProtocolError(ValueError):
    """A message or byte string that breaks the protocol."""

    code = ErrorCode.BAD_MESSAGE


class DecodeError(ProtocolError):
    """Bytes that do not decode: bad header, truncated or extra buffer bytes, bad JSON."""


class MessageLimitError(DecodeError):
    """A well-formed header whose declared buffers exceed a limit; refused before allocation."""

    def __init__(self, message: str, code: ErrorCode = ErrorCode.LIMIT_EXCEEDED) -> None:
        super().__init__(message)
        self.code = code


class InvalidOpError(Exception):
    """An op that its inference rule refuses; it never reaches numpy."""


class OpShapeError(InvalidOpError, ValueError):
    """Shapes that do not fit the op (matmul mismatch, bad axis, bad reshape, ...)."""


class OpAxisError(OpShapeError, IndexError):
    """An axis out of range: both a ``ValueError`` and an ``IndexError``, as numpy's AxisError
    (the standard asks for an ``IndexError`` in places)."""


class OpIndexError(InvalidOpError, IndexError):
    """An index that does not fit the array (out of bounds, too many indices, a mask of
    another shape): an ``IndexError``, as the standard asks."""


class OpDTypeError(InvalidOpError, TypeError):
    """Dtypes the op does not accept (bitwise ops on floats, ...)."""


class OpOverflowError(InvalidOpError, OverflowError):
    """A Python integer that the target integer dtype cannot hold."""


class OpArgumentError(InvalidOpError, TypeError, ValueError):
    """An argument that the op cannot take: one its wire model cannot carry (an array where a
    scalar goes, a string where a number goes), or none where one is needed. A ``TypeError``,
    as numpy raises for such arguments, and a ``ValueError``, as the model's own validation
    error is (and as array_api_strict's ``result_type`` raises with no array)."""


class GraphError(InvalidOpError, ValueError):
    """A graph (``protocol.graphs``) that does not hold together: an id used before it is
    made, an output never produced, a signature its ops contradict, an op a graph cannot hold."""


class DeviceSpecError(ValueError):
    """A device spec string that names no valid device."""
