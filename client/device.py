"""Devices: a session with one device of a Tensorwire server.

``RemoteDevice`` is for plain synchronous code; ``AsyncRemoteDevice`` for asyncio code; several
threads may share one: the thread that waits for a reply reads it (``AsyncRemoteDevice`` waits
in a worker thread). Ops never wait; only reads, syncs, stats and exposes do.

:class:`Device` is also the API the array layer builds ops with (``new_id``, ``submit``,
``submit_upload``, ``release``, ``submit_read``, ``describe``, ``expose``; ``new_graph_id``,
``register_graph``, ``drop_graph``): the layer below ``client.array``, which knows arrays only
through the hook :func:`register_array_type`, which :func:`new_handle` calls.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from contextlib import AbstractContextManager, nullcontext
from functools import partial
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self, Unpack

import numpy as np

from protocol import (
    Describe,
    Expose,
    ExposeReply,
    Read,
    Stats,
    Sync,
    TensorMeta,
)
from protocol.graphs import GraphDef
from protocol.ops import AnyOp

from ._connection import Connection
from ._device_connection import DeviceConnection
from ._environment import server_token, server_url
from ._known import Known
from ._opening import url_of
from ._options import ConnectionKeywords, ConnectionOptions
from ._origins import SYNC_ENV, Origins, read_values, switched_on, wait_for
from ._stats import SegmentStats, SessionStats, session_stats

if TYPE_CHECKING:
    from .array import RemoteArray

ArrayType = Callable[["Device", int, TensorMeta], "RemoteArray"]

# The handle type of the layer above, for new_handle: client.array registers RemoteArray
# once, on import (client/__init__ imports it first), so that this layer imports nothing upward.
_array_type: ArrayType | None = None


def register_array_type(array_type: ArrayType) -> None:
    """Make :func:`new_handle` (and so :meth:`Device.submit_unchecked`) return handles of
    ``array_type``. Called once by ``client.array``."""
    global _array_type
    _array_type = array_type


def new_handle(device: Device, tensor_id: int, meta: TensorMeta) -> RemoteArray:
    """A handle of the registered array type on the tensor ``tensor_id`` of ``device`` (whose
    meta segment replay notes, ``client._segments``)."""
    assert _array_type is not None, "client.array registers the handle type on import"
    metas = device.segment_metas
    if metas is not None:
        metas[tensor_id] = meta
    origins = device.origins
    if origins.on:  # tested here: a call costs more than the test when they are off
        origins.note(tensor_id)
    handle = _array_type(device, tensor_id, meta)
    if device.sync_ops:
        wait_for(device, tensor_id)
    return handle


class Device:
    """What both device kinds share: the session, and the API the array layer builds ops with.

    ``new_id``, ``submit`` and ``release`` are the connection's own methods, bound once here:
    every op calls them, and an op must cost no call more than the connection does.
    """

    new_id: Callable[[], int]
    """A fresh tensor id for an op's output: the client allocates every id itself."""

    submit: Callable[[AnyOp], None]
    """Queue a checked op; it travels with the next flush (nothing waits).

    Raises:
        ConnectionLost: the connection is closed or broken.
    """

    release: Callable[[int], None]
    """Free a tensor id on the server at the next flush. Safe from ``__del__``, in any thread."""

    segment_metas: dict[int, TensorMeta] | None = None
    """The metas of live ids, which :func:`new_handle` notes for segment replay (None: off)."""

    origins: Origins
    """Where user code made each op (``client._origins``), which :func:`new_handle` notes."""
    sync_ops = False  # wait for every op as it is made (``sync``, ``client._origins``)

    def __init__(
        self,
        url: str | None = None,
        index: int = 0,
        token: str | None = None,
        **keywords: Unpack[ConnectionKeywords],
    ) -> None:
        url = url_of(server_url(url))  # without one: TENSORWIRE_URL (client._environment)
        options = ConnectionOptions(token=server_token(token), **keywords)  # checked here
        self._attach(Connection(url, index, options), url, index, options.sync, options.origins)

    @classmethod
    def from_connection(cls, conn: DeviceConnection, url: str, index: int = 0) -> Self:
        """A device over ``conn``, a connection already open (for a device without a server
        URL, such as :class:`client.local.LocalDevice`); ``url`` names it in ``repr``. The
        device closes ``conn`` when it is closed or collected."""
        device = cls.__new__(cls)
        device._attach(conn, url, index)
        return device

    def _attach(self, conn: DeviceConnection, url: str, index: int, *flags: bool | None) -> None:
        """Use ``conn``; ``flags`` are ``RemoteDevice``'s ``sync`` and ``origins`` (None, or
        left out: as the environment says, ``client._origins``)."""
        sync, origins = (*flags, None, None)[:2]
        self.url = url
        self.index = index
        self._conn = conn
        self.new_id, self.submit, self.release = conn.new_id, conn.submit, conn.release
        self.segment_metas = getattr(conn, "segment_metas", None)
        self.origins = Origins(origins)
        self.sync_ops = switched_on(SYNC_ENV) if sync is None else sync
        self.known = Known(conn)  # what the client knows of its tensors' values
        self._close = weakref.finalize(self, conn.close)  # also runs at exit

    @property
    def server_id(self) -> str:
        """Random per server start: a changed id means the server restarted."""
        return self._conn.welcome.server_id

    @property
    def session_id(self) -> str:
        return self._conn.welcome.session_id

    @property
    def device_count(self) -> int:
        """How many devices the server hosts."""
        return self._conn.welcome.device_count

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r}, index={self.index})"

    def flush(self) -> None:
        """Send pending ops now without waiting for them."""
        self._conn.flush()

    def submit_upload(self, make_op: Callable[[int], AnyOp], data: memoryview) -> None:
        """Queue the op ``make_op(buffer_index)`` whose bytes are ``data``; the caller may
        change the memory behind ``data`` once this returns.

        Raises:
            ConnectionLost: the connection is closed, or broke before a large upload was sent.
        """
        self._conn.submit_upload(make_op, data)

    def submit_read(self, tensor_id: int) -> Future[np.ndarray[Any, Any]]:
        """Flush with a read of ``tensor_id``; the future resolves with a new, writable numpy
        array. Its ``result()`` reads the connection while it waits, so call it from a thread
        that may block (:meth:`AsyncRemoteDevice.read` waits in a worker thread).

        The future raises ``RemoteError`` if the op that produced the tensor, or one it depends
        on, failed, and ``ConnectionLost`` if the connection closed or broke.
        """
        return self._conn.request(partial(_read, tensor=tensor_id))

    def together(self) -> AbstractContextManager[None]:
        """The requests made inside (reads, describes) go out in one message as it ends."""
        return self._conn.together() if hasattr(self, "_conn") else nullcontext()  # capture: none

    def describe(self, tensor_ids: Sequence[int]) -> list[TensorMeta]:
        """The shapes and dtypes the server holds for ``tensor_ids`` (the outputs of an op with
        data-dependent shapes): the requests are pipelined, so this costs one round trip
        however many ids there are.

        Raises:
            RemoteError: the op that produced one of them failed.
            ConnectionLost: the connection closed or broke.
        """
        with self.together():
            futures = [self._conn.request(partial(_describe, tensor=t)) for t in tensor_ids]
        replies = [f.result() for f in futures]
        return [TensorMeta(tuple(r.shape), r.dtype) for r in replies]

    def expose(self, tensor_id: int, audience: str) -> Future[ExposeReply]:
        """Flush with a request for a capability that lets server ``audience`` (a
        ``server_id``) copy ``tensor_id`` once, as it is now (``client.transfer``)."""
        return self._conn.request(
            lambda rid: Expose(request_id=rid, tensor=tensor_id, audience=audience)
        )

    def new_graph_id(self) -> int:
        """A fresh id for a graph to register: the client allocates graph ids, as tensor ids."""
        return self._conn.new_graph_id()

    def register_graph(
        self, graph_id: int, graph: GraphDef, constants: Sequence[memoryview]
    ) -> None:
        """Register ``graph`` in this session under ``graph_id`` (from :meth:`new_graph_id`)
        with the next flush, before that batch's ops; ``constants`` are the bytes of
        ``graph.constants``, in order, taken as :meth:`submit_upload` takes an upload's. Then
        a :class:`~protocol.ops.RunGraph` op (``submit``) runs it on new inputs, until
        :meth:`drop_graph`. Nothing waits: a graph the server refuses (its checks, limits,
        memory) is remembered as failed, and each ``run_graph`` of it fails with the reason
        (``RemoteError`` when an output is read).

        Raises:
            ConnectionLost: the connection is closed, or broke before a large constant was sent.
        """
        self._conn.register_graph(graph_id, graph, constants)

    def drop_graph(self, graph_id: int) -> None:
        """Drop graph ``graph_id`` and its constants from the session with the next flush,
        after the ops queued before. Safe from ``__del__``, in any thread."""
        self._conn.drop_graph(graph_id)

    def segment_stats(self) -> SegmentStats:
        """What segment replay did in this session: hits, misses, registrations, evictions
        (no round trip; README, "Segment replay")."""
        stats: Callable[[], SegmentStats] | None = getattr(self._conn, "segment_stats", None)
        return SegmentStats() if stats is None else stats()

    def submit_unchecked(self, op: AnyOp, meta: TensorMeta) -> RemoteArray:
        """Send ``op`` as it is, without the local shape and dtype checks, and return a handle
        for its output described by ``meta``. A protocol-level tool for tests and experiments:
        if ``op`` is invalid, reading the handle raises ``RemoteError``.
        """
        self.known.forget()  # an op of any reach: nothing known holds
        self.submit(op)
        handle = new_handle(self, op.out, meta)
        handle._base = -1  # it may view any tensor
        return handle

    def _raise_server_error(self) -> None:
        error = self._conn.take_server_error()
        if error is not None:
            raise error


def _describe(request_id: int, tensor: int) -> Describe:
    return Describe(request_id=request_id, tensor=tensor)


def _read(request_id: int, tensor: int) -> Read:
    return Read(request_id=request_id, tensor=tensor)


class SyncDevice(Device):
    """What a device for synchronous code offers beside the op API: ``sync``, ``stats``,
    ``flush``, ``close`` and the context manager (:class:`RemoteDevice`, and the in-process
    ``client.local.LocalDevice``)."""

    def sync(self) -> None:
        """Wait until every op submitted so far has run.

        Raises:
            ConnectionLost: the connection closed or broke.
            ServerProtocolError: the server reported a malformed message from this client.
        """
        self._conn.request(lambda rid: Sync(request_id=rid)).result()
        self._raise_server_error()

    def stats(self) -> SessionStats:
        """The server's count of this session's tensors and bytes, after every op so far."""
        return session_stats(self._conn.request(lambda rid: Stats(request_id=rid)).result())

    def close(self) -> None:
        """Send what is pending and close the session. Idempotent."""
        self._close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, typ: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class RemoteDevice(SyncDevice):
    """A device on a Tensorwire server, for synchronous code::

        with client.RemoteDevice("ws://127.0.0.1:8765") as dev:
            xp = client.namespace(dev)

    ``url`` is ``ws://HOST:PORT`` (or ``wss://``), or the same as a device spec,
    ``remote:ws://HOST:PORT``; without one, ``TENSORWIRE_URL``. ``index`` picks one of the
    server's devices. ``token`` defaults to ``TENSORWIRE_TOKEN``, or the contents of the file
    ``TENSORWIRE_TOKEN_FILE``, or ``TENSOR_SERVER_TOKEN`` (``client._environment``); it travels as
    ``Authorization: Bearer TOKEN`` on the upgrade request. For ``wss://`` the server's
    certificate is verified against ``ca_file`` (a PEM file) or the system's CAs. Connecting,
    the upgrade and the handshake together may take ``open_timeout`` seconds (10 by default).

    The client watches the server (seconds; None turns a bound off): after ``ping_interval``
    without a byte from it, a ping, which the server answers even while it runs a long op; one
    unanswered for ``ping_timeout`` means it stopped (found within about 26 s). ``timeout`` (off
    by default) bounds how long one call (a read, sync, stats, describe or expose, or a send
    the server does not take) waits, long ops included, and ends the session when it passes:
    every call raises :class:`~client.ServerNotResponding`, a ``SessionLost``.

    The session outlives its connection (README, "When the connection drops"). When the
    connection breaks, or a ping goes unanswered (a dead path looks so too), the client
    reconnects by itself and resumes the session, with what the server had not received sent
    again and the replies it had not sent repeated: every op runs once. It tries up to
    ``reconnect_attempts`` times (10; 0: off) within ``reconnect_timeout`` seconds (20; never
    past the server's resume window, nor, after an unanswered ping, ``ping_timeout``), the
    first at once, then after ``reconnect_backoff`` seconds (0.05), each wait 1.6 times longer
    up to ``reconnect_backoff_max`` (2), with +-20% jitter.
    Then a session that cannot be resumed fails every call with :class:`~client.SessionLost`.

    An op's error surfaces when a result is read: ``origins=True`` (``TENSORWIRE_ORIGINS=1``)
    has it name the line that made the op, ``sync=True`` (``TENSORWIRE_SYNC=1``) waits for each
    op so that it raises there, as ``CUDA_LAUNCH_BLOCKING=1`` does. Off by default: both slow
    every op (``client._origins``).

    ``token`` and these keyword arguments (``client._options.ConnectionKeywords``) are the
    connection's settings wherever a device is opened, documented here for all: the same in
    ``AsyncRemoteDevice.connect`` and ``client.open_device``.

    Raises:
        AuthenticationError: the token is missing or wrong.
        ServerBusyError: the server's connection limit is reached, or (its subclass
            ServerShuttingDownError) the server is shutting down.
        HandshakeError: (another subclass of) the server refused the session.
        ConnectionLost: the server cannot be reached, or TLS verification failed.
        ValueError: no URL (nor ``TENSORWIRE_URL``), an unreadable ``TENSORWIRE_TOKEN_FILE``,
            ``timeout``, ``ping_interval`` or ``ping_timeout`` is not positive, or a
            reconnection bound is out of range.
    """

    _conn: Connection  # made by __init__: a connection to a server


class AsyncRemoteDevice(Device):
    """A device on a Tensorwire server, for asyncio code::

        async with await client.AsyncRemoteDevice.connect("ws://127.0.0.1:8765") as dev:
            xp = client.namespace(dev)
            y = await dev.read(xp.exp(xp.ones(3)))

    Ops are submitted exactly as with :class:`RemoteDevice` (they never wait); reads, syncs and
    stats are awaited and never block the caller's event loop.
    """

    _conn: Connection  # made by __init__: a connection to a server

    @classmethod
    async def connect(
        cls,
        url: str | None = None,
        index: int = 0,
        token: str | None = None,
        **keywords: Unpack[ConnectionKeywords],
    ) -> AsyncRemoteDevice:
        """Connect without blocking the loop. The parameters and errors are RemoteDevice's."""
        return await asyncio.to_thread(partial(cls, url, index, token, **keywords))

    async def read(self, array: RemoteArray) -> np.ndarray[Any, Any]:
        """The array's values as a new, writable numpy array (one round trip, awaited in a
        worker thread).

        Raises:
            RemoteError: the op that produced ``array``, or one it depends on, failed.
            ConnectionLost: the connection closed or broke (``ServerNotResponding``: the
                server stopped answering).
        """
        return await asyncio.to_thread(read_values, self, array.tensor_id)

    async def sync(self) -> None:
        await asyncio.to_thread(self._conn.request(lambda rid: Sync(request_id=rid)).result)
        self._raise_server_error()

    async def stats(self) -> SessionStats:
        reply = self._conn.request(lambda rid: Stats(request_id=rid))
        return session_stats(await asyncio.to_thread(reply.result))

    async def aclose(self) -> None:
        await asyncio.to_thread(self._close)

    async def __aenter__(self) -> AsyncRemoteDevice:
        return self

    async def __aexit__(
        self, typ: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()
