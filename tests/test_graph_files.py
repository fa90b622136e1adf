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

import pytest

import client
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
