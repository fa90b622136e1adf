"""Settings: every flag is also a TENSOR_SERVER_* variable, validated before anything binds."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import Field

import client
import server
from protocol import RemoteSpec
from server.__main__ import env_var, flag, parser
from server.config import AUTO_BUDGET_FRACTION, ServerConfig, cgroup_memory_limit
from server.setting_values import physical_memory

from .servers import ROOT, run_server

REMOTE_REFUSAL = (
    "python -m server: error: cannot host a remote server on a remote device "
    "(remote:ws://gpu-box:8765): a server must execute ops itself; point it at a local backend "
    "such as --device ndarray, and never reuse a client's remote device config for the server\n"
)


def _clean_env(**values: str) -> dict[str, str]:
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("TENSOR_SERVER_", "TENSORWIRE_"))
    }
    env.update(values)
    return env


def _server(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "server", *args],
        cwd=ROOT,
        env=_clean_env(**env),
        capture_output=True,
        text=True,
        timeout=60,
    )


def _checked(*args: str, **env: str) -> dict[str, object]:
    result = _server(*args, "--check-config", **env)
    assert result.returncode == 0, result.stderr
    prefix, _, shown = result.stdout.strip().partition(": ")
    assert prefix == "config ok"
    loaded = json.loads(shown)
    assert isinstance(loaded, dict)
    return loaded


@pytest.mark.server
def test_help_documents_every_setting_with_its_variable() -> None:
    result = _server("--help")
    assert result.returncode == 0
    text = " ".join(result.stdout.split())  # argparse wraps lines
    for name in ServerConfig.model_fields:
        assert flag(name) in text and env_var(name) in text, name
    assert "--check-config" in text
    actions = {a.dest for a in parser()._actions} - {"help", "version", "check_config"}
    assert actions == set(ServerConfig.model_fields)  # a new field is a new flag


@pytest.mark.server
def test_variables_flags_and_defaults() -> None:
    defaults = _checked()
    assert defaults["port"] == 8765 and defaults["host"] == "127.0.0.1"
    assert defaults["device"] == "ndarray" and defaults["token"] is None
    from_env = _checked(
        TENSOR_SERVER_PORT="9001",
        TENSOR_SERVER_DEVICE="ndarray:3",
        TENSOR_SERVER_SHUTDOWN_GRACE="2.5",
        TENSOR_SERVER_LOG_LEVEL="debug",
        TENSOR_SERVER_MEMORY_BUDGET="1GiB",
    )
    assert from_env["port"] == 9001 and from_env["device"] == "ndarray:3"
    assert from_env["shutdown_grace"] == 2.5 and from_env["log_level"] == "DEBUG"
    assert from_env["memory_budget"] == 2**30
    flag_wins = _checked("--port", "9002", TENSOR_SERVER_PORT="9001")
    assert flag_wins["port"] == 9002


@pytest.mark.server
def test_the_tensorwire_prefix_sets_every_setting_and_wins_over_the_older_one() -> None:
    new = _checked(TENSORWIRE_PORT="9003", TENSORWIRE_LOG_LEVEL="info")
    assert new["port"] == 9003 and new["log_level"] == "INFO"
    both = _checked(
        TENSORWIRE_PORT="9003", TENSOR_SERVER_PORT="9001", TENSOR_SERVER_SHUTDOWN_GRACE="2.5"
    )
    assert both["port"] == 9003  # TENSORWIRE_* wins where both name a setting
    assert both["shutdown_grace"] == 2.5  # the older name still sets what the new one does not
    assert _checked("--port", "9002", TENSORWIRE_PORT="9003")["port"] == 9002  # a flag wins
    assert _checked(TENSORWIRE_PORT="", TENSOR_SERVER_PORT="9001")["port"] == 9001  # empty: unset


@pytest.mark.server
def test_check_config_prints_the_budget_and_quota_that_will_apply() -> None:
    unset = _checked()
    assert unset["memory_budget"] == physical_memory() // 2
    assert unset["session_quota"] == physical_memory() // 4
    assert _checked("--memory-budget", "1GiB")["session_quota"] == 2**29
    assert _checked("--session-quota", "1MiB")["session_quota"] == 2**20


@pytest.mark.server
def test_check_config_binds_nothing() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert _checked("--port", str(port))["port"] == port  # the port is in use: not bound


@pytest.mark.server
def test_token_file_is_read_and_hidden(tmp_path: Path) -> None:
    secret = tmp_path / "token"
    secret.write_text("  file-token\n")
    shown = _checked(TENSOR_SERVER_TOKEN_FILE=str(secret))
    assert shown["token"] == "<hidden>" and "file-token" not in json.dumps(shown)
    with run_server(env=_clean_env(TENSOR_SERVER_TOKEN_FILE=str(secret))) as proc:
        with client.RemoteDevice(proc.url, token="file-token") as dev:
            assert dev.device_count == 1
        with pytest.raises(client.AuthenticationError):
            client.RemoteDevice(proc.url, token="wrong")


@pytest.mark.server
@pytest.mark.parametrize(
    ("args", "env", "needle"),
    [
        (["--port", "70000"], {}, "--port (TENSOR_SERVER_PORT): Input should be less than"),
        ([], {"TENSOR_SERVER_PORT": "eighty"}, "--port (TENSOR_SERVER_PORT): Input should be"),
        ([], {"TENSOR_SERVER_LOG_FORMAT": "xml"}, "--log-format (TENSOR_SERVER_LOG_FORMAT)"),
        (["--memory-budget", "lots"], {}, "--memory-budget (TENSOR_SERVER_MEMORY_BUDGET)"),
        (["--token-file", "/nonexistent/token"], {}, "cannot read /nonexistent/token"),
        (["--token", "a"], {"TENSOR_SERVER_TOKEN_FILE": __file__}, "not both"),
        (["--device", "gpu"], {}, "unknown device spec 'gpu'; valid kinds:"),
        (["--bogus"], {}, "unrecognized arguments: --bogus"),
        (["--port", "9000", "--metrics-port", "9000"], {}, "must differ from --port"),
    ],
)
def test_bad_settings_exit_2_with_one_line(
    args: list[str], env: dict[str, str], needle: str
) -> None:
    for extra in ([], ["--check-config"]):
        result = _server(*args, *extra, **env)
        assert result.returncode == 2, result
        assert result.stdout == ""
        assert result.stderr.startswith("python -m server: error: ") and needle in result.stderr
        assert result.stderr.count("\n") == 1


@pytest.mark.server
def test_startup_validator_from_flag_and_variable() -> None:
    remote = {"TENSOR_SERVER_DEVICE": "remote:ws://gpu-box:8765"}
    for args, env in [
        (["--device", "remote:ws://gpu-box:8765"], {}),
        ([], remote),
        (["--check-config"], remote),
    ]:
        result = _server(*args, **env)
        assert (result.returncode, result.stdout, result.stderr) == (2, "", REMOTE_REFUSAL)
    result = _server(TENSOR_SERVER_DEVICE="capture:capture:ndarray:2")
    assert result.returncode == 2
    assert result.stderr.endswith("serve the inner device instead: --device ndarray:2\n")


@pytest.mark.server
def test_device_from_the_environment_is_served() -> None:
    with run_server(env=_clean_env(TENSOR_SERVER_DEVICE="ndarray:3")) as proc:
        with client.RemoteDevice(proc.url, index=2) as dev:
            assert dev.device_count == 3


def test_programmatic_config() -> None:
    config = ServerConfig(device="ndarray:2", port=0)
    assert server.Server(config).device.count == 2
    with pytest.raises(server.UnsupportedDeviceError):
        server.Server(ServerConfig(device=RemoteSpec(url="ws://gpu-box:8765")))


@pytest.mark.server
def test_memory_budget_auto_follows_the_cgroup_limit(tmp_path: Path) -> None:
    limit_file = tmp_path / "memory.max"
    limit_file.write_text("4294967296\n")
    assert cgroup_memory_limit(limit_file) == 4 * 2**30
    limit_file.write_text("max\n")
    assert cgroup_memory_limit(limit_file) is None
    assert cgroup_memory_limit(tmp_path / "absent") is None
    here = cgroup_memory_limit()  # this machine's own limit, as a container would see its own
    # without a limit, "auto" leaves the budget unset: half the machine's memory applies
    expected = physical_memory() // 2 if here is None else int(here * AUTO_BUDGET_FRACTION)
    assert _checked("--memory-budget", "auto")["memory_budget"] == expected
    assert _checked("--memory-budget", "3GiB")["memory_budget"] == 3 * 2**30
    assert _checked(TENSOR_SERVER_MEMORY_BUDGET="1000000")["memory_budget"] == 10**6


def test_a_new_field_is_a_new_flag_and_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the security settings will add: a bool and a path, each one field."""

    class Extended(ServerConfig):
        insecure: bool = Field(default=False, description="bind without a token, loudly")
        tls_cert: Path | None = Field(default=None, description="certificate file (PEM)")

    p = parser(Extended)
    text = " ".join(p.format_help().split())
    assert "--insecure, --no-insecure" in text and "[env: TENSOR_SERVER_INSECURE]" in text
    assert "--tls-cert TLS_CERT" in text and "[env: TENSOR_SERVER_TLS_CERT]" in text
    args = vars(p.parse_args(["--insecure", "--tls-cert", "/c.pem"]))
    args.pop("check_config")
    config = Extended(**args)
    assert config.insecure is True and config.tls_cert == Path("/c.pem")
    monkeypatch.setenv("TENSOR_SERVER_INSECURE", "true")
    assert Extended().insecure is True
    args = vars(p.parse_args(["--no-insecure"]))
    args.pop("check_config")
    assert Extended(**args).insecure is False  # the flag beats the variable


@pytest.mark.server
def test_port_in_use_is_one_line_and_exit_1() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        result = _server("--port", str(taken.getsockname()[1]))
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.startswith("python -m server: error: ") and "in use" in result.stderr
    assert result.stderr.count("\n") == 1
