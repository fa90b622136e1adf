"""``python -m client.capture summary FILE``: what a saved graph holds, as a table.

Exit status 0 when the file is a valid graph, 2 (with one line on stderr) when it is not.
What it prints comes from a file (and its name) that may be anyone's: every character that is
not printable is written as Python escapes it (``\\x1b``, ``\\n``, ``\\u202e``), so nothing it
prints can move a terminal's cursor, retitle its window or hide text.
"""

from __future__ import annotations

import argparse
import sys

from protocol.version import version_text

from ..errors import GraphFileError
from .graph import Graph


def printable(text: str) -> str:
    """``text`` on one line, with each character that is not printable escaped."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m client.capture", description=__doc__)
    parser.add_argument("--version", action="version", version=version_text())
    commands = parser.add_subparsers(dest="command", required=True)
    summary = commands.add_parser("summary", help="print a saved graph's summary")
    summary.add_argument("file", help="a graph file written by Graph.save")
    args = parser.parse_args(argv)
    try:
        graph = Graph.load(args.file)
    except (GraphFileError, OSError) as exc:
        print(printable(f"error: {exc}"), file=sys.stderr)
        return 2
    print(printable(f"{args.file}: {graph!r}"))
    for line in str(graph.summary()).split("\n"):
        print(printable(line))
    return 0


if __name__ == "__main__":
    sys.exit(main())
