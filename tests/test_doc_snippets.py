"""The docs' code runs as written: every Python block of the README and the user docs, in order,
one namespace a file, as a user pasting them one after the other would run them, against two
real servers on loopback (the docs' addresses, ``ws://127.0.0.1:8765`` and ``:8766``, are the
only text replaced); and every transcript block (lines starting ``$ ``) prints what it shows.

Shell blocks that install, build images or talk to a cluster are not run here: CI runs the
quick start's test command itself (tests/test_docs.py checks it is the README's), and
``../shared/tools/image-check.sh`` builds the image.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from .servers import ROOT, ServerProcess, run_server
from .test_docs import DOCS  # the user docs whose links that test checks

pytestmark = pytest.mark.e2e

FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)
DOC_URLS = ("ws://127.0.0.1:8765", "ws://127.0.0.1:8766")
LOOPBACK_PEERS = ("--peers", "ws://127.0.0.1:*", "--allow-any-peer-port")

# Runs a file's blocks in one namespace, each compiled under the doc's name and line, so that a
# traceback points into the markdown.
RUNNER = """
import json, sys
blocks = json.load(open(sys.argv[1]))
namespace = {"__name__": "__main__"}
for path, line, code in blocks:
    exec(compile("\\n" * (line - 1) + code, path, "exec"), namespace)
"""


def _blocks(path: str, language: str) -> list[tuple[int, str]]:
    """The blocks fenced as ``language``, each with the line its code starts on."""
    text = (ROOT / path).read_text()
    return [
        (text.count("\n", 0, match.start(2)) + 1, match.group(2))
        for match in FENCE.finditer(text)
        if match.group(1) == language
    ]


def _transcripts() -> list[tuple[str, int, str, str]]:
    """Untagged blocks that show a command (``$ ...``) and what it prints."""
    found = []
    for path in DOCS:
        for line, code in _blocks(path, ""):
            command, _, output = code.partition("\n")
            if command.startswith("$ "):
                found.append((path, line, command[2:], output))
    return found


@pytest.fixture(scope="module")
def doc_servers() -> object:
    with run_server(*LOOPBACK_PEERS) as first, run_server(*LOOPBACK_PEERS) as second:
        yield first, second


@pytest.mark.parametrize("path", [p for p in DOCS if _blocks(p, "python")])
def test_python_blocks_run_as_written(
    path: str, doc_servers: tuple[ServerProcess, ServerProcess], tmp_path: Path
) -> None:
    blocks = []
    for line, code in _blocks(path, "python"):
        for written, served in zip(DOC_URLS, doc_servers, strict=True):
            code = code.replace(written, served.url)
        blocks.append((str(ROOT / path), line, code))
    (tmp_path / "blocks.json").write_text(json.dumps(blocks))
    done = subprocess.run(
        [sys.executable, "-c", RUNNER, str(tmp_path / "blocks.json")],
        cwd=tmp_path,  # what the snippets write (checkpoints, graph files) lands here
        env={**os.environ, "PYTHONPATH": str(ROOT), "MPLBACKEND": "Agg"},
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    print(done.stdout)


@pytest.mark.parametrize(("path", "line", "command", "shown"), _transcripts())
def test_transcripts_print_what_they_show(path: str, line: int, command: str, shown: str) -> None:
    argv = shlex.split(command)
    assert argv[0] == "python", f"{path}:{line}: a transcript runs this repository's Python"
    done = subprocess.run(
        [sys.executable, *argv[1:]], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert (done.stdout + done.stderr).strip() == shown.strip(), f"{path}:{line}"
