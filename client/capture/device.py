"""``CaptureDevice``: the ``capture:`` device of the spec grammar, a client device.

``capture:SPEC`` is the device SPEC with recording: outside a scope its ops run on SPEC as
they would there (set up parameters, upload data); inside ``with dev.capture() as cap:`` they
are recorded and run. ``capture:`` alone has no device under it: it runs nothing, so its ops
happen only inside a scope, on placeholder inputs (``cap.input(name, shape=, dtype=)``), with
shapes and dtypes from the protocol's inference rules; it is how a graph is built without a
server (for a file or an ONNX export).

A server never hosts one (``server.config``): recording belongs where the ops are made.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from types import TracebackType
from typing import Any

import numpy as np

from protocol import TensorMeta
from protocol.ops import AnyOp

from .._known import Known
from .._origins import Origins
from .._stats import SessionStats
from ..device import Device
from ..errors import CaptureError
from .recorder import Capture, Implicit


class CaptureDevice(Device):
    """A device that records inside :meth:`capture` scopes; ``inner`` runs the ops (None: a
    record-only device, which runs nothing)."""

    def __init__(self, inner: Device | None = None) -> None:  # no connection of its own
        if isinstance(inner, CaptureDevice):
            raise CaptureError("a capture device over a capture device is not supported")
        self.inner = inner
        self.executes = inner is not None
        self.url = "capture:" + ("" if inner is None else inner.url)
        self.index = 0 if inner is None else inner.index
        self._capturing: Capture | None = None
        self.origins = Origins() if inner is None else inner.origins
        self.known = Known() if inner is None else inner.known
        if inner is not None:
            self._conn = inner._conn
            self.new_id, self.submit, self.release = inner.new_id, inner.submit, inner.release
        else:
            self.new_id = itertools.count(1).__next__
            self.submit = self._runs_nothing
            self.release = _ignore

    def __repr__(self) -> str:
        return f"CaptureDevice({self.url!r})"

    def capture(self, *, implicit: Implicit = False) -> Capture:
        """A capture scope on this device (``client.capture`` does the same for any device)."""
        return Capture(self, implicit=implicit)

    def _runs_nothing(self, op: AnyOp) -> None:
        raise CaptureError(
            f"{op.describe()}: a record-only capture device (capture:) runs nothing; make "
            "its ops inside `with dev.capture() as cap:`"
        )

    def _inner(self, what: str) -> Device:
        if self.inner is None:
            raise CaptureError(f"a record-only capture device (capture:) has no {what}")
        return self.inner

    # --- the device API, passed to the inner device -------------------------------------------

    def submit_upload(self, make_op: Callable[[int], AnyOp], data: memoryview) -> None:
        if self.inner is None:
            self._runs_nothing(make_op(0))
        else:
            self.inner.submit_upload(make_op, data)

    def submit_read(self, tensor_id: int) -> Future[np.ndarray[Any, Any]]:
        return self._inner("values to read").submit_read(tensor_id)

    def describe(self, tensor_ids: Sequence[int]) -> list[TensorMeta]:
        return self._inner("values to describe").describe(tensor_ids)

    def new_graph_id(self) -> int:
        return self._inner("session to register graphs in").new_graph_id()

    def register_graph(self, graph_id: int, graph: Any, constants: Sequence[memoryview]) -> None:
        self._inner("session to register graphs in").register_graph(graph_id, graph, constants)

    def drop_graph(self, graph_id: int) -> None:
        if self.inner is not None:
            self.inner.drop_graph(graph_id)

    def sync(self) -> None:
        if self.inner is not None:
            self.inner.sync()  # type: ignore[attr-defined]

    def stats(self) -> SessionStats:
        result: SessionStats = self._inner("session").stats()  # type: ignore[attr-defined]
        return result

    def flush(self) -> None:
        if self.inner is not None:
            self.inner.flush()

    def close(self) -> None:
        if self.inner is not None:
            self.inner.close()  # type: ignore[attr-defined]

    def __enter__(self) -> CaptureDevice:
        return self

    def __exit__(
        self, typ: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def _ignore(tensor_id: int) -> None:
    """A record-only device holds nothing to free."""
