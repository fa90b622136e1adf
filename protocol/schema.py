"""Export protocol v2 as JSON Schema: ``python -m protocol.schema [PATH]``."""

from __future__ import annotations

import json
import sys
from typing import Any

from .messages import CLIENT_ADAPTER, PROTOCOL_VERSION, SERVER_ADAPTER


def protocol_schema() -> dict[str, Any]:
    """One JSON Schema document with both directions of protocol v2."""
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": f"Tensorwire protocol v{PROTOCOL_VERSION}",
        "description": (
            "Each websocket message is a little-endian u32 header length, the header (one of "
            "these messages as JSON), then the raw buffers the header declares."
        ),
        "properties": {
            "client_to_server": CLIENT_ADAPTER.json_schema(mode="validation"),
            "server_to_client": SERVER_ADAPTER.json_schema(mode="validation"),
        },
    }


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    text = json.dumps(protocol_schema(), indent=2, sort_keys=True) + "\n"
    if args:
        with open(args[0], "w", encoding="utf-8") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
