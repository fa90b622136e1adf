"""``python -m client.capture summary FILE``: what a saved graph holds, as a table.

Exit status 0 when the file is a valid graph, 2 (with one line on stderr) when it is not.
"""

from __future__ import annotations

import argparse
import sys

from ..errors import GraphFileError
from .graph import Graph


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m client.capture", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    summary = commands.add_parser("summary", help="print a saved graph's summary")
    summary.add_argument("file", help="a graph file written by Graph.save")
    args = parser.parse_args(argv)
    try:
        graph = Graph.load(args.file)
    except (GraphFileError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"{args.file}: {graph!r}")
    print(graph.summary())
    return 0


if __name__ == "__main__":
    sys.exit(main())
