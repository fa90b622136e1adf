"""Starting and naming (README, "Install"): the console commands of ``pyproject.toml``,
``--version`` on every command, ``__version__`` from the package metadata, the ``tensorwire``
command against a real server, the environment a device reads its URL and token from, and the
refusal to run with a package shadowed by a user's file."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

import client
import protocol
import server
from client import _environment

from .servers import ROOT, ServerProcess, run_server

TOKEN = "naming-test-token"  # noqa: S105
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
VERSION = importlib.metadata.version(PYPROJECT["project"]["name"])
SHOWN = f"tensorwire {VERSION} (protocol {protocol.PROTOCOL_VERSION})"


def _run(argv: list[str], cwd: Path = ROOT, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TENSORWIRE_")}
    return subprocess.run(
        argv,
        cwd=cwd,
        env={**clean, "PYTHONPATH": str(ROOT), **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def _console_script(name: str, *args: str) -> subprocess.CompletedProcess[str]:
    """What pip's generated ``name`` script runs: its entry point, with ``argv[0]`` its name."""
    module, _, function = PYPROJECT["project"]["scripts"][name].partition(":")
    code = (
        f"import sys; sys.argv[0] = {name!r}; from {module} import {function}; "
        f"sys.exit({function}())"
    )
    return _run([sys.executable, "-c", code, *args])


def test_every_package_reports_the_installed_version() -> None:
    assert VERSION == PYPROJECT["project"]["version"]
    assert protocol.__version__ == client.__version__ == server.__version__ == VERSION


def test_the_console_commands_are_declared() -> None:
    scripts = PYPROJECT["project"]["scripts"]
    assert scripts == {"tensorwire-server": "server.__main__:main", "tensorwire": "client.cli:main"}


@pytest.mark.server
@pytest.mark.parametrize(
    "argv",
    [
        ["-m", "server"],
        ["-m", "client.cli"],
        ["-m", "client.capture"],
        ["-m", "server.healthcheck"],
    ],
)
def test_version_flag(argv: list[str]) -> None:
    result = _run([sys.executable, *argv, "--version"])
    assert result.returncode == 0, result.stderr
    expected = f"tensorwire {VERSION}" if "server.healthcheck" in argv else SHOWN
    assert result.stdout.strip() == expected


@pytest.mark.e2e
@pytest.mark.parametrize(
    "module",
    ["bench", "bench.cpu", "bench.faults", "bench.soak", "bench.profile", "bench.op_costs"],
)
def test_the_bench_commands_have_a_version_flag(module: str) -> None:
    result = _run([sys.executable, "-m", module, "--version"])
    assert (result.returncode, result.stdout.strip()) == (0, SHOWN), result.stderr


def test_the_console_commands_run_their_entry_points() -> None:
    for name in ("tensorwire-server", "tensorwire"):
        result = _console_script(name, "--version")
        assert (result.returncode, result.stdout.strip()) == (0, SHOWN), result.stderr
    assert _console_script("tensorwire", "version").stdout.strip() == SHOWN
    served = _console_script("tensorwire-server", "--port", "70000")
    assert served.returncode == 2 and "--port (TENSOR_SERVER_PORT)" in served.stderr


@pytest.fixture(scope="module")
def secured() -> Iterator[ServerProcess]:
    with run_server("--token", TOKEN) as proc:
        yield proc


def test_ping_names_the_server_and_times_round_trips(secured: ServerProcess) -> None:
    result = _run(
        [sys.executable, "-m", "client.cli", "ping", secured.url, "--count", "3"],
        TENSORWIRE_TOKEN=TOKEN,
    )
    assert result.returncode == 0, result.stderr
    first, second = result.stdout.strip().split("\n")
    assert first.startswith(f"{secured.url}: tensorwire {VERSION} (protocol 2), device ndarray")
    assert "round trip min" in second and second.endswith("(3 syncs)")


def test_stats_is_a_table_of_the_servers_counts(secured: ServerProcess, tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    with client.RemoteDevice(secured.url, token=TOKEN) as dev:  # another session's tensor
        kept = client.namespace(dev).ones(1024, dtype="float64")
        dev.sync()
        result = _run(
            [sys.executable, "-m", "client.cli", "stats", "--token-file", str(token_file)],
            TENSORWIRE_URL=secured.url,
        )
        del kept
    assert result.returncode == 0, result.stderr
    rows = dict(line.split("  ", 1) for line in result.stdout.strip().split("\n"))
    rows = {name.strip(): value.strip() for name, value in rows.items()}
    assert rows["server"] == secured.url and rows["version"] == f"{VERSION} (protocol 2)"
    assert rows["open sessions"] == "2" and rows["status"] == "serving"
    assert rows["tensor bytes held, all sessions"] == "8.0 KiB (8192 B)"
    assert int(rows["ops run"]) >= 1 and int(rows["sessions opened"]) >= 2  # from /metrics
    assert rows["resident memory"].endswith(" B)") and rows["up for"].endswith(" s")


@pytest.mark.server
def test_stats_says_why_it_shows_no_metrics_when_they_are_elsewhere() -> None:
    with run_server("--metrics-port", "0") as proc:
        result = _run([sys.executable, "-m", "client.cli", "stats", proc.url])
    assert result.returncode == 0, result.stderr
    last = result.stdout.strip().split("\n")[-1]
    assert last.startswith("metrics") and "--metrics-port" in last


def test_the_cli_says_in_one_line_what_stops_it(secured: ServerProcess) -> None:
    refused = _run([sys.executable, "-m", "client.cli", "ping", secured.url])  # no token
    assert refused.returncode == 2 and refused.stdout == ""
    assert refused.stderr.startswith("tensorwire ping: error: AuthenticationError")
    nowhere = _run([sys.executable, "-m", "client.cli", "stats"])
    assert nowhere.returncode == 2 and "set TENSORWIRE_URL" in nowhere.stderr


def test_a_device_reads_its_url_and_token_from_the_environment(
    secured: ServerProcess, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in (*(v for v in os.environ if v.startswith("TENSORWIRE_")), "TENSOR_SERVER_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ValueError, match="set TENSORWIRE_URL"):
        client.RemoteDevice()
    monkeypatch.setenv("TENSORWIRE_URL", secured.url)
    with pytest.raises(client.AuthenticationError):
        client.RemoteDevice()
    monkeypatch.setenv("TENSORWIRE_TOKEN", TOKEN)
    with client.RemoteDevice() as dev:
        assert dev.url == secured.url and dev.stats().tensors == 0
    token_file = tmp_path / "token"
    token_file.write_text(f"  {TOKEN}\n")
    monkeypatch.setenv("TENSORWIRE_TOKEN_FILE", str(token_file))
    with pytest.raises(ValueError, match="not both"):
        client.RemoteDevice()
    monkeypatch.delenv("TENSORWIRE_TOKEN")
    with client.RemoteDevice() as dev:
        assert dev.stats().tensors == 0
    token_file.write_text("\n")
    with pytest.raises(ValueError, match="is empty"):
        client.RemoteDevice()


def test_the_newer_token_variable_wins_over_the_older(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (_environment.TOKEN_FILE_ENV, _environment.TOKEN_ENV):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TENSOR_SERVER_TOKEN", "old")
    assert _environment.server_token(None) == "old"
    monkeypatch.setenv("TENSORWIRE_TOKEN", "new")
    assert _environment.server_token(None) == "new"
    assert _environment.server_token("given") == "given"


SHADOWING = {
    "protocol.py": 'print("the user\'s protocol.py ran")\n',
    "client.py": 'print("the user\'s client.py ran")\n',
}


@pytest.mark.parametrize("package", ["client", "server", "protocol"])
def test_a_users_file_shadowing_a_package_fails_at_import_naming_it(
    tmp_path: Path, package: str
) -> None:
    (tmp_path / "protocol.py").write_text(SHADOWING["protocol.py"])
    if package != "client":  # "import client" would be the user's client.py itself
        (tmp_path / "client.py").write_text(SHADOWING["client.py"])
    script = tmp_path / "train.py"
    script.write_text(f"import {package}\n")
    if package == "protocol":  # the user's protocol.py is what "import protocol" finds:
        script.write_text("import server.config\n")  # the SDK finds it from a sibling
    result = _run([sys.executable, str(script)], cwd=tmp_path)
    assert result.returncode == 1
    last = result.stderr.strip().split("\n")[-1]
    assert last.startswith("ImportError: Tensorwire's packages are shadowed: ")
    assert f"'protocol' is {tmp_path / 'protocol.py'}" in last
    if package != "client":
        assert f"'client' is {tmp_path / 'client.py'}" in last
    assert "rename it" in last
    assert "ran" not in result.stdout  # the user's files never ran


def test_a_folder_without_the_sdks_names_imports_it(tmp_path: Path) -> None:
    (tmp_path / "protocols.py").write_text("")
    result = _run(
        [sys.executable, "-c", "import client, server; print(server.__version__)"], tmp_path
    )
    assert (result.returncode, result.stdout.strip()) == (0, VERSION), result.stderr
