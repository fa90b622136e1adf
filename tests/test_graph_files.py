"""Issue 30, findings 9-11: hostile graph files, through the real ``python -m client.capture
summary`` and ``Graph.load``. A file that is not a graph this client can use is one line on
stderr and exit status 2, whatever it holds; what the command prints from a file is safe to
print on a terminal; and loading a file takes memory and time in proportion to its size."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import client
from client.capture import Graph
from client.errors import CaptureError
from protocol.codec import encode
from protocol.graphs import GraphConstant, GraphDef, GraphTensor
from protocol.ops import Binary

from .servers import ROOT


def _write(path: Path, graph: GraphDef, buffers: Sequence[memoryview] = ()) -> Path:
    with open(path, "wb") as file:
        for chunk in encode(graph, buffers):
            file.write(chunk)
    return path


def _summary(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "client.capture", "summary", str(path)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        check=False,
    )


def _add(
    *, inputs: Sequence[GraphTensor] = (), constants: Sequence[GraphConstant] = ()
) -> GraphDef:
    """``y = x + x`` over a float32 vector of 2, with more declarations."""
    x = GraphTensor(name="x", id=0, shape=(2,), dtype="float32")
    y = GraphTensor(name="y", id=2, shape=(2,), dtype="float32")
    return GraphDef(
        inputs=[x, *inputs],
        outputs=[y],
        constants=list(constants),
        ops=[Binary(op="add", out=2, x1=0, x2=0)],
    )


@pytest.mark.parametrize(
    ("shape", "nbytes"),
    [((2**40, 2**40, 0), 0), ((2**62, 0), 0), ((1,) * 65, 4)],
    ids=["too big past a zero", "too big to count", "65 dimensions"],
)
def test_a_constant_numpy_cannot_make_is_refused_in_one_line(
    tmp_path: Path, shape: tuple[int, ...], nbytes: int
) -> None:
    constant = GraphConstant(id=1, shape=shape, dtype="float32")
    path = _write(tmp_path / "c.twgraph", _add(constants=[constant]), [memoryview(bytes(nbytes))])
    done = _summary(path)
    assert (done.returncode, done.stdout) == (2, ""), done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith("error: ") and "constant #1" in line and "numpy" in line


def _write_header(path: Path, header: dict[str, Any]) -> Path:
    """A graph file without constants whose header is ``header``, as JSON."""
    text = json.dumps(header).encode()
    path.write_bytes(len(text).to_bytes(4, "little") + text)
    return path


def _unsafe(text: str) -> list[str]:
    """The characters of ``text`` a terminal could act on: any not printable but a newline."""
    return sorted({c for c in text if not c.isprintable() and c != "\n"})


ESCAPES = "\x1b]0;owned\x07\x1b[2J\x1b[31m\u202e\x00\r\x08"


@pytest.mark.parametrize("where", ["input", "output"])
def test_names_with_control_characters_never_reach_the_terminal(tmp_path: Path, where: str) -> None:
    header = json.loads(_add().model_dump_json())
    header[f"{where}s"][0]["name"] += ESCAPES
    done = _summary(_write_header(tmp_path / "n.twgraph", header))
    assert _unsafe(done.stdout + done.stderr) == []
    assert (done.returncode, done.stdout) == (2, "")  # such a name is refused
    (line,) = done.stderr.splitlines()
    assert f"{where}s.0.name" in line and "printable" in line


def test_what_the_command_prints_from_a_file_or_its_path_is_escaped(tmp_path: Path) -> None:
    header = json.loads(_add().model_dump_json())
    header["inputs"][0]["\x1b[2J"] = 1  # an unknown key: named in the error
    done = _summary(_write_header(tmp_path / "k.twgraph", header))
    assert _unsafe(done.stdout + done.stderr) == [] and done.returncode == 2
    assert "inputs.0.\\x1b[2J" in done.stderr
    evil = "evil" + ESCAPES.replace("\x00", "\n")  # a file name from an archive
    named = _write(tmp_path / f"{evil}.twgraph", _add())
    done = _summary(named)
    assert _unsafe(done.stdout + done.stderr) == [] and done.returncode == 0, done.stderr
    assert "evil\\x1b]0;owned\\x07" in done.stdout and "input x" in done.stdout
    assert len(done.stdout.split("\n")) == 8  # the file's line, the table's 6, the end
    named.write_bytes(b"\x00")
    done = _summary(named)
    assert _unsafe(done.stdout + done.stderr) == [] and done.returncode == 2


def test_a_capture_refuses_such_a_name_where_it_is_declared() -> None:
    dev = client.open_device("capture:")
    xp = client.namespace(dev)
    with dev.capture() as cap:
        with pytest.raises(CaptureError, match="input name 'x\\\\x1b\\[2J'"):
            cap.input("x\x1b[2J", shape=(2,), dtype="float32")
        x = cap.input("x", shape=(2,), dtype="float32")
        with pytest.raises(CaptureError, match="output name"):
            cap.output("y\x07", xp.abs(x))
        cap.output("y", xp.abs(x))
    assert [t.name for t in cap.graph.outputs] == ["y"]


MIB = 2**20
# Runs the command, then says on stderr its peak RSS in KiB (VmHWM: ru_maxrss would keep the
# parent's peak across fork and exec) and the seconds main() took.
MEASURED = (
    "import re, sys, time\n"
    "from client.capture.__main__ import main\n"
    "start = time.perf_counter()\n"
    "status = main(sys.argv[1:])\n"
    "seconds = time.perf_counter() - start\n"
    "with open('/proc/self/status') as status_file:\n"
    "    peak = re.search(r'VmHWM:\\s*(\\d+) kB', status_file.read()).group(1)\n"
    "print(peak, seconds, file=sys.stderr)\n"
    "sys.exit(status)\n"
)


def _measured(path: Path) -> tuple[int, float]:
    """Peak RSS (bytes) and seconds of ``summary`` on ``path``, which must be a valid graph."""
    done = subprocess.run(
        [sys.executable, "-c", MEASURED, "summary", str(path)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    peak, seconds = done.stderr.split()
    return int(peak) * 1024, float(seconds)


def _many_small_ops(path: Path, n: int) -> Path:
    """``y = abs(abs(...abs(x)))``, ``n`` ops deep: the most ops a byte of file can hold,
    written as text (a model per op would take the test longer than the load)."""
    ops = ",".join(f'{{"kind":"unary","out":{i + 1},"op":"abs","x":{i}}}' for i in range(n))
    header = (
        '{"type":"graph","format":1,'
        '"inputs":[{"name":"x","id":0,"shape":[2],"dtype":"float32"}],'
        f'"outputs":[{{"name":"y","id":{n},"shape":[2],"dtype":"float32"}}],'
        f'"constants":[],"ops":[{ops}]}}'
    ).encode()
    path.write_bytes(len(header).to_bytes(4, "little") + header)
    return path


def _large_constants(path: Path, count: int, nbytes: int) -> Path:
    """``y = x + c0 + c1 + ...``: ``count`` float64 constants of ``nbytes`` each."""
    n = nbytes // 8
    x = GraphTensor(name="x", id=0, shape=(n,), dtype="float64")
    constants = [GraphConstant(id=1 + k, shape=(n,), dtype="float64") for k in range(count)]
    ops = [Binary(op="add", out=count + 1, x1=0, x2=1)]
    ops += [Binary(op="add", out=count + 1 + k, x1=count + k, x2=1 + k) for k in range(1, count)]
    y = GraphTensor(name="y", id=2 * count, shape=(n,), dtype="float64")
    graph = GraphDef(inputs=[x], outputs=[y], constants=constants, ops=ops)
    value = memoryview(bytes(range(256)) * (nbytes // 256))
    return _write(path, graph, [value] * count)


def test_loading_a_file_takes_memory_and_time_in_proportion_to_its_size(tmp_path: Path) -> None:
    base, _ = _measured(_write(tmp_path / "tiny.twgraph", _add()))
    small = _many_small_ops(tmp_path / "small.twgraph", 40_000)
    large = _many_small_ops(tmp_path / "large.twgraph", 160_000)
    heavy = _large_constants(tmp_path / "heavy.twgraph", 16, MIB)
    (_, small_s), (large_peak, large_s) = _measured(small), _measured(large)
    heavy_peak, _ = _measured(heavy)
    # While the ops after it are checked, each op leaves an id's meta and last use (a dict
    # entry each, a few times the op's JSON), and the header's text is kept for replay; a
    # constant is read into its own array, once.
    for path, peak, bound in ((large, large_peak, 6), (heavy, heavy_peak, 1.5)):
        size = path.stat().st_size
        grown = peak - base
        assert grown <= bound * size, (
            f"{path.name}: {size / MIB:.1f} MiB took {grown / MIB:.0f} MiB"
        )
    # 4x the ops: about 4x the time when linear. A complexity guard with a wide margin.
    assert large_s < 12 * max(small_s, 0.01), (small_s, large_s)


def test_a_loaded_graph_is_the_saved_one(tmp_path: Path) -> None:
    """Checked and replayed from the file's ops as they are read, and made whole on demand."""
    dev = client.open_device("capture:ndarray")  # records and runs, in this process
    xp = client.namespace(dev)
    x0 = xp.asarray(np.arange(6, dtype=np.float64).reshape(2, 3))
    with dev.capture() as cap:
        x = cap.input("x", x0)
        w = xp.asarray(np.linspace(-1, 1, 12).reshape(3, 4))  # a constant
        h = xp.tanh(x @ w)
        cap.output("y", xp.sum(h * h, axis=1))
        cap.output("h", h)
    saved = cap.graph
    saved.save(tmp_path / "g.twgraph")
    loaded = Graph.load(tmp_path / "g.twgraph")
    assert repr(loaded) == repr(saved)
    assert str(loaded.summary()) == str(saved.summary())
    x1 = np.ones((2, 3))
    want = {k: v.numpy() for k, v in saved.replay(dev, {"x": x1}).items()}
    got = {k: v.numpy() for k, v in loaded.replay(dev, {"x": x1}).items()}
    assert want.keys() == got.keys() and all(np.array_equal(want[k], got[k]) for k in want)
    assert loaded.definition == saved.definition
    np.testing.assert_array_equal(loaded.constants[0], saved.constants[0])
