"""Registered graphs through a real server and the real client: ``register_graph``, then
``run_graph`` ops (one op per replay), then ``drop_graph``. Graphs are built by hand here, so
every id and op is the test's own; ``client.capture`` builds them from code elsewhere."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

import client
from client.array import RemoteArray
from client.device import new_handle
from client.errors import RemoteError, ServerProtocolError
from protocol import ErrorCode, TensorMeta
from protocol.graphs import GraphConstant, GraphDef, GraphTensor
from protocol.ops import (
    Binary,
    BinaryScalar,
    InPlaceBinary,
    PermuteDims,
    Reduce,
    Reshape,
    RunGraph,
    Unary,
)
from server.registration import structure_bytes

from .polling import wait_until
from .servers import ServerProcess, run_server

F64 = "float64"
GRAPH_LIMITS = (
    "--max-graphs",
    "2",
    "--max-graph-bytes",
    "16KiB",
    "--session-quota",
    "256KiB",
    "--max-op-bytes",
    "64KiB",
)


def _tensor(name: str, tensor_id: int, shape: tuple[int, ...], dtype: str = F64) -> GraphTensor:
    return GraphTensor(name=name, id=tensor_id, shape=shape, dtype=dtype)  # type: ignore[arg-type]


def tanh_graph() -> tuple[GraphDef, np.ndarray]:
    """``y = tanh(x @ w) + c``, with ``c`` a constant; and ``c``."""
    c = np.array([0.5, -1.0, 2.0, 0.25])
    graph = GraphDef(
        inputs=[_tensor("x", 0, (2, 3)), _tensor("w", 1, (3, 4))],
        constants=[GraphConstant(id=2, shape=(4,), dtype=F64)],
        ops=[
            Binary(op="matmul", out=3, x1=0, x2=1),
            Unary(op="tanh", out=4, x=3),
            Binary(op="add", out=5, x1=4, x2=2),
        ],
        outputs=[_tensor("y", 5, (2, 4))],
    )
    return graph, c


def sgd_graph(n: int) -> GraphDef:
    """A training step on ``w`` (n x n) for ``x`` (n x n): ``loss = sum(x @ w)``; its gradient
    ``g = x.T @ ones``; ``w -= 0.01 * g`` in place; outputs the loss and ``w * w`` after the
    update. ``x @ w`` costs more than the event loop takes for n = 64: a worker thread runs it."""
    return GraphDef(
        inputs=[_tensor("w", 0, (n, n)), _tensor("x", 1, (n, n))],
        ops=[
            Binary(op="matmul", out=2, x1=1, x2=0),
            Reduce(op="sum", out=3, x=2),
            PermuteDims(out=4, x=1, axes=(1, 0)),
            Reduce(op="sum", out=5, x=4, axis=(1,), keepdims=True),  # x.T @ ones, per column
            BinaryScalar(op="multiply", out=6, x=5, scalar=0.01),
            InPlaceBinary(op="subtract", out=0, x2=6),
            Binary(op="multiply", out=7, x1=0, x2=0),
        ],
        outputs=[_tensor("loss", 3, ()), _tensor("w2", 7, (n, n))],
    )


def register(dev: client.RemoteDevice, graph: GraphDef, *constants: np.ndarray) -> int:
    graph_id = dev.new_graph_id()
    dev.register_graph(graph_id, graph, [memoryview(c.tobytes()) for c in constants])
    return graph_id


def run(
    dev: client.RemoteDevice, graph_id: int, graph: GraphDef, *args: RemoteArray
) -> list[RemoteArray]:
    """Submit one ``run_graph`` op; handles for its outputs."""
    ids = [dev.new_id() for _ in graph.outputs]
    arg_ids = tuple(a.tensor_id for a in args)
    dev.submit(RunGraph(out=ids[0], more=tuple(ids[1:]), graph=graph_id, args=arg_ids))
    return [new_handle(dev, i, t.meta) for i, t in zip(ids, graph.outputs, strict=True)]


def remote_error(array: RemoteArray) -> RemoteError:
    """The error reading ``array`` raises, without its traceback (whose frames would keep the
    handle, and so the tensor, alive until the garbage collector runs)."""
    try:
        array.numpy()
    except RemoteError as exc:
        return exc.with_traceback(None)
    raise AssertionError(f"reading #{array.tensor_id} raised nothing")


def settled(dev: client.RemoteDevice) -> client.device.SessionStats:
    """This session's stats once it is the server's only session (an earlier test's session
    may still be closing), so that the server's byte count is this session's."""
    wait_until(lambda: dev.stats().connections == 1, "the other sessions to close")
    return dev.stats()


# --- results ----------------------------------------------------------------------------------


def test_results_equal_numpy_on_two_runs_with_different_inputs(
    dev: client.RemoteDevice, xp: client.Namespace
) -> None:
    graph, c = tanh_graph()
    graph_id = register(dev, graph, c)
    rng = np.random.default_rng(0)
    w = rng.standard_normal((3, 4))
    remote_w = xp.asarray(w)
    for _ in range(2):
        x = rng.standard_normal((2, 3))
        (y,) = run(dev, graph_id, graph, xp.asarray(x), remote_w)
        np.testing.assert_allclose(y.numpy(), np.tanh(x @ w) + c, rtol=1e-12)
    assert dev.stats().failed == 0


def test_an_in_place_update_of_an_input_persists_across_runs(
    dev: client.RemoteDevice, xp: client.Namespace
) -> None:
    n = 64
    graph = sgd_graph(n)
    graph_id = register(dev, graph)
    rng = np.random.default_rng(1)
    w, x = rng.standard_normal((n, n)), rng.standard_normal((n, n))
    remote_w, remote_x = xp.asarray(w), xp.asarray(x)
    for _ in range(3):
        loss, w2 = run(dev, graph_id, graph, remote_w, remote_x)
        expected_loss = np.sum(x @ w)
        w -= 0.01 * np.sum(x.T, axis=1, keepdims=True)
        np.testing.assert_allclose(loss.numpy(), expected_loss, rtol=1e-10)
        np.testing.assert_allclose(w2.numpy(), w * w, rtol=1e-10)
        np.testing.assert_allclose(remote_w.numpy(), w, rtol=1e-10)  # the stored tensor moved


# --- failures like an op's ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("x_shape", "x_dtype", "with_w", "match"),
    [
        ((3, 2), F64, True, "input 'x' has shape"),
        ((2, 3), "float32", True, "input 'x' is float64, given float32"),
        ((2, 3), F64, False, "takes 2 inputs"),
    ],
)
def test_a_wrong_signature_fails_like_an_op_and_the_session_goes_on(
    dev: client.RemoteDevice,
    xp: client.Namespace,
    x_shape: tuple[int, ...],
    x_dtype: str,
    with_w: bool,
    match: str,
) -> None:
    graph, c = tanh_graph()
    graph_id = register(dev, graph, c)
    w = xp.asarray(np.ones((3, 4)))
    x = xp.asarray(np.ones(x_shape, dtype=x_dtype))
    (y,) = run(dev, graph_id, graph, *((x, w) if with_w else (x,)))
    error = remote_error(y)
    assert error.code == ErrorCode.INVALID_OP
    assert match in str(error) and f"run_graph[{graph_id}]" in str(error)
    (good,) = run(dev, graph_id, graph, xp.asarray(np.ones((2, 3))), w)
    np.testing.assert_allclose(good.numpy(), np.tanh(np.full((2, 4), 3.0)) + c)
    dev.sync()  # no session error: the failure is the op's


def test_an_unknown_graph_id_fails_the_run(dev: client.RemoteDevice, xp: client.Namespace) -> None:
    graph, _ = tanh_graph()
    (y,) = run(dev, 10**12, graph, xp.asarray(np.ones((2, 3))), xp.asarray(np.ones((3, 4))))
    error = remote_error(y)
    assert error.code == ErrorCode.UNKNOWN_GRAPH and "graph #1000000000000" in str(error)


def test_a_failed_input_is_inherited(dev: client.RemoteDevice, xp: client.Namespace) -> None:
    graph, c = tanh_graph()
    graph_id = register(dev, graph, c)
    bad = xp.asarray(np.ones((2, 5))) @ xp.asarray(np.ones((5, 3)))
    broken = dev.submit_unchecked(  # a matmul the server refuses: its output is failed
        Binary(op="matmul", out=dev.new_id(), x1=bad.tensor_id, x2=bad.tensor_id),
        TensorMeta((2, 3), F64),
    )
    (y,) = run(dev, graph_id, graph, broken, xp.asarray(np.ones((3, 4))))
    error = remote_error(y)
    assert error.code == ErrorCode.INVALID_OP and error.op is not None
    assert error.op.startswith("matmul(")  # the op that really failed, not run_graph


def test_an_invalid_graph_fails_each_run_with_the_registration_error(
    dev: client.RemoteDevice, xp: client.Namespace
) -> None:
    graph = GraphDef(
        inputs=[_tensor("x", 0, (2,))],
        ops=[Unary(op="tanh", out=5, x=9)],  # #9 is nobody's
        outputs=[_tensor("y", 5, (2,))],
    )
    graph_id = register(dev, graph)
    dev.sync()  # registering is not answered: its failure is the runs'
    for _ in range(2):
        (y,) = run(dev, graph_id, graph, xp.asarray(np.ones(2)))
        error = remote_error(y)
        assert error.code == ErrorCode.INVALID_OP
        assert f"graph #{graph_id} failed to register" in str(error) and "reads #9" in str(error)


def test_constants_that_are_not_the_declared_size_fail_the_registration(
    dev: client.RemoteDevice, xp: client.Namespace
) -> None:
    graph, _ = tanh_graph()
    graph_id = register(dev, graph, np.zeros(1))  # 8 bytes for a (4,) float64 constant
    (y,) = run(dev, graph_id, graph, xp.asarray(np.ones((2, 3))), xp.asarray(np.ones((3, 4))))
    error = remote_error(y)
    assert error.code == ErrorCode.BAD_MESSAGE and "needs 32 bytes" in str(error)


def test_a_graph_id_in_use_refuses_the_new_registration_and_keeps_the_graph(
    dev: client.RemoteDevice, xp: client.Namespace
) -> None:
    graph, c = tanh_graph()
    graph_id = register(dev, graph, c)
    dev.register_graph(graph_id, graph, [memoryview((c * 0).tobytes())])
    with pytest.raises(ServerProtocolError, match="in use"):
        dev.sync()
    (y,) = run(dev, graph_id, graph, xp.asarray(np.zeros((2, 3))), xp.asarray(np.ones((3, 4))))
    np.testing.assert_allclose(y.numpy(), np.broadcast_to(c, (2, 4)))  # the first graph's c


def test_a_failure_at_a_graph_op_fails_every_output_and_names_the_op(
    dev: client.RemoteDevice, xp: client.Namespace
) -> None:
    graph = GraphDef(
        inputs=[_tensor("x", 0, (3,), "int64"), _tensor("e", 1, (3,), "int64")],
        ops=[Binary(op="add", out=2, x1=0, x2=0), Binary(op="pow", out=3, x1=2, x2=1)],
        outputs=[_tensor("p", 3, (3,), "int64"), _tensor("s", 2, (3,), "int64")],
    )
    graph_id = register(dev, graph)
    x = xp.asarray(np.array([1, 2, 3]))
    before = settled(dev)
    p, s = run(dev, graph_id, graph, x, xp.asarray(np.array([2, -1, 2])))  # numpy refuses -1
    for output in (p, s):
        error = remote_error(output)
        assert error.code == ErrorCode.EXECUTION_FAILED
        assert f"run_graph[{graph_id}] op 1 (pow(#2, #1) -> #3)" in str(error)
    del p, s, output
    dev.sync()
    after = dev.stats()
    assert (after.tensors, after.failed) == (before.tensors, before.failed)
    assert after.server_tensor_bytes == before.server_tensor_bytes
    p, s = run(dev, graph_id, graph, x, xp.asarray(np.array([2, 0, 1])))
    assert p.numpy().tolist() == [4, 1, 6] and s.numpy().tolist() == [2, 4, 6]


# --- accounting ---------------------------------------------------------------------------------


def test_drop_graph_returns_the_stats_to_their_baseline(
    dev: client.RemoteDevice, xp: client.Namespace
) -> None:
    graph, c = tanh_graph()
    before = settled(dev)
    graph_id = register(dev, graph, c)
    held = dev.stats()
    # the constants, and what its plan holds in the server (server.registration)
    expected = c.nbytes + structure_bytes(graph)
    assert held.server_tensor_bytes == before.server_tensor_bytes + expected
    dev.drop_graph(graph_id)
    after = dev.stats()
    assert after == before
    (y,) = run(dev, graph_id, graph, xp.asarray(np.ones((2, 3))), xp.asarray(np.ones((3, 4))))
    assert remote_error(y).code == ErrorCode.UNKNOWN_GRAPH


def test_many_runs_leave_the_stats_at_their_baseline(
    dev: client.RemoteDevice, xp: client.Namespace
) -> None:
    n = 64
    graph = sgd_graph(n)
    graph_id = register(dev, graph)
    w = xp.asarray(np.zeros((n, n)))
    x = xp.asarray(np.ones((n, n)))
    run(dev, graph_id, graph, w, x)  # outputs dropped at once: freed with the next batch
    baseline = settled(dev)
    for _ in range(50):
        loss, w2 = run(dev, graph_id, graph, w, x)
        del loss, w2
    assert dev.stats() == baseline
    np.testing.assert_allclose(w.numpy(), np.full((n, n), -0.01 * n * 51))


# --- limits ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def limited() -> Iterator[ServerProcess]:
    with run_server(*GRAPH_LIMITS) as proc:
        yield proc


@pytest.fixture
def small(limited: ServerProcess) -> Iterator[client.RemoteDevice]:
    with client.RemoteDevice(limited.url) as device:
        yield device


def test_the_count_limit_refuses_registration(small: client.RemoteDevice) -> None:
    xp = client.namespace(small)
    graph, c = tanh_graph()
    ids = [register(small, graph, c) for _ in range(3)]  # --max-graphs 2
    x, w = xp.asarray(np.ones((2, 3))), xp.asarray(np.ones((3, 4)))
    first, second, third = (run(small, i, graph, x, w)[0] for i in ids)
    np.testing.assert_allclose(first.numpy(), second.numpy())
    error = remote_error(third)
    assert error.code == ErrorCode.LIMIT_EXCEEDED and "--max-graphs" in str(error)
    small.drop_graph(ids[0])
    again = register(small, graph, c)
    np.testing.assert_allclose(run(small, again, graph, x, w)[0].numpy(), first.numpy())


def test_the_bytes_limit_refuses_registration(small: client.RemoteDevice) -> None:
    xp = client.namespace(small)
    big = np.ones(2100)  # 16800 bytes of constants; --max-graph-bytes 16KiB
    graph = GraphDef(
        inputs=[_tensor("x", 0, (2100,))],
        constants=[GraphConstant(id=1, shape=(2100,), dtype=F64)],
        ops=[Binary(op="add", out=2, x1=0, x2=1)],
        outputs=[_tensor("y", 2, (2100,))],
    )
    x = xp.asarray(np.ones(2100))
    before = settled(small)
    graph_id = register(small, graph, big)
    (y,) = run(small, graph_id, graph, x)
    error = remote_error(y)
    assert error.code == ErrorCode.LIMIT_EXCEEDED and "--max-graph-bytes" in str(error)
    del y
    assert small.stats() == before  # the constants' bytes are not held


def test_registered_ops_count_against_the_bytes_limit(small: client.RemoteDevice) -> None:
    """What a registered op holds in the server (about 1 KiB) counts as bytes: many small
    graphs of many ops cannot hold memory that nothing counts."""
    xp = client.namespace(small)
    n = 17  # 17 ops of 1 KiB each: over the 16 KiB of --max-graph-bytes, no constant
    ops = [Unary(op="negative", out=1 + i, x=i) for i in range(n)]
    graph = GraphDef(inputs=[_tensor("x", 0, (2,))], ops=ops, outputs=[_tensor("y", n, (2,))])
    before = settled(small)
    (y,) = run(small, register(small, graph), graph, xp.asarray(np.ones(2)))
    error = remote_error(y)
    assert error.code == ErrorCode.LIMIT_EXCEEDED and "what its 17 ops" in str(error)
    del y
    assert small.stats() == before


def test_the_per_op_cap_refuses_a_graph_with_a_large_op(small: client.RemoteDevice) -> None:
    xp = client.namespace(small)
    graph = GraphDef(  # a 100 x 100 float64 result: 80000 bytes, over --max-op-bytes 64KiB
        inputs=[_tensor("a", 0, (100, 1)), _tensor("b", 1, (1, 100))],
        ops=[Binary(op="matmul", out=2, x1=0, x2=1), Reduce(op="sum", out=3, x=2)],
        outputs=[_tensor("s", 3, ())],
    )
    graph_id = register(small, graph)
    (s,) = run(small, graph_id, graph, xp.asarray(np.ones((100, 1))), xp.asarray(np.ones((1, 100))))
    error = remote_error(s)
    assert error.code == ErrorCode.LIMIT_EXCEEDED and "op 0 (matmul(#0, #1) -> #2)" in str(error)


def test_a_quota_failure_during_a_run_returns_the_accounting(small: client.RemoteDevice) -> None:
    xp = client.namespace(small)
    n = 7000  # 56000 bytes a tensor: x and four live intermediates exceed the 256 KiB quota
    graph = GraphDef(
        inputs=[_tensor("x", 0, (n,))],
        ops=[
            Unary(op="exp", out=1, x=0),
            Unary(op="sin", out=2, x=0),
            Unary(op="cos", out=3, x=0),
            Unary(op="tanh", out=4, x=0),
            Binary(op="add", out=5, x1=1, x2=2),
            Binary(op="add", out=6, x1=3, x2=4),
            Binary(op="add", out=7, x1=5, x2=6),
        ],
        outputs=[_tensor("y", 7, (n,))],
    )
    graph_id = register(small, graph)
    x = xp.asarray(np.linspace(0.0, 1.0, n))
    before = settled(small)
    (y,) = run(small, graph_id, graph, x)
    assert remote_error(y).code == ErrorCode.QUOTA_EXCEEDED
    del y
    small.sync()
    after = small.stats()
    assert (after.tensors, after.tensor_bytes) == (before.tensors, before.tensor_bytes)
    assert after.server_tensor_bytes == before.server_tensor_bytes


# --- what keeps a graph from holding the server (review findings, checked in process) ---------


def test_results_written_over_dying_temporaries_equal_numpy_and_spare_a_view(
    dev: client.RemoteDevice, xp: client.Namespace
) -> None:
    """``sqrt(exp(x) * 2) + x`` writes each result into the temporary before it
    (``server/elision.py``), except into ``exp(x)``, a view of which is an output."""
    shape = (64, 64)
    graph = GraphDef(
        inputs=[_tensor("x", 0, shape)],
        ops=[
            Unary(op="exp", out=1, x=0),
            Reshape(out=2, x=1, shape=(4096,)),
            BinaryScalar(op="multiply", out=3, x=1, scalar=2.0),
            Unary(op="sqrt", out=4, x=3),
            Binary(op="add", out=5, x1=4, x2=0),
        ],
        outputs=[_tensor("flat", 2, (4096,)), _tensor("y", 5, shape)],
    )
    graph_id = register(dev, graph)
    rng = np.random.default_rng(3)
    for _ in range(2):
        x = rng.standard_normal(shape)
        flat, y = run(dev, graph_id, graph, xp.asarray(x))
        np.testing.assert_array_equal(flat.numpy(), np.exp(x).reshape(-1), strict=True)
        np.testing.assert_array_equal(y.numpy(), np.sqrt(np.exp(x) * 2.0) + x, strict=True)


def _chain(n: int, shape: tuple[int, ...]) -> GraphDef:
    ops = [Unary(op="negative", out=1 + i, x=i) for i in range(n)]
    return GraphDef(inputs=[_tensor("x", 0, shape)], ops=ops, outputs=[_tensor("y", n, shape)])


def test_a_long_graph_of_empty_arrays_runs_in_a_worker_thread() -> None:
    """Ops on empty arrays cost numpy nothing but the event loop about a microsecond each:
    every step counts for MIN_STEP_COST, so a long graph never runs on the loop."""
    from protocol.graphs import check_graph
    from server.plans import MIN_STEP_COST, build_plan
    from server.session import INLINE_COST

    graph = _chain(2000, (0,))
    plan = build_plan(graph, check_graph(graph), [], 0, 0)
    assert plan.cost >= 2000 * MIN_STEP_COST > INLINE_COST


def test_a_replay_stops_at_its_next_step_once_the_session_closed() -> None:
    from protocol.graphs import check_graph
    from server.plans import ReplayError, Stopped, build_plan, replay

    graph = _chain(50, (3,))
    plan = build_plan(graph, check_graph(graph), [], 0, 0)
    asked: list[int] = []

    def stopped() -> bool:
        asked.append(1)
        return len(asked) > 10  # the deadline closed the session during step 10

    slots = list(plan.slots)
    slots[plan.input_slots[0]] = np.ones(3)
    with pytest.raises(ReplayError) as caught:
        replay(plan, slots, stopped)
    assert isinstance(caught.value.__cause__, Stopped) and len(asked) == 11


def test_an_input_no_tensor_could_have_is_refused_at_registration(
    small: client.RemoteDevice,
) -> None:
    xp = client.namespace(small)
    graph = GraphDef(  # its one op's output is small: only the declared input is absurd
        inputs=[_tensor("x", 0, (2**40, 2**40))],
        ops=[Reduce(op="sum", out=1, x=0)],
        outputs=[_tensor("y", 1, ())],
    )
    before = settled(small)
    (y,) = run(small, register(small, graph), graph, xp.asarray(np.ones(2)))
    error = remote_error(y)
    assert error.code == ErrorCode.LIMIT_EXCEEDED and "input 'x'" in str(error)
    del y
    assert small.stats() == before
