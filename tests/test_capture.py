"""Capture scopes, graphs, files and the capture: devices, through a real server (issue 16).

A graph is judged by what it does: each test that records one replays it and compares the
result with the direct run, or checks the clear error a graph must not be built past.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import client
from client.capture import Capture, CaptureDevice, Graph
from client.errors import CaptureError, GraphFileError
from protocol import DeviceSpecError
from protocol.graphs import GraphDef

RNG = np.random.default_rng(16)


def _mlp_forward(
    xp: client.Namespace, x: client.RemoteArray, w1: client.RemoteArray, w2: client.RemoteArray
) -> client.RemoteArray:
    h = xp.maximum(x @ w1, 0.0)
    logits = h @ w2
    shifted = logits - xp.max(logits, axis=1, keepdims=True)
    return shifted - xp.log(xp.sum(xp.exp(shifted), axis=1, keepdims=True))


def _numpy_forward(x: np.ndarray, w1: np.ndarray, w2: np.ndarray) -> np.ndarray:
    h = np.maximum(x @ w1, 0.0)
    logits = h @ w2
    shifted = logits - logits.max(axis=1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))


@pytest.fixture
def weights() -> tuple[np.ndarray, np.ndarray]:
    return RNG.standard_normal((8, 16)), RNG.standard_normal((16, 4))


def _capture_forward(
    dev: client.RemoteDevice, xp: client.Namespace, weights: tuple[np.ndarray, np.ndarray]
) -> tuple[Graph, np.ndarray]:
    w1, w2 = (xp.asarray(w) for w in weights)
    x = xp.asarray(RNG.standard_normal((5, 8)))
    with Capture(dev) as cap:
        out = _mlp_forward(xp, cap.input("x", x), cap.input("w1", w1), cap.input("w2", w2))
        cap.output("log_probs", out)
    return cap.graph, out.numpy()


def test_a_captured_forward_pass_replays_the_direct_run(dev, xp, weights) -> None:
    graph, direct = _capture_forward(dev, xp, weights)
    w1, w2 = weights
    x = RNG.standard_normal((5, 8))
    replayed = graph.replay(dev, {"x": x, "w1": w1, "w2": w2})["log_probs"].numpy()
    np.testing.assert_array_equal(replayed, _numpy_forward(x, w1, w2))
    assert direct.shape == (5, 4)
    assert [t.name for t in graph.inputs] == ["x", "w1", "w2"]
    assert graph.outputs[0].shape == (5, 4) and graph.outputs[0].dtype == "float64"


def test_replay_frees_what_it_made_and_keeps_the_outputs(dev, xp, weights) -> None:
    graph, _ = _capture_forward(dev, xp, weights)
    inputs = {
        "x": xp.asarray(RNG.standard_normal((5, 8))),
        "w1": xp.asarray(weights[0]),
        "w2": xp.asarray(weights[1]),
    }
    before = dev.stats()
    outputs = graph.replay(dev, inputs)
    assert dev.stats().tensors == before.tensors + 1  # the output, nothing else
    del outputs
    assert dev.stats() == before


def test_save_load_replay_gives_the_same_result(dev, xp, weights, tmp_path: Path) -> None:
    graph, _ = _capture_forward(dev, xp, weights)
    path = tmp_path / "forward.twgraph"
    graph.save(path)
    loaded = Graph.load(path)
    assert loaded.definition == graph.definition
    x = RNG.standard_normal((5, 8))
    a = graph.replay(dev, [x, *weights])["log_probs"].numpy()
    b = loaded.replay(dev, [x, *weights])["log_probs"].numpy()
    np.testing.assert_array_equal(a, b)


def test_constants_travel_with_the_graph(dev, xp, tmp_path: Path) -> None:
    x = xp.asarray(np.arange(6.0).reshape(2, 3))
    table = np.array([[1.0, -2.0, 0.5]])
    with Capture(dev) as cap:
        cap.output("y", cap.input("x", x) * xp.asarray(table) + 1.0)
    graph = cap.graph
    assert len(graph.constants) == 1
    graph.save(tmp_path / "c.twgraph")
    loaded = Graph.load(tmp_path / "c.twgraph")
    np.testing.assert_array_equal(loaded.constants[0], table)
    x2 = RNG.standard_normal((2, 3))
    np.testing.assert_array_equal(loaded.replay(dev, [x2])["y"].numpy(), x2 * table + 1.0)


def test_in_place_updates_of_an_input_replay(dev, xp) -> None:
    param = xp.asarray(np.ones(4))
    grad = xp.asarray(np.full(4, 0.5))
    with Capture(dev) as cap:
        p = cap.input("p", param)
        g = cap.input("g", grad)
        p -= 0.1 * g
        cap.output("norm", xp.sum(p * p))
    np.testing.assert_allclose(param.numpy(), np.full(4, 0.95))
    for step in range(2, 4):
        cap.graph.replay(dev, {"p": param, "g": grad})
        np.testing.assert_allclose(param.numpy(), np.full(4, 1 - 0.05 * step))


def test_summary_counts_ops_constants_and_peak_bytes(dev, xp, weights) -> None:
    graph, _ = _capture_forward(dev, xp, weights)
    summary = graph.summary()
    assert summary.ops == len(graph.definition.ops)
    assert summary.op_counts["matmul"] == 2 and summary.op_counts["exp"] == 1
    assert summary.constants == 0 and summary.constant_bytes == 0
    inputs_bytes = 8 * (5 * 8 + 8 * 16 + 16 * 4)
    assert inputs_bytes < summary.peak_bytes < inputs_bytes + 8 * 5 * 16 * 4
    table = str(summary)
    assert "matmul" in table and "float64[5, 8]" in table and "log_probs" in table


def test_the_summary_command_prints_a_table(dev, xp, weights, tmp_path: Path) -> None:
    graph, _ = _capture_forward(dev, xp, weights)
    graph.save(tmp_path / "f.twgraph")
    done = subprocess.run(
        [sys.executable, "-m", "client.capture", "summary", str(tmp_path / "f.twgraph")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "matmul" in done.stdout and "peak live tensor bytes" in done.stdout
    (tmp_path / "bad.twgraph").write_bytes(b"\x05\x00\x00\x00{bad}")
    bad = subprocess.run(
        [sys.executable, "-m", "client.capture", "summary", str(tmp_path / "bad.twgraph")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert bad.returncode == 2
    assert bad.stderr.count("\n") == 1 and "not a Tensorwire graph file" in bad.stderr


# --- what a capture refuses ---------------------------------------------------------------------


def test_an_undeclared_input_is_refused_at_the_op_that_reads_it(dev, xp) -> None:
    w = xp.asarray(np.ones(3))
    with pytest.raises(CaptureError, match="not declared"), Capture(dev):
        xp.exp(w)
    assert xp.exp(w).numpy()[0] == pytest.approx(np.e)  # the device's own methods are back


def test_a_capture_inside_a_capture_is_refused(dev, xp) -> None:
    with Capture(dev), pytest.raises(CaptureError, match="inside a capture"), Capture(dev):
        pass


def test_an_output_the_graph_never_produced_is_refused(dev, xp) -> None:
    before = xp.asarray(np.ones(3))
    with Capture(dev) as cap:
        x = cap.input("x", before)
        with pytest.raises(CaptureError, match="not produced"):
            cap.output("x", x)  # an input is not an output
        with pytest.raises(CaptureError, match="not produced"):
            cap.output("other", xp.asarray(np.ones(2)))  # a constant is not made by an op
        cap.output("y", x + 1.0)
        with pytest.raises(CaptureError, match="twice"):
            cap.output("y", x + 2.0)
    assert [t.name for t in cap.graph.outputs] == ["y"]


def test_an_input_made_inside_the_capture_is_refused(dev, xp) -> None:
    """An op's output, or an array uploaded inside the scope (the graph's constant)."""
    with Capture(dev) as cap:
        made, uploaded = xp.ones(3) + 1.0, xp.asarray(np.ones(3))
        for array in (made, uploaded):
            with pytest.raises(CaptureError, match="'x' was made inside the capture"):
                cap.input("x", array)
        cap.output("y", uploaded + made)
    assert not cap.graph.inputs and len(cap.graph.constants) == 1


def test_a_data_dependent_shape_is_refused(dev, xp) -> None:
    x = xp.asarray(np.array([0.0, 1.0, 0.0, 2.0]))
    with pytest.raises(CaptureError, match="depends on the data"), Capture(dev) as cap:
        xp.nonzero(cap.input("x", x))


def test_no_graph_before_the_scope_closes_or_after_it_failed(dev, xp) -> None:
    cap = Capture(dev)
    with pytest.raises(CaptureError, match="no graph"):
        _ = cap.graph
    with pytest.raises(ZeroDivisionError), cap:
        _ = 1 / 0
    with pytest.raises(CaptureError, match="no graph"):
        _ = cap.graph
    with pytest.raises(CaptureError, match="inside the capture scope"):
        cap.input("late", xp.asarray(np.ones(1)))


def test_replay_refuses_inputs_that_do_not_match(dev, xp, weights) -> None:
    graph, _ = _capture_forward(dev, xp, weights)
    w1, w2 = weights
    with pytest.raises(ValueError, match="'x' has shape"):
        graph.replay(dev, {"x": np.ones((6, 8)), "w1": w1, "w2": w2})
    with pytest.raises(TypeError, match="'x' is float64, given float32"):
        graph.replay(dev, {"x": np.ones((5, 8), np.float32), "w1": w1, "w2": w2})
    with pytest.raises(ValueError, match="no input 'z'"):
        graph.replay(dev, {"z": w1, "x": w1, "w1": w1, "w2": w2})
    with pytest.raises(ValueError, match="'w2' is not given"):
        graph.replay(dev, {"x": np.ones((5, 8)), "w1": w1})


# --- record-only capture and the device specs ---------------------------------------------------


def test_a_record_only_capture_builds_a_graph_without_a_server(dev, xp, weights) -> None:
    rec = client.open_device("capture:")
    assert isinstance(rec, CaptureDevice) and not rec.executes
    rxp = client.namespace(rec)
    w1, w2 = weights
    with rec.capture() as cap:
        x = cap.input("x", shape=(5, 8), dtype=np.float64)
        a = cap.input("w1", shape=w1.shape, dtype=np.float64)
        b = cap.input("w2", shape=w2.shape, dtype=np.float64)
        out = _mlp_forward(rxp, x, a, b)
        assert out.shape == (5, 4)  # inferred by the protocol's rules, nothing ran
        with pytest.raises(CaptureError, match="computes nothing"):
            out.numpy()
        cap.output("log_probs", out)
    x_values = RNG.standard_normal((5, 8))
    result = cap.graph.replay(dev, [x_values, w1, w2])["log_probs"].numpy()
    np.testing.assert_array_equal(result, _numpy_forward(x_values, w1, w2))
    with pytest.raises(CaptureError, match="runs nothing"):
        rxp.ones(3)  # outside a scope a record-only device has nothing to run on


def test_an_executing_capture_device_runs_outside_scopes_and_records_inside(url) -> None:
    with client.open_device(f"capture:{url}") as dev:
        assert isinstance(dev, CaptureDevice) and dev.executes
        xp = client.namespace(dev)
        w = xp.asarray(np.arange(3.0))  # set up outside a scope: runs, is not recorded
        assert w.numpy().tolist() == [0.0, 1.0, 2.0]
        with dev.capture() as cap:
            y = xp.exp(cap.input("w", w))
            cap.output("y", y)
            np.testing.assert_allclose(y.numpy(), np.exp([0.0, 1.0, 2.0]))  # it also ran
        assert cap.graph.summary().op_counts == {"exp": 1}


def test_device_specs_share_the_servers_grammar(url) -> None:
    with client.open_device(url) as dev:
        assert isinstance(dev, client.RemoteDevice)
    with client.open_device(f"remote:{url}", index=1) as dev:
        assert dev.index == 1
    with pytest.raises(DeviceSpecError, match="valid kinds"):
        client.open_device("gpu")
    with pytest.raises(CaptureError, match="capture device over a capture device"):
        client.open_device("capture:capture:")


@pytest.mark.server
def test_the_server_still_refuses_capture_devices_before_binding() -> None:
    for spec, fix in (("capture:ndarray", "--device ndarray"), ("capture:", "--device ndarray")):
        done = subprocess.run(
            [sys.executable, "-m", "server", "--device", spec, "--port", "1"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 2
        assert done.stderr.count("\n") == 1
        assert "capture device" in done.stderr and fix in done.stderr


# --- hostile and malformed files ----------------------------------------------------------------


def _header(path: Path) -> dict:
    data = path.read_bytes()
    length = int.from_bytes(data[:4], "little")
    return json.loads(data[4 : 4 + length])


def _write(path: Path, header: dict, body: bytes = b"") -> None:
    raw = json.dumps(header).encode()
    path.write_bytes(len(raw).to_bytes(4, "little") + raw + body)


@pytest.fixture
def saved(dev, xp, tmp_path: Path) -> Path:
    x = xp.asarray(np.ones((2, 3)))
    with Capture(dev) as cap:
        cap.output("y", xp.sum(cap.input("x", x) * xp.asarray(np.array([1.0, 2.0, 3.0]))))
    path = tmp_path / "g.twgraph"
    cap.graph.save(path)
    return path


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (lambda h: h.update(format=2), "format"),
        (lambda h: h.update(type="batch"), "type"),
        (lambda h: h["ops"][0].update(x1=99), "#99"),
        (lambda h: h["ops"].append(dict(h["ops"][0])), "exists already"),
        (lambda h: h["outputs"][0].update(shape=[7]), "declared"),
        (lambda h: h["outputs"][0].update(id=0), "not produced"),
        (lambda h: h["ops"][0].update(kind="eval"), "kind"),
        (
            lambda h: h["ops"].insert(
                0, {"kind": "from_buffer", "out": 50, "shape": [1], "dtype": "float64", "buffer": 0}
            ),
            "from_buffer",
        ),
        (
            lambda h: h["ops"].insert(
                0, {"kind": "binary_inplace", "op": "add", "out": 1, "x2": 0}
            ),
            "constant",
        ),
        (lambda h: h["inputs"].append(dict(h["inputs"][0])), "twice"),
    ],
)
def test_a_malformed_graph_file_is_refused_and_nothing_runs(saved: Path, change, match) -> None:
    header = _header(saved)
    body = saved.read_bytes()[4 + int.from_bytes(saved.read_bytes()[:4], "little") :]
    change(header)
    _write(saved, header, body)
    with pytest.raises(GraphFileError, match=match):
        Graph.load(saved)


def test_truncated_or_padded_constants_are_refused(saved: Path) -> None:
    data = saved.read_bytes()
    saved.write_bytes(data[:-1])
    with pytest.raises(GraphFileError, match="truncated"):
        Graph.load(saved)
    saved.write_bytes(data + b"\x00")
    with pytest.raises(GraphFileError, match="more than the message declares"):
        Graph.load(saved)
    saved.write_bytes(data[:3])
    with pytest.raises(GraphFileError, match="truncated header"):
        Graph.load(saved)


def test_a_graph_file_is_json_and_raw_bytes_only(saved: Path) -> None:
    header = _header(saved)
    assert header["type"] == "graph" and header["format"] == 1
    GraphDef.model_validate_json(json.dumps(header))


def test_renumber_maps_every_id_of_every_op_kind_and_nothing_else() -> None:
    from protocol import ops
    from protocol.graphs import renumber
    from protocol.ops.indexing import ArrayIndex, SliceSpec
    from protocol.scalars import scalar_from_python

    made = [
        ops.Full(out=1, shape=(2,), dtype="float64", value=scalar_from_python(0.0)),
        ops.Full(out=1, shape=(2,), dtype="int64", value=scalar_from_python(3)),
        ops.Binary(op="add", out=3, x1=1, x2=2),
        ops.BinaryScalar(op="multiply", out=3, x=1, scalar=scalar_from_python(2)),
        ops.Where(out=4, condition=1, x1=2, x2=3),
        ops.Join(op="concat", out=4, xs=(1, 2, 3)),
        ops.Repeat(out=3, x=1, repeats_tensor=2),
        ops.GetItem(out=4, x=1, key=(ArrayIndex(tensor=2), SliceSpec(start=1), 3, None)),
        ops.SetItem(out=1, key=(ArrayIndex(tensor=2),), value=3),
        ops.Take(op="take", out=3, x=1, indices=2, axis=0),
        ops.Unique(op="unique_all", out=5, more=(6, 7, 8), x=1),
        ops.RunGraph(out=5, more=(6,), graph=3, args=(1, 2)),
        ops.Conv(out=3, x=1, w=2, stride=(1,), padding=((0, 0),), dilation=(1,)),
        ops.Pool(op="max", out=2, x=1, kernel=(2,), stride=(2,), padding=(0,)),
        ops.PoolBackward(op="avg", out=3, x=1, grad=2, kernel=(2,), stride=(1,), padding=(1,)),
        ops.BatchNorm(out=6, x=1, mean=2, var=3, weight=4, bias=5),
        ops.BatchNorm(out=4, x=1, mean=2, var=3),
        ops.Softmax(op="log_softmax", out=2, x=1, axis=0),
        ops.Random(out=2, state=1, shape=(3,)),
    ]
    for op in made:
        ids = {i: 100 + i for i in (*op.inputs(), *op.outputs())}
        moved = renumber(op, ids)
        assert moved.inputs() == tuple(ids[i] for i in op.inputs()), op
        assert moved.outputs() == tuple(ids[i] for i in op.outputs()), op
        assert renumber(moved, {v: k for k, v in ids.items()}) == op  # nothing else changed


def test_the_onnx_export_of_a_captured_forward_pass_matches_the_direct_run(
    dev, xp, weights, tmp_path: Path
) -> None:
    import onnxruntime  # the test extra installs it: a missing runtime fails, never skips

    graph, direct = _capture_forward(dev, xp, weights)
    x = np.asarray(RNG.standard_normal((5, 8)))
    path = tmp_path / "forward.onnx"
    graph.to_onnx(path)
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feeds = {"x": x, "w1": weights[0], "w2": weights[1]}
    (got,) = session.run(["log_probs"], feeds)
    expected = graph.replay(dev, feeds)["log_probs"].numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)
    assert direct.shape == got.shape


def test_a_write_through_a_view_of_a_constant_is_refused(dev, xp) -> None:
    """A replay must not see what an earlier one wrote into a constant, through a view of it
    either (the server keeps constants read-only: a write would silently go to a copy)."""
    x = xp.asarray(np.ones(4))
    with pytest.raises(CaptureError, match="constant"), Capture(dev) as cap:
        c = xp.asarray(np.zeros(4))
        view = xp.reshape(c, (2, 2))
        view += 1.0
        cap.output("y", cap.input("x", x) + c)
    with Capture(dev) as cap:  # a copy of the constant may be written
        c = xp.asarray(np.zeros(4)) + 0.0
        view = xp.reshape(c, (2, 2))
        view += 1.0
        cap.output("y", cap.input("x", x) + c)
    np.testing.assert_array_equal(cap.graph.register(dev).run([np.ones(4)])["y"].numpy(), 2.0)


def test_checking_a_long_graph_takes_linear_time() -> None:
    import time

    from protocol.graphs import GraphDef, GraphTensor, check_graph
    from protocol.ops import Binary, Unary

    def chain(n: int) -> GraphDef:  # half the ops make tensors, the other half consume them
        ops: list = [Unary(op="negative", out=1 + i, x=0) for i in range(n)]
        ops += [Binary(op="add", out=1 + n + i, x1=1 + i, x2=0) for i in range(n)]
        x = GraphTensor(name="x", id=0, shape=(2,), dtype="float64")
        out = GraphTensor(name="y", id=2 * n, shape=(2,), dtype="float64")
        return GraphDef(inputs=[x], outputs=[out], ops=ops)

    small, large = chain(2_000), chain(32_000)
    times = []
    for graph in (small, large):
        start = time.process_time()
        check_graph(graph)
        times.append(time.process_time() - start)
    # 16x the ops: about 16x the time when linear, 256x when quadratic (as it was: 5.5 s for
    # 40k ops). A complexity guard with a wide margin, not a speed goal.
    assert times[1] < 64 * max(times[0], 1e-3)
