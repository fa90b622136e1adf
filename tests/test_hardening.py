"""Static guarantees: no pickle, eval, exec, np.load or file access in the server or protocol;
ruff's bandit (S) rules stay on; only the standard's numeric dtypes can be named on the wire;
error codes are only ever appended."""

from __future__ import annotations

import ast
import hmac
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, get_args, get_origin

import numpy as np
import pytest
from pydantic import BaseModel, ValidationError

import protocol.messages
import protocol.ops
from protocol import CLIENT_ADAPTER, DTYPES, ErrorCode, from_numpy

pytestmark = pytest.mark.wire

ROOT = Path(__file__).resolve().parent.parent
FORBIDDEN_MODULES = {
    "pickle",
    "cPickle",
    "marshal",
    "shelve",
    "dill",
    "cloudpickle",
    "joblib",
    "subprocess",
    "importlib",
    "ctypes",
    "tempfile",
    "shutil",
}
FORBIDDEN_CALLS = {"eval", "exec", "compile", "open", "__import__", "breakpoint", "input"}
FORBIDDEN_ATTRIBUTES = {
    "load",
    "loads",
    "loadtxt",
    "genfromtxt",
    "fromfile",
    "fromregex",
    "memmap",
    "save",
    "savez",
    "tofile",
    "system",
    "popen",
    "read_text",
    "read_bytes",
    "write_text",
    "write_bytes",
    "unlink",
}


def _sources() -> list[Path]:
    files = sorted([*(ROOT / "server").rglob("*.py"), *(ROOT / "protocol").rglob("*.py")])
    assert len(files) > 10
    return files


def _violations(path: Path) -> list[str]:
    found: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        name = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
        where = f"{name}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.Import | ast.ImportFrom):
            names = [a.name for a in node.names]
            modules = [node.module or ""] if isinstance(node, ast.ImportFrom) else names
            if any(m.split(".")[0] in FORBIDDEN_MODULES for m in modules):
                found.append(f"{where} imports {modules}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            if node.func.id in FORBIDDEN_CALLS:
                found.append(f"{where} calls {node.func.id}()")
        elif isinstance(node, ast.Attribute) and node.attr in FORBIDDEN_ATTRIBUTES:
            found.append(f"{where} uses .{node.attr}")
        elif isinstance(node, ast.keyword) and node.arg == "allow_pickle":
            found.append(f"{where} passes allow_pickle")
    return found


# The exceptions, each reviewed: none touches wire input.
ALLOWED = {
    # `python -m protocol.schema PATH` writes the schema file its user names: a developer tool
    # that nothing in the server imports (checked below).
    "protocol/schema.py calls open()",
    # PEP 562 lazy exports: import_module of the fixed names in server._EXPORTS.
    "server/__init__.py imports ['importlib']",
    # --token-file, --peer-token-file and the cgroup memory limit: files the operator names,
    # read at startup (server/setting_values.py turns settings' text into values).
    "server/setting_values.py uses .read_text",
    # The launcher of `python -m server` for tests, benchmarks and tools; nothing in the server
    # imports it (tests/test_process.py checks), so a server never starts processes.
    "server/process.py imports ['subprocess']",
    # glibc's mallopt, called once at startup with two fixed settings (server/allocator.py);
    # nothing from the wire reaches it.
    "server/allocator.py imports ['ctypes']",
    "server/allocator.py imports ['ctypes.util']",
    # its own resident memory, /proc/self/statm: a fixed path, read to bound what malloc keeps
    "server/allocator.py calls open()",
    # where the three fixed names protocol, client and server resolve (find_spec loads nothing),
    # to refuse a user's file that shadows one (protocol/shadowing.py)
    "protocol/shadowing.py imports ['importlib.util']",
    # the installed distribution's version, by its fixed name (protocol/version.py; the
    # health check reads it on its own, importing nothing of the server)
    "protocol/version.py imports ['importlib.metadata']",
    "server/healthcheck.py imports ['importlib.metadata']",
}


def test_no_pickle_eval_or_file_access_in_server_and_protocol() -> None:
    violations = [v for path in _sources() for v in _violations(path)]
    unexpected = [
        v for v in violations if v.split(":")[0] + " " + v.split(" ", 1)[1] not in ALLOWED
    ]
    assert unexpected == []


def test_the_server_never_imports_the_schema_tool() -> None:
    for path in (ROOT / "server").rglob("*.py"):
        assert "schema" not in path.read_text(), path


def test_the_checker_catches_what_it_looks_for(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text(
        "import pickle\nfrom subprocess import run\nimport numpy as np\n"
        "eval('1')\nnp.load('x', allow_pickle=True)\nopen('f')\n"
    )
    assert len(_violations(bad)) == 6, _violations(bad)


def test_ruff_bandit_rules_are_on() -> None:
    lint = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["ruff"]["lint"]
    assert "S" in lint["select"]
    assert set(lint.get("ignore", [])) <= {"S101"}  # only assert is allowed
    for pattern, ignored in lint.get("per-file-ignores", {}).items():
        assert "S" not in ignored or not pattern.startswith(("server", "protocol")), pattern


BAD_DTYPES = [
    "object",
    "O",
    "|O",
    ">f8",
    "<f8",
    "float16",
    "V8",
    "|S4",
    "<U2",
    "str",
    "bytes",
    "[('a', '<i4')]",
    "datetime64[s]",
    "m8",
    "bfloat16",
    "int",
    "float",
    "c32",
]


@pytest.mark.parametrize("dtype", BAD_DTYPES)
def test_only_standard_numeric_dtypes_decode(dtype: str) -> None:
    op = {"kind": "from_buffer", "out": 1, "shape": [1], "dtype": dtype, "buffer": 0}
    with pytest.raises(ValidationError):
        CLIENT_ADAPTER.validate_python({"type": "batch", "ops": [op], "buffers": [8]})


@pytest.mark.parametrize(
    "dtype", [object, np.dtype("V8"), np.dtype([("a", "<i4")]), str, "S4", "float16", "M8[s]"]
)
def test_numpy_dtypes_outside_the_standard_have_no_wire_name(dtype: object) -> None:
    with pytest.raises(TypeError):
        from_numpy(dtype)  # type: ignore[arg-type]


def test_wire_dtypes_are_exactly_the_standard_numeric_ones() -> None:
    assert set(DTYPES) == {
        "bool",
        "int8",
        "int16",
        "int32",
        "int64",
        "uint8",
        "uint16",
        "uint32",
        "uint64",
        "float32",
        "float64",
        "complex64",
        "complex128",
    }


def test_error_codes_are_only_appended() -> None:
    first = [
        "bad_message",
        "version_mismatch",
        "bad_device_index",
        "auth_failed",
        "unknown_tensor",
        "duplicate_tensor",
        "invalid_op",
        "execution_failed",
        "internal",
    ]
    assert [c.value for c in ErrorCode][: len(first)] == first


def test_the_token_is_compared_in_constant_time(monkeypatch: pytest.MonkeyPatch) -> None:

    from websockets.datastructures import Headers
    from websockets.http11 import Request

    from server import guard

    calls: list[tuple[bytes, bytes]] = []
    original = hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        calls.append((a, b))
        return original(a, b)

    monkeypatch.setattr(hmac, "compare_digest", spy)
    request = Request("/", Headers({"Authorization": "Bearer nope"}))
    assert not guard.token_matches(request, "s3cret")
    assert guard.token_matches(Request("/", Headers({"Authorization": "bearer s3cret"})), "s3cret")
    assert not guard.token_matches(
        Request("/", Headers({"Authorization": "Basic s3cret"})), "s3cret"
    )
    assert not guard.token_matches(Request("/", Headers()), "s3cret")
    assert len(calls) == 4  # every check went through hmac.compare_digest, even a wrong scheme


def _unbounded_int(tp: Any, metadata: Sequence[Any] = ()) -> bool:
    """True if annotation ``tp`` lets a bare, unbounded ``int`` through."""
    if tp is int:
        bounds = {
            name
            for m in metadata
            for name in ("ge", "gt", "le", "lt")
            if getattr(m, name, None) is not None
        }
        return not ({"ge", "gt"} & bounds and {"le", "lt"} & bounds)
    if get_origin(tp) is Annotated:
        base, *meta = get_args(tp)
        flat = [x for m in meta for x in (*getattr(m, "metadata", ()), m)]
        return _unbounded_int(base, flat)
    return any(_unbounded_int(arg) for arg in get_args(tp))


def _wire_models() -> set[type[BaseModel]]:
    found: set[type[BaseModel]] = set()
    todo: list[Any] = [*get_args(protocol.ops.AnyOp), *get_args(protocol.messages.ClientMessage)]
    while todo:
        tp = todo.pop()
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            if tp not in found:
                found.add(tp)
                todo.extend(f.annotation for f in tp.model_fields.values())
        else:
            todo.extend(get_args(tp))
    return found


def test_every_integer_on_the_wire_is_bounded() -> None:
    """No op field (of any family) or client message field takes a bignum: every int is
    bounded on both sides (``I64``, ``Dim``, ``TensorId``), so none reaches numpy."""
    models = _wire_models()
    assert protocol.ops.Linalg in models and protocol.ops.SliceSpec in models
    # Full.value and a scalar operand are range-checked against their dtype by inference
    # (test_limits, test_scalar_operands); Hello's ints are only compared (protocol version,
    # device count) and never reach numpy.
    exempt = {
        "Full.value",
        "BinaryScalar.scalar",
        "InPlaceBinaryScalar.scalar",
        "Hello.protocol",
        "Hello.device_index",
    }
    loose = [
        f"{model.__name__}.{name}"
        for model in models
        for name, field in model.model_fields.items()
        if _unbounded_int(field.annotation, field.metadata)
    ]
    assert set(loose) == exempt, loose
