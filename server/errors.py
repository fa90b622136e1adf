"""The server's errors that carry an :class:`~protocol.ErrorCode`, the code the client sees.

Every module that refuses work with a code raises one of these; none imports another server
module, so any of them may import this one::

    Exception
     └── ServerError        .code: the ErrorCode that goes on the wire
          ├── StoreError    one op (or one request) is refused: the store, the memory budget or
          │                 a per-op cap said no; the op fails, its session goes on
          └── Drop          the session ends: its connection is closed with .reason, which
                            starts with the code (deadline, send timeout, idle timeout)

Errors without a code live next to what raises them: a bad configuration
(``server.config``: ``UnsupportedDeviceError``, ``InsecureConfigError``) stops the server
before it binds, and ``server.executor.InferenceMismatch`` is a bug in an inference rule,
reported to the client as ``internal``.
"""

from __future__ import annotations

import traceback
from typing import TypeVar

from protocol import ErrorCode

E = TypeVar("E", bound=BaseException)


class ServerError(Exception):
    """Work the server refuses, with the :class:`~protocol.ErrorCode` it reports."""

    code: ErrorCode


class StoreError(ServerError):
    """An op or request refused (``unknown_tensor``, ``quota_exceeded``, ...); the message says
    why and what to do, as the client shows it."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code


class Drop(ServerError):
    """End this session and close its connection with ``close_code`` (1008, policy violation,
    unless the server is going away: 1001); ``reason`` starts with the ErrorCode (it is the
    websocket close reason, at most 123 bytes)."""

    def __init__(self, code: ErrorCode, message: str, close_code: int = 1008) -> None:
        super().__init__(f"{code}: {message}"[:120])
        self.code = code
        self.reason = str(self)
        self.close_code = close_code


GOING_AWAY = f"{ErrorCode.SHUTTING_DOWN}: the server is shutting down"  # a drain's close reason


def bare(exc: E) -> E:
    """``exc`` to keep (a refused message's error, kept until the message is drained): without
    its traceback, nor the exceptions it was raised while handling, whose tracebacks hold
    frames too. Kept frames would hold the message's bytes (their locals) in a reference
    cycle until a garbage collection, which the server runs rarely (``server/__main__.py``)."""
    exc.__context__ = exc.__cause__ = None
    return exc.with_traceback(None)


def let_go_of_frames(exc: BaseException) -> None:
    """Clear the locals of the finished frames in ``exc``'s traceback and in those of the
    exceptions it was raised while handling: objects those frames hold that hold ``exc`` (a
    failed future, a lost connection's error) would otherwise keep them all in a reference
    cycle until a garbage collection, which the server runs rarely."""
    error: BaseException | None = exc
    while error is not None:
        traceback.clear_frames(error.__traceback__)
        error = error.__context__
