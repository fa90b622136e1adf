"""Exceptions the client raises.

Exception tree::

    TensorwireError
    ├── RemoteError (RuntimeError)         an op failed on the server; names the op and why
    ├── HandshakeError                      the server refused the session
    │   ├── VersionMismatchError            protocol versions differ
    │   ├── DeviceIndexError (IndexError)   no such device index on the server
    │   ├── AuthenticationError             missing or wrong token (HTTP 401 on the upgrade)
    │   └── ServerBusyError                 the server takes no session now (503): its
    │       │                               connection limit is reached, or
    │       └── ServerShuttingDownError     it is shutting down (draining)
    ├── ServerProtocolError                 the server said a message of ours was malformed
    ├── CaptureError (RuntimeError)         a capture scope refused what it was asked to record
    ├── GraphFileError (ValueError)         a graph file that is malformed, hostile or of another
    │                                       format version; nothing of it runs
    ├── MessageTooLargeError (MemoryError)  an upload larger than one message the server takes;
    │                                       refused before it is sent, the session goes on
    └── ConnectionLost (ConnectionError)    the connection closed or broke; pending work fails;
        │                                   ``code`` says why when the server said so
        ├── DeviceClosedError               the device was closed by its ``close()`` (or its
        │                                   ``with`` block ended) and is used again
        └── SessionLost                     the session cannot be resumed (``reason``: the
            │                               window passed, the server restarted or ended it,
            │                               or it could not be reached again)
            └── ServerNotResponding         the server stopped answering (a ping, a reply or
                (TimeoutError)              a message's bytes not taken in time)

Shape and dtype errors of ops are raised locally, before anything is sent, as the protocol's
``OpShapeError`` (a ``ValueError``) and ``OpDTypeError`` (a ``TypeError``).
"""

from __future__ import annotations

from typing import Literal

from protocol import ErrorCode, ErrorInfo


class TensorwireError(Exception):
    """Root of the client's exceptions."""


class RemoteError(TensorwireError, RuntimeError):
    """An op failed on the server. ``code`` is stable, ``op`` names the op that failed."""

    def __init__(self, error: ErrorInfo) -> None:
        where = f" in {error.op}" if error.op else ""
        super().__init__(f"[{error.code}]{where}: {error.message}")
        self.code = error.code
        self.op = error.op
        self.error = error
        # Where user code made the failed op (``client._origins``), once a read names it
        self.origin: str | None = None


class TransferError(RemoteError):
    """A direct transfer failed (``x.to_device(dev)`` between servers, ``client.transfer``):
    code ``transfer_failed`` (the target has no credentials for the source, or the source
    refused, could not be reached or was lost midway) or ``capability_refused``."""


TRANSFER_CODES = frozenset({ErrorCode.TRANSFER_FAILED, ErrorCode.CAPABILITY_REFUSED})


def remote_error(error: ErrorInfo) -> RemoteError:
    """The exception for a failed op or request: a :class:`TransferError` for a transfer's."""
    return TransferError(error) if error.code in TRANSFER_CODES else RemoteError(error)


class CaptureError(TensorwireError, RuntimeError):
    """A capture scope (``client.capture``) was asked to record what a graph cannot hold: a
    capture inside a capture, a read of a value a record-only capture never computed, an input
    used but not declared, an output the graph never produced, a data-dependent shape."""


class GraphFileError(TensorwireError, ValueError):
    """A graph file (``Graph.load``) that cannot be used: not a graph, truncated, another
    format version, or a graph that does not hold together. Nothing of it runs."""


class MessageTooLargeError(TensorwireError, MemoryError):
    """An upload (or a graph's constants) larger than one message the server takes (its
    ``--max-message-size``, which its welcome says): refused before anything is sent, as numpy
    raises ``MemoryError`` for an array it cannot allocate. Nothing was queued; the session
    goes on."""


class FeatureNotSupportedError(TensorwireError, TypeError):
    """The server does not speak an optional feature that a call needs (a protocol feature it
    did not announce in its welcome, such as the neural-network ops): upgrade the server."""


class HandshakeError(TensorwireError):
    """The server refused the session."""

    def __init__(self, error: ErrorInfo) -> None:
        super().__init__(f"[{error.code}] {error.message}")
        self.code = error.code
        self.error = error


class VersionMismatchError(HandshakeError):
    pass


class DeviceIndexError(HandshakeError, IndexError):
    pass


class AuthenticationError(HandshakeError):
    pass


class ServerBusyError(HandshakeError):
    """The server takes no new session now (HTTP 503); another server, or a later try, may."""


class ServerShuttingDownError(ServerBusyError):
    """The server is shutting down (``shutting_down``): it finishes its sessions' work and
    takes no new one; a restarted server, or a replica, will."""


class ServerProtocolError(TensorwireError):
    """The server reported a message of ours as malformed."""

    def __init__(self, error: ErrorInfo) -> None:
        super().__init__(f"[{error.code}] {error.message}")
        self.code = error.code
        self.error = error


class ConnectionLost(TensorwireError, ConnectionError):
    """The connection to the server is closed or broken.

    ``code`` is the :class:`~protocol.ErrorCode` the server gave for closing it (for example
    ``deadline_exceeded``, ``idle_timeout``, ``limit_exceeded``), or None.
    """

    def __init__(self, message: str, code: ErrorCode | None = None) -> None:
        super().__init__(f"[{code}] {message}" if code is not None else message)
        self.code = code


class DeviceClosedError(ConnectionLost):
    """A device used after its ``close()`` (or after its ``with`` block ended): nothing was
    lost on the network, the program closed it. A ``ConnectionLost``, which code catches for
    a device that can no longer be used."""

    def __init__(self, url: str) -> None:
        super().__init__(
            f"the device {url} was closed by close() (or its `with` block ended) and cannot be "
            "used any more: open a new device, and keep the arrays you need read before closing"
        )


SessionLostReason = Literal["expired", "dropped", "server_restarted", "unreachable", "unknown"]


class SessionLost(ConnectionLost):
    """The session is gone and cannot be resumed: its tensors, graphs and optimizer state on
    the server are lost. Every pending and later call raises it; resume the run from a
    checkpoint (``client.checkpoint``) on a new device.

    ``reason`` says which: ``"expired"`` (the client reconnected after the server's resume
    window), ``"dropped"`` (the server ended it: a limit, a timeout, a drain; ``code`` says
    which), ``"server_restarted"`` (the server has a new ``server_id``), ``"unreachable"`` (no
    reconnection within the client's ``reconnect_attempts`` and ``reconnect_timeout``),
    ``"unknown"`` (the server does not know it).
    """

    def __init__(
        self, message: str, reason: SessionLostReason, code: ErrorCode | None = None
    ) -> None:
        super().__init__(f"{message}; the session is lost: resume from a checkpoint", code)
        self.reason = reason
        self.detail = message  # what happened, without the advice


class ServerNotResponding(SessionLost, TimeoutError):
    """The server stopped answering within the client's bounds (``RemoteDevice``'s
    ``ping_timeout`` and ``timeout``), and no reconnection brought it back: the message says
    what was waited for and how long. The client cut the connection; every pending and later
    call raises this error. The server may be stopped, hung, unreachable, or (``timeout``)
    still running a long op."""

    def __init__(self, message: str) -> None:
        super().__init__(message, "unreachable")


def handshake_error(error: ErrorInfo) -> HandshakeError:
    kinds: dict[ErrorCode, type[HandshakeError]] = {
        ErrorCode.VERSION_MISMATCH: VersionMismatchError,
        ErrorCode.BAD_DEVICE_INDEX: DeviceIndexError,
        ErrorCode.AUTH_FAILED: AuthenticationError,
        ErrorCode.TOO_MANY_CONNECTIONS: ServerBusyError,
        ErrorCode.SHUTTING_DOWN: ServerShuttingDownError,
    }
    return kinds.get(error.code, HandshakeError)(error)
