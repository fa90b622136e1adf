"""Nothing in the repository uses a websockets internal: only the API websockets documents.

Checked statically over every Python file of ours, as the layering contracts are:

- every import from websockets names a module of its documented API and, from it, a name the
  module exports (its ``__all__``);
- no class of ours subclasses a websockets class (that is how internals were reached);
- on a sans-I/O protocol object (held, by this codebase's convention, in a name or attribute
  called ``protocol``), only its documented members are used: the list below is websockets'
  API reference for ``ServerProtocol`` and ``ClientProtocol``.

A websockets release is then a drop-in for what its documentation promises, and the range in
pyproject.toml is what the suite proves, not what internals allow.
"""

from __future__ import annotations

import ast
import importlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from websockets.client import ClientProtocol
from websockets.server import ServerProtocol
from websockets.uri import parse_uri

from .servers import ROOT

pytestmark = pytest.mark.wire

SOURCES = ("protocol", "server", "client", "bench", "tests", "tools", "examples")
# The modules of websockets' API reference (docs/reference: the sans-I/O, asyncio and sync
# implementations, data structures, exceptions, URIs).
DOCUMENTED_MODULES = {
    "websockets",
    "websockets.asyncio.client",
    "websockets.asyncio.server",
    "websockets.client",
    "websockets.datastructures",
    "websockets.exceptions",
    "websockets.frames",
    "websockets.http11",
    "websockets.protocol",
    "websockets.server",
    "websockets.sync.client",
    "websockets.sync.server",
    "websockets.uri",
}
# docs/reference/sansio/{common,server,client}.rst: the methods and attributes documented
DOCUMENTED_PROTOCOL_MEMBERS = {
    "receive_data",
    "receive_eof",
    "send_continuation",
    "send_text",
    "send_binary",
    "send_close",
    "send_ping",
    "send_pong",
    "fail",
    "events_received",
    "data_to_send",
    "close_expected",
    "id",
    "logger",
    "state",
    "handshake_exc",
    "close_code",
    "close_reason",
    "close_exc",
    "accept",
    "select_subprotocol",
    "reject",
    "send_response",
    "connect",
    "send_request",
}


def _trees(root: Path) -> Iterator[tuple[str, ast.Module]]:
    for folder in SOURCES:
        for path in sorted((root / folder).rglob("*.py")):
            yield str(path.relative_to(root)), ast.parse(path.read_text(), str(path))


def _internal_protocol_members() -> set[str]:
    """Every member of websockets' protocol objects that is not documented."""
    objects = [ServerProtocol(), ClientProtocol(parse_uri("ws://localhost/"))]
    members = {name for each in objects for name in (*dir(each), *vars(each))}
    return {m for m in members if not m.startswith("__")} - DOCUMENTED_PROTOCOL_MEMBERS


def _imports(tree: ast.Module) -> Iterator[tuple[int, str, str | None]]:
    """(line, module, name) of each websockets import; name None for ``import module``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "websockets":
                    yield node.lineno, alias.name, None
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.split(".")[0] == "websockets":
                for alias in node.names:
                    yield node.lineno, node.module, alias.name


def undocumented_imports(root: Path) -> tuple[int, list[str]]:
    """How many websockets imports there are, and those outside the documented API."""
    found, bad = 0, []
    for path, tree in _trees(root):
        for line, module, name in _imports(tree):
            found += 1
            if module not in DOCUMENTED_MODULES:
                bad.append(f"{path}:{line}: {module} is not a documented module")
            elif name is not None and name not in getattr(
                importlib.import_module(module), "__all__", ()
            ):
                bad.append(f"{path}:{line}: {module}.{name} is not exported by {module}")
    return found, bad


def websockets_subclasses(root: Path) -> list[str]:
    """Classes of ours with a websockets class among their bases."""
    bad = []
    for path, tree in _trees(root):
        names = {
            alias.asname or alias.name
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("websockets")
            for alias in node.names
        }
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                for base in node.bases:
                    text = ast.unparse(base)
                    if text in names or text.startswith("websockets."):
                        bad.append(f"{path}:{node.lineno}: {node.name}({text})")
    return bad


def internal_protocol_uses(root: Path) -> tuple[int, list[str]]:
    """How many members of ``protocol`` objects are used, and the undocumented ones."""
    internal = _internal_protocol_members()
    used, bad = 0, []
    for path, tree in _trees(root):
        for node in ast.walk(tree):
            if not isinstance(node, ast.Attribute):
                continue
            owner = node.value
            held = owner.attr if isinstance(owner, ast.Attribute) else getattr(owner, "id", "")
            if held == "protocol":
                used += 1
                if node.attr in internal:
                    bad.append(f"{path}:{node.lineno}: protocol.{node.attr}")
    return used, bad


def test_every_websockets_import_is_documented_api() -> None:
    found, bad = undocumented_imports(ROOT)
    assert found > 10  # the check sees the imports it is about
    assert bad == []


def test_no_class_subclasses_a_websockets_class() -> None:
    assert websockets_subclasses(ROOT) == []


def test_protocol_objects_are_used_through_documented_members_only() -> None:
    assert {"close_rcvd", "parser", "writes", "extensions"} <= _internal_protocol_members()
    used, bad = internal_protocol_uses(ROOT)
    assert used > 10  # the check sees the uses it is about
    assert bad == []


@pytest.mark.parametrize(
    ("source", "problem"),
    [
        ("from websockets.frames import apply_mask", "apply_mask is not exported"),
        ("import websockets.legacy.protocol", "is not a documented module"),
        ("class C(ServerConnection): pass", "C(ServerConnection)"),
        ("self.protocol.close_rcvd", "protocol.close_rcvd"),
    ],
)
def test_the_checks_catch_what_they_are_for(source: str, problem: str, tmp_path: Path) -> None:
    """Each kind of internal is caught (in a planted file)."""
    planted = tmp_path / "server" / "planted.py"
    planted.parent.mkdir()
    planted.write_text("from websockets.asyncio.server import ServerConnection\n" + source + "\n")
    found = [
        *undocumented_imports(tmp_path)[1],
        *websockets_subclasses(tmp_path),
        *internal_protocol_uses(tmp_path)[1],
    ]
    assert len(found) == 1 and problem in found[0], found
