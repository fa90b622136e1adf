"""Replies to a connection's requests: the future a caller waits on, and the result that a
reply message resolves it with.

Below ``client._connection``, which registers a :class:`Reply` for each request (a read, sync,
stats or describe) and resolves it with :func:`resolve` when the reply arrives.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future, InvalidStateError
from typing import Any, Protocol

import numpy as np

from protocol import (
    DescribeReply,
    ErrorCode,
    ErrorInfo,
    ExposeReply,
    ReadReply,
    RequestFailed,
    StatsReply,
    SyncReply,
    to_numpy,
)
from protocol.codec import Buffer

from .errors import RemoteError, remote_error


class Waits(Protocol):
    """What a :class:`Reply` needs of its connection (``client._connection.Connection``)."""

    def wait(self, reply: Future[Any]) -> None:
        """Return once ``reply`` is resolved, reading the connection meanwhile."""


class Reply(Future[Any]):
    """The future reply to one request. ``result()`` reads the connection while it waits, so
    call it (or :meth:`Connection.wait`) from a thread that may block; an asyncio caller runs
    it in a worker thread. ``add_done_callback`` on a pending reply (as ``asyncio.wrap_future``
    does) starts a daemon thread that waits for it, so a callback alone also gets its answer.

    ``waiting_since`` is when a thread began to wait for it (``time.monotonic()``; None while
    none does): the connection's ``timeout`` counts from there, so a reply left unread in the
    socket while nobody asked for it is never late.
    """

    def __init__(self, conn: Waits) -> None:
        super().__init__()
        self._conn = conn
        self.waiting_since: float | None = None
        self.batch = 0  # the number of the message that carried its request
        self.most_bytes: int | None = None  # the most buffer bytes its reply may declare

    def result(self, timeout: float | None = None) -> Any:
        if not self.done():
            self._waited_on()
            self._conn.wait(self)
        return super().result(timeout)

    def add_done_callback(self, fn: Callable[[Future[Any]], object]) -> None:
        super().add_done_callback(fn)
        if not self.done():
            self._waited_on()
            threading.Thread(target=self._conn.wait, args=(self,), daemon=True).start()

    def _waited_on(self) -> None:
        if self.waiting_since is None:
            self.waiting_since = time.monotonic()


def resolve(future: Future[Any], message: Any, buffers: list[Buffer]) -> None:
    """Resolve ``future`` with what ``message``, the reply to its request, carries: a read's
    values as a numpy array (its bytes are ``buffers[0]``), a :class:`RemoteError` for a failed
    request, the message itself for the others."""
    if isinstance(message, ReadReply):
        try:
            array = np.frombuffer(buffers[0], dtype=to_numpy(message.dtype))
            array = array.reshape(message.shape)  # raises for bytes that are not that shape
        except ValueError:
            why = f"a read reply's {len(buffers[0])} bytes are not {message.dtype} {message.shape}"
            future.set_exception(RemoteError(ErrorInfo(code=ErrorCode.BAD_MESSAGE, message=why)))
            return
        if not (array.flags.writeable and array.flags.aligned):
            array = array.copy()  # compiled code (SciPy's) refuses unaligned arrays
        future.set_result(array)
    elif isinstance(message, RequestFailed):
        future.set_exception(remote_error(message.error))
    elif isinstance(message, StatsReply | SyncReply | DescribeReply | ExposeReply):
        future.set_result(message)


def take_batch(waiters: dict[int, Reply], batch: int) -> list[Reply]:
    """Remove from ``waiters`` (request id -> reply) the replies to the requests that went in
    message number ``batch``, and return them."""
    ids = [request_id for request_id, reply in waiters.items() if reply.batch == batch]
    return [waiters.pop(request_id) for request_id in ids]


def fail(futures: Iterable[Future[Any]], error: BaseException) -> None:
    """Fail each of ``futures`` with ``error`` (one resolved meanwhile keeps its result)."""
    for future in futures:
        try:
            future.set_exception(error)
        except InvalidStateError:
            pass
