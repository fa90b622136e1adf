"""Issue 30, rows 1, 2, 3 and 7, through real servers: registered graphs under a hostile client.

A registration's check and plan never hold the event loop (another session's read and
``/healthz`` answer while a graph of one very wide op is registered, or that op is sent
plainly); what a session makes the server keep for its graphs (their structure, the error of
each failed registration) is charged to its quota and the budget before it is kept, and an
error's text is bounded; a constant numpy cannot shape is refused as ``limit_exceeded`` naming
it, with no traceback in the log.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

import client
from client.device import new_handle
from client.errors import RemoteError
from protocol import ErrorCode
from protocol.graphs import GraphConstant, GraphDef, GraphTensor
from protocol.ops import Reduce, RunGraph

from .servers import ServerProcess, run_server

F64 = "float64"


def _tensor(name: str, tensor_id: int, shape: tuple[int, ...]) -> GraphTensor:
    return GraphTensor(name=name, id=tensor_id, shape=shape, dtype=F64)


def _run(dev: client.RemoteDevice, graph: GraphDef, *constants: bytes) -> client.RemoteArray:
    """Register ``graph`` (one input of shape (1,), one output) and run it on ones."""
    graph_id = dev.new_graph_id()
    dev.register_graph(graph_id, graph, [memoryview(c) for c in constants])
    x = client.namespace(dev).asarray(np.ones(1))
    out = dev.new_id()
    dev.submit(RunGraph(out=out, graph=graph_id, args=(x.tensor_id,)))
    return new_handle(dev, out, graph.outputs[0].meta)


def _error(array: client.RemoteArray) -> RemoteError:
    try:
        array.numpy()
    except RemoteError as exc:
        return exc.with_traceback(None)
    raise AssertionError(f"reading #{array.tensor_id} raised nothing")


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    with run_server() as proc:
        yield proc


# --- row 7: constants numpy cannot shape -------------------------------------------------------

UNSHAPEABLE = {  # no bytes to send, and still no array numpy can make
    "empty, past the address space": (0, 2**62, 2**62),
    "empty, 65 dimensions": (0,) * 65,
}


@pytest.mark.parametrize("shape", list(UNSHAPEABLE.values()), ids=list(UNSHAPEABLE))
@pytest.mark.parametrize("used", [True, False], ids=["read by an op", "unused"])
def test_a_constant_numpy_cannot_shape_is_refused_naming_it_without_a_traceback(
    server: ServerProcess, shape: tuple[int, ...], used: bool
) -> None:
    """Before: ``internal`` (numpy's ValueError), and a traceback in the log per registration."""
    constant = GraphConstant(id=1, shape=shape, dtype=F64)
    ops = [Reduce(op="sum", out=2, x=1 if used else 0)]
    graph = GraphDef(
        inputs=[_tensor("x", 0, (1,))],
        constants=[constant],
        ops=ops,
        outputs=[_tensor("y", 2, ())],
    )
    with client.RemoteDevice(server.url) as dev:
        error = _error(_run(dev, graph, b""))
    assert error.code == ErrorCode.LIMIT_EXCEEDED, error
    assert "constant #1" in str(error)
    assert "Traceback" not in server.stderr.text()
