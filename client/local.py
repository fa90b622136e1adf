"""The ``ndarray`` device in this process: a server's own session, without a socket.

:class:`LocalDevice` runs ops as a server does because it runs the server's code: one
:class:`server.session.Session` (its checks, numpy runners and accounting), driven as
``server/connection.py`` drives it, in the calling thread. Code written for a remote device
runs in one process with the same results and typed errors (a failed op is a ``RemoteError``
on read, its dependants inherit it, frees happen at last use): for tests and parity runs.

The one module of ``client`` that imports ``server`` (ARCHITECTURE.md, "Layers"; each import
is named in the ``ignore_imports`` of "client and server never import each other"), and only
when a device is made, so ``import client`` never loads the server.

Theory of operation. :class:`LocalConnection` is what a :class:`~client.device.Device` needs
of its connection (:class:`~client.device.DeviceConnection`). Ops, uploads, graphs, frees and
graph drops accumulate in a ``client._pending.Pending``, as remotely, and become one
:class:`~protocol.Batch` when a remote device would send one: at a request (read, describe,
sync, stats), a flush, :data:`FLUSH_OPS` ops or :data:`FLUSH_BYTES` upload bytes, a large
upload, and close. The batch runs at once (``Session.start``, ``Session.step(job,
inline=False)``, ``Session.finish``) and each reply resolves its request's future before the
request returns. One lock holds the pending batch and the session, so batches run one at a
time, in the order they were made (ARCHITECTURE.md, invariant 6); frees are recorded without it
(they come from ``__del__``).

Not in one process: the wire's limits on headers and frames, the idle, send and handshake
timeouts, and the per-op deadline (nothing watches numpy: an op runs until it returns). Uploads
are refused by size, buffer count and quota as the server's decoder refuses them.
"""

from __future__ import annotations

import itertools
import secrets
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Any

import numpy as np

from protocol import (
    FEATURE_NN,
    FEATURE_OPTIM,
    PROTOCOL_VERSION,
    Batch,
    ErrorCode,
    ErrorInfo,
    MessageLimitError,
    ReadReply,
    RequestFailed,
    SessionError,
    Welcome,
    to_numpy,
)
from protocol.graphs import GraphDef
from protocol.messages import Request
from protocol.ops import AnyOp

from ._connection import FLUSH_BYTES, FLUSH_OPS
from ._pending import Pending
from .device import SyncDevice
from .errors import (
    ConnectionLost,
    DeviceClosedError,
    DeviceIndexError,
    ServerProtocolError,
    remote_error,
)

if TYPE_CHECKING:
    from server.config import ServerConfig
    from server.session import Reply as SessionReply
    from server.session import Session

LOCAL_URL = "ndarray"


class LocalConnection:
    """A session of the ``ndarray`` device ``index`` (of ``count``) in this process, with the
    limits of ``config`` (:func:`local_config`).

    Raises:
        DeviceIndexError: ``index`` is not in ``0..count-1``, as a server refuses it.
        ValueError: ``count`` is below 1.
    """

    def __init__(self, index: int, count: int, config: ServerConfig) -> None:
        _check_device(index, count)
        self.url = LOCAL_URL
        self._session = _new_session(index, config)
        self._max_message, self._max_buffers = config.max_message_size, config.max_buffers
        self.welcome = Welcome(
            protocol=PROTOCOL_VERSION,
            device_index=index,
            device_count=count,
            server_id=secrets.token_hex(8),  # each local device is a server of its own
            session_id=self._session.session_id,
            features=[FEATURE_NN, FEATURE_OPTIM],  # the executor's ops, all of them
        )
        self._lock = threading.Lock()  # the pending batch and the session
        self._runner: threading.Thread | None = None  # the thread running a batch now
        self._batch = Pending()  # under _lock, but its frees and drops
        self._tensor_ids = itertools.count(1)
        self._graph_ids = itertools.count(1)
        self._request_ids = itertools.count(1)
        self.writes = 0  # in-place ops and graph runs queued (client._known)
        self._server_error: ServerProtocolError | None = None
        self._error: ConnectionLost | None = None
        self._closed = False
        self._close_after_run = False

    # --- caller threads ---------------------------------------------------------------------

    def new_id(self) -> int:
        return next(self._tensor_ids)

    def new_graph_id(self) -> int:
        return next(self._graph_ids)

    def submit(self, op: AnyOp) -> None:
        """Queue ``op``; it runs with the next batch.

        Raises:
            ConnectionLost: the device is closed.
        """
        with self._lock:
            self._check_open()
            batch = self._batch
            batch.ops.append(op)
            self.writes += op.inplace or op.kind == "run_graph"  # what the client knew may change
            if len(batch.ops) >= FLUSH_OPS or len(batch.frees) >= FLUSH_OPS:
                self._run_locked({})

    def submit_upload(self, make_op: Callable[[int], AnyOp], data: memoryview) -> None:
        """Queue the op ``make_op(buffer_index)`` whose bytes are ``data``. A small upload is
        copied at once; a large one runs before this returns (the server copies it into memory
        of its own), so the caller may change its array afterwards either way.

        Raises:
            ConnectionLost: the device is closed.
        """
        self._queue(lambda: self._batch.add_upload(make_op, data))

    def register_graph(
        self, graph_id: int, graph: GraphDef, constants: Sequence[memoryview]
    ) -> None:
        """Register ``graph`` under ``graph_id`` with the next batch; ``constants`` are its
        constants' bytes, in order (copied, or run at once when large, as uploads are).

        Raises:
            ConnectionLost: the device is closed.
        """
        if self._batch.drops:  # a batch's drops apply after its registrations: make room first
            self.flush()
        self._queue(lambda: self._batch.add_graph(graph_id, graph, constants))

    def _queue(self, add: Callable[[], bool]) -> None:
        """``add()`` (True: it added a large buffer) under the lock; run the batch when a
        buffer is large (before returning) or the batch holds :data:`FLUSH_BYTES`."""
        with self._lock:
            self._check_open()
            if add() or self._batch.buffered >= FLUSH_BYTES:
                self._run_locked({})

    def release(self, tensor_id: int) -> None:
        """Free ``tensor_id`` with the next batch. Safe from ``__del__``, in any thread."""
        if not self._closed:
            self._batch.frees.append(tensor_id)

    def drop_graph(self, graph_id: int) -> None:
        """Drop the graph ``graph_id`` with the next batch, after its frees. Safe from
        ``__del__``, in any thread."""
        if not self._closed:
            self._batch.drops.append(graph_id)

    def together(self) -> AbstractContextManager[None]:
        """Requests run as they are made here: nothing to hold together."""
        return nullcontext()

    def request(self, make: Callable[[int], Request]) -> Future[Any]:
        """Run the pending batch with the request ``make(request_id)``; the returned future is
        resolved already: with a numpy array (a read), the reply message (describe, sync,
        stats), or ``RemoteError`` (the tensor's op failed).

        Raises:
            ConnectionLost: the device is closed.
        """
        future: Future[Any] = Future()
        with self._lock:
            self._check_open()
            request_id = next(self._request_ids)
            self._run_locked({request_id: future}, make(request_id))
        return future

    def wait(self, reply: Future[Any]) -> None:
        """Return once ``reply`` is resolved: at once, as :meth:`request` resolves it."""

    def flush(self) -> None:
        """Run the pending batch now."""
        with self._lock:
            if self._error is None and not self._closed and self._batch:
                self._run_locked({})

    def take_server_error(self) -> ServerProtocolError | None:
        error, self._server_error = self._server_error, None
        return error

    def close(self) -> None:
        """Run what is pending and drop every tensor of the session. Idempotent."""
        if self._runner is threading.current_thread():
            # a finalizer (the device collected) in the middle of this thread's batch: the
            # session is not to be touched until the batch has run
            self._close_after_run = True
            return
        with self._lock:
            if self._closed:
                return
            if self._error is None and self._batch:
                try:
                    self._run_locked({})
                except ConnectionLost:
                    pass  # the session failed; it is closed below all the same
            self._end_locked()

    # --- running batches (the caller holds the lock) ------------------------------------------

    def _check_open(self) -> None:
        if self._error is not None:
            raise self._error
        if self._closed:
            raise DeviceClosedError(self.url)

    def _end_locked(self) -> None:
        self._closed = True
        self._session.close()
        self._batch.take(())  # dropped: nothing runs after close

    def _run_locked(self, futures: dict[int, Future[Any]], *requests: Request) -> None:
        """Run the pending batch with ``requests`` and resolve their ``futures``, by request id.

        Raises:
            ConnectionLost: the session failed (a bug in the server's code, or an interrupt):
                it is closed, and every later call raises this too."""
        batch, buffers = self._batch.take(requests)
        self._runner = threading.current_thread()
        try:
            replies = self._run(batch, buffers)
        except BaseException as exc:
            self._broken(exc)
            assert self._error is not None
            if isinstance(exc, Exception):
                raise self._error from exc
            raise  # KeyboardInterrupt and the like go on as they are
        finally:
            self._runner = None
            if self._close_after_run:
                self._end_locked()
        for reply, data in replies:
            self._dispatch(reply, data, futures)

    def _run(self, batch: Batch, buffers: list[memoryview]) -> list[SessionReply]:
        """One batch through the session, as ``server/connection.py`` runs a received one."""
        session = self._session
        job = session.start(batch, buffers, rejected=self._rejection(batch))
        while not session.step(job, inline=False):
            pass  # a pull runs in a step of its own, as the server's pull threads run it
        return session.finish(job)

    def _rejection(self, batch: Batch) -> ErrorInfo | None:
        """The error the server's decoder would refuse ``batch``'s uploads with (every op of
        the batch then fails with it: ``server/incoming.py``), or None."""
        count, total = len(batch.buffers), sum(batch.buffers)
        try:
            if count > self._max_buffers:
                raise MessageLimitError(f"{count} buffers exceed the limit of {self._max_buffers}")
            if total > self._max_message:
                limit = self._max_message
                raise MessageLimitError(
                    f"the message declares {total} buffer bytes; the limit is {limit}"
                )
            self._session.check_upload(batch)
        except MessageLimitError as exc:
            return ErrorInfo(code=exc.code, message=str(exc))
        return None

    def _dispatch(
        self, reply: Any, data: Sequence[memoryview], futures: dict[int, Future[Any]]
    ) -> None:
        """Resolve the future ``reply`` answers, as ``client._connection`` does."""
        if isinstance(reply, SessionError):
            self._server_error = ServerProtocolError(reply.error)
            return
        future = futures.pop(reply.request_id)
        if isinstance(reply, ReadReply):
            # a copy, as a reply off the wire is: the session's memory stays its own
            sent = data[0] if data[0].c_contiguous else data[0].tobytes()  # a strided view
            flat = np.frombuffer(sent, dtype=to_numpy(reply.dtype))
            future.set_result(flat.reshape(reply.shape).copy())
        elif isinstance(reply, RequestFailed):
            future.set_exception(remote_error(reply.error))
        else:
            future.set_result(reply)

    def _broken(self, exc: BaseException) -> None:
        """The session failed while running a batch: close it, as a server drops a session
        whose worker step failed, and fail every later call."""
        self._error = ConnectionLost(
            f"the local {self.url} device failed: {type(exc).__name__}: {exc}",
            code=ErrorCode.INTERNAL,
        )
        self._session.close()


def _check_device(index: int, count: int) -> None:
    if count < 1:
        raise ValueError(f"a local device spec hosts at least 1 device, not {count}")
    if not 0 <= index < count:
        message = (
            f"device index {index} does not exist: this server hosts {count} device(s), "
            f"indices 0..{count - 1}"
        )
        raise DeviceIndexError(ErrorInfo(code=ErrorCode.BAD_DEVICE_INDEX, message=message))


def local_config(**limits: int | None) -> ServerConfig:
    """The server's defaults (``server/config.py``), not its environment (no
    ``TENSOR_SERVER_*`` variable is read), with the ``limits`` given (None: the default).

    Raises:
        ValueError: a limit is negative.
    """
    from server.config import ServerConfig  # the server is imported here, not on import

    for name, value in limits.items():
        if value is not None and value < 0:
            raise ValueError(f"{name} must be at least 0, not {value}")
    given = {name: value for name, value in limits.items() if value is not None}
    return ServerConfig.model_construct().model_copy(update=given)


def _new_session(index: int, config: ServerConfig) -> Session:
    """A session of device ``index`` with a memory budget of its own, as ``config`` says."""
    from server.budget import MemoryBudget
    from server.session import Limits, Session
    from server.store import TensorStore

    store = TensorStore(
        config.effective_session_quota, MemoryBudget(config.effective_memory_budget)
    )
    limits = Limits(config.max_op_bytes, config.max_ndim, config.max_graphs, config.max_graph_bytes)
    return Session(secrets.token_hex(8), index, store, limits)


class LocalDevice(SyncDevice):
    """The ``ndarray`` device ``index`` (of ``count``, the spec ``ndarray:COUNT``), in this
    process: the server's session and executor, run in the calling thread::

        with LocalDevice() as dev:
            xp = client.namespace(dev)

    Ops, errors, frees and :meth:`stats` behave as on a :class:`~client.RemoteDevice`; each
    device is a server of its own (its own memory budget and session). ``memory_budget``,
    ``session_quota``, ``max_op_bytes`` and ``max_ndim`` default to the server's defaults.

    Raises:
        DeviceIndexError: ``index`` is not in ``0..count-1``.
        ValueError: ``count`` is below 1 or a limit is negative.
    """

    def __init__(
        self,
        index: int = 0,
        count: int = 1,
        *,
        memory_budget: int | None = None,
        session_quota: int | None = None,
        max_op_bytes: int | None = None,
        max_ndim: int | None = None,
    ) -> None:
        config = local_config(
            memory_budget=memory_budget,
            session_quota=session_quota,
            max_op_bytes=max_op_bytes,
            max_ndim=max_ndim,
        )
        self._attach(LocalConnection(index, count, config), LOCAL_URL, index)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(index={self.index}, count={self.device_count})"
