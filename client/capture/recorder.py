"""Capture scopes: record the ops given to a device as a :class:`~client.capture.graph.Graph`.

While a :class:`Capture` is open on a device, the device's op API (``new_id``, ``submit``,
``submit_upload``, ``release``, ``submit_read``, ``describe``) is its: each op is checked
against what the graph knows and recorded, then passed on to the device (unless the device
only records, ``capture:`` with no inner device). Closing the scope puts the device's own
methods back and builds the graph. Nothing is slower outside a scope: the hooks are instance
attributes, set and removed by the scope.

What a graph may hold is decided here, at the op that breaks it, so the error points at the
user's line: a capture inside a capture, a read of a value that a record-only capture never
computed, an input used but not declared, an output the graph never produced, and an op whose
output shape depends on the data (a replay could differ).

The hooks are the device's, not the thread's: another thread's ops on the same device during a
capture are recorded too. Capture on a device no other thread is using meanwhile.

``implicit=True`` (used by :func:`client.capture.jit`) turns "an input used but not declared"
into an input the graph binds by identity: the arrays a training step reads but is not given
(parameters, optimizer state, a dataset) are the same arrays at every replay.
``implicit="constants"`` makes them constants instead, their values read once when the scope
closes: a model's forward pass with its weights in it, for a file or an ONNX export (a write
into one of them is then refused, as into any constant).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Future
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from pydantic import ValidationError

from protocol import DType, TensorMeta, from_numpy, to_numpy
from protocol.errors import GraphError
from protocol.graphs import (
    NAME_ADAPTER,
    GraphConstant,
    GraphDef,
    GraphTensor,
    check_graph,
    renumber,
)
from protocol.ops import AnyOp, FromBuffer

from ..device import Device, new_handle
from ..errors import CaptureError
from .graph import Graph

if TYPE_CHECKING:
    from ..array import RemoteArray

_HOOKS = ("new_id", "submit", "submit_upload", "release", "submit_read", "describe")
Implicit = bool | Literal["constants"]  # what an array read but not declared becomes


class Capture:
    """A capture scope on ``device``: ``with client.capture.Capture(dev) as cap: ...``, then
    ``cap.graph``. Declare inputs with :meth:`input` before using them, and outputs with
    :meth:`output`; ``implicit`` says what an array read but not declared becomes (the
    module docstring).

    Raises: CaptureError, from ``with`` when ``device`` is capturing already, and at once for
    ``implicit="constants"`` on a record-only device.
    """

    def __init__(self, device: Device, *, implicit: Implicit = False) -> None:
        self.device = device
        self.implicit = implicit
        self._executes = bool(getattr(device, "executes", True))
        if implicit == "constants" and not self._executes:
            raise CaptureError(
                'implicit="constants" reads the values of the arrays a capture reads: a '
                "record-only capture device (capture:) has none"
            )
        self._inputs: list[tuple[str, int, TensorMeta | None]] = []  # name, device id, meta
        self._implicit: list[int] = []
        self._known: set[int] = set()  # ids the graph may read: inputs, constants, op outputs
        self._made: set[int] = set()  # ids an op of the graph made
        self._constants: list[tuple[int, np.ndarray[Any, Any]]] = []
        self._ops: list[AnyOp] = []
        self._outputs: list[tuple[str, int, TensorMeta]] = []
        self._saved: dict[str, Any] = {}
        self.input_ids: tuple[int, ...] = ()  # the device ids bound to the graph's inputs
        self._graph: Graph | None = None
        self._open = False

    # --- the scope ----------------------------------------------------------------------------

    def __enter__(self) -> Capture:
        device = self.device
        if getattr(device, "_capturing", None) is not None:
            raise CaptureError(
                f"{device!r} is capturing already: a capture inside a capture is not supported"
            )
        if self._saved or self._graph is not None:
            raise CaptureError("a Capture records once; open a new one")
        hooks: dict[str, Callable[..., Any]] = {
            "new_id": device.new_id,
            "submit": self._submit,
            "submit_upload": self._submit_upload,
            "release": self._release,
            "submit_read": self._submit_read,
            "describe": self._describe,
        }
        self._saved = {name: getattr(device, name) for name in _HOOKS}
        for name, hook in hooks.items():
            setattr(device, name, hook)
        device._capturing = self  # type: ignore[attr-defined]
        _pause_known(device, True)
        self._open = True
        return self

    def __exit__(
        self, typ: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._close()
        if exc is None:
            self._graph = self._build()

    def _close(self) -> None:
        device = self.device
        for name in _HOOKS:  # the device's own: instance attributes set back, methods unshadowed
            if name in device.__dict__:
                delattr(device, name)
        for name in ("new_id", "submit", "release"):  # Device binds these per instance
            setattr(device, name, self._saved[name])
        device._capturing = None  # type: ignore[attr-defined]
        _pause_known(device, False)
        self._open = False

    @property
    def graph(self) -> Graph:
        """The recorded graph, once the scope closed without an error."""
        if self._graph is None:
            raise CaptureError("the capture scope has not closed (or it failed): no graph yet")
        return self._graph

    # --- declarations -------------------------------------------------------------------------

    def input(
        self,
        name: str,
        array: RemoteArray | None = None,
        *,
        shape: Sequence[int] | None = None,
        dtype: Any = None,
    ) -> RemoteArray:
        """Declare graph input ``name``: an array of this device (returned as it is), or, on a
        record-only device, a placeholder of ``shape`` and ``dtype`` (returned)."""
        self._check_open()
        _check_name("input", name)
        if name in {n for n, _, _ in self._inputs}:
            raise CaptureError(f"input {name!r} is declared twice")
        if array is None:
            if shape is None or dtype is None:
                raise CaptureError(f"input {name!r}: give an array, or shape and dtype")
            if self._executes:
                raise CaptureError(
                    f"input {name!r}: a capture that executes needs the input's values; give an "
                    "array of the device (placeholders are for record-only capture: devices)"
                )
            meta = TensorMeta(tuple(int(d) for d in shape), _wire_dtype(dtype))
            array = new_handle(self.device, self.device.new_id(), meta)
        elif array.device is not self.device:
            raise CaptureError(f"input {name!r} is on {array.device!r}, not {self.device!r}")
        if array.tensor_id in self._made or array.tensor_id in dict(self._constants):
            raise CaptureError(f"input {name!r} was made inside the capture: it is not an input")
        self._inputs.append((name, array.tensor_id, array.meta))
        self._known.add(array.tensor_id)
        return array

    def output(self, name: str, array: RemoteArray) -> None:
        """Declare graph output ``name``: an array that an op of this capture made."""
        self._check_open()
        _check_name("output", name)
        if array.device is not self.device or array.tensor_id not in self._made:
            raise CaptureError(
                f"output {name!r} (#{array.tensor_id}) was not produced by an op of this "
                "capture: a graph's outputs are what its ops make"
            )
        if name in {n for n, _, _ in self._outputs}:
            raise CaptureError(f"output {name!r} is declared twice")
        self._outputs.append((name, array.tensor_id, array.meta))

    def _check_open(self) -> None:
        if not self._open:
            raise CaptureError("declare inputs and outputs inside the capture scope")

    def submit_unrecorded(self, op: AnyOp) -> None:
        """Send ``op`` to the device as if it had been sent before the capture began: an
        iterated element's ``full``, made when an op first names it (``client._elements``), is
        an array from before the capture, which the graph reads as such."""
        self._saved["submit"](op)

    # --- the hooks ----------------------------------------------------------------------------

    def _submit(self, op: AnyOp) -> None:
        self._record(op)
        if self._executes:
            self._saved["submit"](op)

    def _record(self, op: AnyOp) -> None:
        for tensor_id in op.inputs():
            if tensor_id not in self._known:
                if not self.implicit:
                    raise CaptureError(
                        f"{op.describe()} reads #{tensor_id}, an array made before the capture "
                        "that is not declared: pass it through cap.input(name, array)"
                    )
                self._implicit.append(tensor_id)
                self._known.add(tensor_id)
        if not op.inplace:
            self._made.update(op.outputs())
            self._known.update(op.outputs())
        self._ops.append(op)

    def _submit_upload(self, make_op: Callable[[int], AnyOp], data: memoryview) -> None:
        op = make_op(0)
        assert isinstance(op, FromBuffer)
        values = np.frombuffer(bytes(data), dtype=to_numpy(op.dtype).newbyteorder("<"))
        self._constants.append((op.out, values.reshape(op.shape)))
        self._known.add(op.out)
        if self._executes:
            self._saved["submit_upload"](make_op, data)

    def _release(self, tensor_id: int) -> None:
        if self._executes:
            self._saved["release"](tensor_id)

    def _submit_read(self, tensor_id: int) -> Future[np.ndarray[Any, Any]]:
        if not self._executes:
            raise CaptureError(
                f"cannot read #{tensor_id}: a record-only capture computes nothing (read it "
                "after replaying the graph on a device)"
            )
        result: Future[np.ndarray[Any, Any]] = self._saved["submit_read"](tensor_id)
        return result

    def _describe(self, tensor_ids: Sequence[int]) -> list[TensorMeta]:
        raise CaptureError(
            f"#{', #'.join(map(str, tensor_ids))}: an op whose output shape depends on the data "
            "(nonzero, unique_*, boolean masks) cannot be captured: its replays could differ"
        )

    # --- the graph ----------------------------------------------------------------------------

    def _build(self) -> Graph:
        """The graph: ids renumbered (inputs, then constants, then op outputs, in order)."""
        if self.implicit == "constants":  # their values, read now, are the graph's constants
            reads = [(i, self.device.submit_read(i)) for i in self._implicit]
            self._constants += [(i, read.result()) for i, read in reads]
            self._implicit = []
        metas = dict(zip(self._implicit, self._describe_implicit(), strict=True))
        inputs = [(n, i, m) for n, i, m in self._inputs if m is not None]
        inputs += [(f"captured_{k}", i, metas[i]) for k, i in enumerate(self._implicit)]
        ids: dict[int, int] = {}
        for device_id in [i for _, i, _ in inputs] + [i for i, _ in self._constants]:
            ids[device_id] = len(ids)
        for op in self._ops:
            for tensor_id in op.outputs():
                ids.setdefault(tensor_id, len(ids))
        definition = GraphDef(
            inputs=[
                GraphTensor(name=n, id=ids[i], shape=m.shape, dtype=m.dtype) for n, i, m in inputs
            ],
            outputs=[
                GraphTensor(name=n, id=ids[i], shape=m.shape, dtype=m.dtype)
                for n, i, m in self._outputs
            ],
            constants=[
                GraphConstant(id=ids[i], shape=v.shape, dtype=_wire_dtype(v.dtype))
                for i, v in self._constants
            ],
            ops=[renumber(op, ids) for op in self._ops],
        )
        try:
            check_graph(definition)
        except GraphError as exc:
            raise CaptureError(f"the captured graph does not hold together: {exc}") from None
        self.input_ids = tuple(i for _, i, _ in inputs)
        return Graph(definition, [v for _, v in self._constants])

    def _describe_implicit(self) -> list[TensorMeta]:
        """The metas of the arrays the graph read without declaring them: one round trip."""
        if not self._implicit:
            return []
        return self.device.describe(self._implicit)


def _check_name(role: str, name: str) -> None:
    """Refuse, where it is declared, a name a graph cannot hold (``protocol.graphs.Name``)."""
    try:
        NAME_ADAPTER.validate_python(name)
    except ValidationError as exc:
        reason = exc.errors()[0]["msg"].removeprefix("Value error, ")
        raise CaptureError(f"{role} name {name!r}: {reason}") from None


def _wire_dtype(dtype: Any) -> DType:
    return from_numpy(np.dtype(dtype))


def _pause_known(device: Device, paused: bool) -> None:
    """While a capture records, the device answers no read from what its client knows (the
    capture sees every read it makes)."""
    known = getattr(device, "known", None)
    if known is not None:
        known.paused = paused
