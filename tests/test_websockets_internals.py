"""The websockets and asyncio internals the server's wire relies on are all there.

``server/websockets_adapter.py`` names every one; a websockets release that removes one must
fail here (and the server must refuse to start), not in the middle of a session.
"""

from __future__ import annotations

import asyncio
import tomllib

import pytest
from websockets.asyncio.client import connect
from websockets.asyncio.connection import Connection
from websockets.asyncio.server import ServerConnection, serve

from server.websockets_adapter import (
    SUPPORTED,
    UnsupportedWebsocketsError,
    missing_internals,
    require_internals,
)
from server.wire import WireConnection

from .servers import ROOT


def test_the_installed_websockets_has_every_class_level_internal() -> None:
    assert missing_internals() == []
    require_internals()


@pytest.mark.inprocess
@pytest.mark.asyncio
async def test_a_live_connection_has_every_internal() -> None:
    found: asyncio.Future[list[str]] = asyncio.get_running_loop().create_future()

    async def handler(ws: ServerConnection) -> None:
        assert isinstance(ws, WireConnection)
        found.set_result(missing_internals(ws))
        await ws.close()

    async with serve(handler, "127.0.0.1", 0, create_connection=WireConnection) as server:
        port = server.sockets[0].getsockname()[1]
        async with connect(f"ws://127.0.0.1:{port}", compression=None):
            assert await asyncio.wait_for(found, 10) == []


def test_a_missing_internal_stops_the_server_from_starting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delattr(Connection, "send_context")  # where websockets defines it
    with pytest.raises(UnsupportedWebsocketsError) as refused:
        require_internals()
    message = str(refused.value)
    assert "ServerConnection.send_context" in message and SUPPORTED in message


def test_the_supported_range_is_the_one_pyproject_pins() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    pinned = [d for d in pyproject["project"]["dependencies"] if d.startswith("websockets")]
    assert pinned == [f"websockets{SUPPORTED}"]
