"""Issue 30, findings 9-11: hostile graph files, through the real ``python -m client.capture
summary`` and ``Graph.load``. A file that is not a graph this client can use is one line on
stderr and exit status 2, whatever it holds; what the command prints from a file is safe to
print on a terminal; and loading a file takes memory and time in proportion to its size."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

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
