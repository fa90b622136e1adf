"""docker/: the Dockerfile and compose.yaml pass their linters, refer only to what the repository
has, and the image's exact command line serves, passes its health check, runs the compose
example client and drains on SIGTERM (no Docker engine needed: the command runs as a process)."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

import protocol
from server.config import ServerConfig
from server.process import start_server

from .ops_helpers import Stage, health, parse_dockerfile
from .servers import ROOT

DOCKER = ROOT / "docker"
DOCKERFILE = DOCKER / "Dockerfile"
COMPOSE = DOCKER / "compose.yaml"
BIN = Path(sys.executable).parent


def _tool(name: str) -> str:
    path = shutil.which(name, path=str(BIN)) or shutil.which(name)
    assert path is not None, f"{name} is not installed: pip install -e '.[test]'"
    return path


def _runtime() -> Stage:
    return parse_dockerfile(DOCKERFILE)[-1]


def _compose() -> dict[str, Any]:
    document = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(document, dict)
    return document


# --- linters ------------------------------------------------------------------------------------


def test_dockerfile_passes_hadolint() -> None:
    result = subprocess.run(
        [_tool("hadolint"), "--no-color", "--failure-threshold", "style", str(DOCKERFILE)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_can_fail(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python\nRUN pip install numpy\nCMD python -m server\n")
    result = subprocess.run(
        [_tool("hadolint"), "--no-color", str(bad)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode != 0 and "DL3006" in result.stdout


def _check_compose(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [_tool("check-jsonschema"), "--builtin-schema", "vendor.compose-spec", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_compose_file_matches_the_compose_spec(tmp_path: Path) -> None:
    result = _check_compose(COMPOSE)
    assert result.returncode == 0, result.stdout + result.stderr
    broken = _compose()
    broken["services"]["server"]["restart"] = {"policy": "always"}  # not a string: invalid
    (tmp_path / "compose.yaml").write_text(yaml.safe_dump(broken))
    assert _check_compose(tmp_path / "compose.yaml").returncode != 0  # the check can fail


# --- what the files promise ---------------------------------------------------------------------


def test_dockerfile_shape() -> None:
    stages = parse_dockerfile(DOCKERFILE)
    runtime = stages[-1]
    assert all("-slim" in stage.base for stage in stages)
    assert runtime.exec_form("CMD") == [
        "python",
        "-m",
        "server",
        "--device",
        "ndarray",
        "--host",
        "0.0.0.0",
    ]
    assert runtime.exec_form("ENTRYPOINT") == []
    user = runtime.all("USER")[-1].split(":")[0]
    assert user not in ("root", "0")
    assert runtime.all("STOPSIGNAL") == ["SIGTERM"]
    assert runtime.env()["TENSOR_SERVER_TOKEN_FILE"] == "/run/secrets/tensor_server_token"
    (healthcheck,) = runtime.all("HEALTHCHECK")
    assert json.loads(healthcheck.partition(" CMD ")[2]) == ["python", "-m", "server.healthcheck"]


def test_compose_promises() -> None:
    services = _compose()["services"]
    server, train = services["server"], services["train"]
    assert server["secrets"] == ["tensor_server_token"]
    assert server["environment"]["TENSOR_SERVER_TOKEN_FILE"] == "/run/secrets/tensor_server_token"
    assert all(str(p).startswith("127.0.0.1:") for p in server["ports"])
    assert server["restart"] == "unless-stopped"
    assert server["deploy"]["resources"]["limits"]["memory"]
    assert server["environment"]["TENSOR_SERVER_MEMORY_BUDGET"] == "auto"
    assert server["healthcheck"]["test"] == ["CMD", "python", "-m", "server.healthcheck"]
    assert train["depends_on"] == {"server": {"condition": "service_healthy"}}
    assert "tensor_server_token" in train["secrets"]
    assert _compose()["secrets"]["tensor_server_token"] == {"environment": "TENSOR_SERVER_TOKEN"}


MULTI_SERVERS = ("server-0", "server-1")  # the "multi" profile's servers


def test_compose_multi_profile_promises() -> None:
    """`--profile multi`: two servers like `server` that may pull from each other, and the
    data-parallel example across both; a plain `up` starts what it started before."""
    services = _compose()["services"]
    assert {name for name, s in services.items() if "profiles" not in s} == {"server", "train"}
    server, train = services["server"], services["train"]
    urls = [f"ws://{name}:8765" for name in MULTI_SERVERS]
    for name in MULTI_SERVERS:
        multi = services[name]
        assert multi["profiles"] == ["multi"]
        assert "ports" not in multi  # clients of transfers run in the compose network
        same = (
            "image",
            "build",
            "secrets",
            "restart",
            "stop_signal",
            "stop_grace_period",
            "deploy",
            "healthcheck",
            "read_only",
            "cap_drop",
            "security_opt",
        )
        assert {k: multi[k] for k in same} == {k: server[k] for k in same}
        environment = dict(multi["environment"])
        assert environment.pop("TENSOR_SERVER_PEERS").split(",") == urls
        assert environment == server["environment"]
        settings = {k.removeprefix("TENSOR_SERVER_").lower() for k in multi["environment"]}
        assert settings <= ServerConfig.model_fields.keys()  # a misspelt one would be ignored
    parallel = services["train-parallel"]
    assert parallel["profiles"] == ["multi"]
    assert parallel["depends_on"] == {n: {"condition": "service_healthy"} for n in MULTI_SERVERS}
    command = parallel["command"]
    assert command[:2] == ["python", "examples/train_data_parallel.py"]
    assert [command[i + 1] for i, arg in enumerate(command) if arg == "--url"] == urls
    assert parallel["secrets"] == ["tensor_server_token"]
    assert command[command.index("--token-file") + 1] == "/run/secrets/tensor_server_token"
    plot = command[command.index("--plot") + 1]  # the root filesystem is read-only
    assert any(plot.startswith(f"{mount}/") for mount in parallel["tmpfs"])
    for key in ("restart", "read_only", "cap_drop", "security_opt"):
        assert parallel[key] == train[key]


def test_short_service_names_never_go_through_a_search_domain() -> None:
    """Services name each other by short names and send the token to them: no search domain
    (``.``: none, not the host's) may turn one into another machine while a service is down."""
    services = _compose()["services"]
    assert {name: s.get("dns_search") for name, s in services.items()} == dict.fromkeys(
        services, "."
    )


def _python_targets(command: list[str]) -> Iterator[tuple[str, str]]:
    """``("module", name)`` for ``python -m name``, ``("script", path)`` for ``python path``."""
    if not command or command[0] not in ("python", "python3"):
        return
    if command[1] == "-m":
        yield "module", command[2]
    elif command[1].endswith(".py"):
        yield "script", command[1]


def _image_files(stage: Stage) -> dict[str, Path]:
    """Image path -> repository path, for every plain ``COPY`` into the runtime stage."""
    workdir, copied = "/", {}
    for instruction, rest in stage.instructions:
        if instruction == "WORKDIR":
            workdir = rest if rest.startswith("/") else f"{workdir.rstrip('/')}/{rest}"
        elif instruction == "COPY" and not rest.startswith("--from"):
            *sources, dest = rest.split()
            for source in sources:
                target = dest if dest.startswith("/") else f"{workdir.rstrip('/')}/{dest}"
                copied[target.rstrip("/")] = ROOT / source
    return copied


def test_every_referenced_file_and_module_exists() -> None:
    stages = parse_dockerfile(DOCKERFILE)
    for stage in stages:  # COPY sources (the build context is the repository root)
        for instruction, rest in stage.instructions:
            if instruction == "COPY" and not rest.startswith("--from"):
                for source in rest.split()[:-1]:
                    assert (ROOT / source).exists(), f"Dockerfile copies missing {source}"
    runtime = stages[-1]
    copied = _image_files(runtime)
    workdir = runtime.all("WORKDIR")[-1]
    commands = [runtime.exec_form("CMD"), ["python", "-m", "server.healthcheck"]]
    compose = _compose()
    for service in compose["services"].values():
        build = service.get("build")
        if build is not None:
            context = (COMPOSE.parent / build["context"]).resolve()
            assert context == ROOT and (context / build["dockerfile"]).resolve() == DOCKERFILE
        commands.append(service.get("command", []))
        commands.append(service.get("healthcheck", {}).get("test", [])[1:])
        assert set(service.get("secrets", [])) <= set(compose["secrets"])
    for secret in compose["secrets"].values():
        if "file" in secret:
            assert (COMPOSE.parent / secret["file"]).exists()
    checked = 0
    for command in commands:
        for kind, target in _python_targets(command):
            checked += 1
            if kind == "module":
                assert importlib.util.find_spec(target) is not None, f"no module {target}"
                top = target.split(".")[0]
                assert (ROOT / top).is_dir(), f"{target} is not a module of this repository"
            else:
                image_path = f"{workdir}/{target}"
                directory = image_path.rsplit("/", 1)[0]
                assert directory in copied, f"{image_path} is not copied into the image"
                assert (copied[directory] / Path(target).name).is_file(), target
    assert checked >= 4  # server, healthcheck (twice) and the example client


# --- the image's command line, run as a process -------------------------------------------------


def _image_environment(stage: Stage, **overrides: str) -> dict[str, str]:
    """The environment the image gives its command (its ENV lines over a minimal base)."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.environ.get("HOME", "/")}
    env.update(stage.env())
    env.update(overrides)
    return env


def _healthcheck(workdir: Path, env: dict[str, str], port: int) -> subprocess.CompletedProcess[str]:
    """``python -m server.healthcheck`` (the image's HEALTHCHECK) against ``port``."""
    return subprocess.run(
        [sys.executable, "-m", "server.healthcheck"],
        cwd=workdir,
        capture_output=True,
        text=True,
        env={**env, "TENSOR_SERVER_PORT": str(port)},
        timeout=60,
    )


@pytest.mark.e2e
def test_image_command_serves_checks_health_runs_a_client_and_drains(tmp_path: Path) -> None:
    """The Dockerfile's CMD with its ENV, changed only where a test must: the python of this
    environment, loopback instead of 0.0.0.0, port 0, and the secret's path on this machine."""
    stage = _runtime()
    command = stage.exec_form("CMD")
    host_at = command.index("--host") + 1
    assert command[0] == "python" and command[host_at] == "0.0.0.0"
    argv = [sys.executable, *command[1:host_at], "127.0.0.1", *command[host_at + 1 :]]
    secret = tmp_path / "tensor_server_token"
    secret.write_text("image-test-token\n")
    env = _image_environment(stage, TENSOR_SERVER_PORT="0", TENSOR_SERVER_TOKEN_FILE=str(secret))
    workdir = tmp_path / "app"  # the image's WORKDIR: nothing from the checkout on the path
    workdir.mkdir()
    with start_server(command=argv, cwd=workdir, env=env, timeout=30) as proc:
        url, port = proc.url, proc.port
        serving = {"status": "serving", "protocol": 2, "device": "ndarray"}
        assert health(port) == (200, serving | {"version": protocol.__version__})

        checker = _healthcheck(workdir, env, port)  # the HEALTHCHECK, on the port it took
        assert checker.returncode == 0, checker.stdout + checker.stderr
        assert json.loads(checker.stdout)["status"] == "serving"

        service = _compose()["services"]["train"]  # the compose example client
        train = service["command"]
        args = [url if a == "ws://server:8765" else a for a in train[2:]]
        train_argv = [sys.executable, str(ROOT / train[1]), *args, "--quick"]
        # compose mounts the secret at /run/secrets/...; here it is at `secret`
        train_env = {**env, **service["environment"], "TENSOR_SERVER_TOKEN_FILE": str(secret)}
        ran = subprocess.run(
            train_argv, cwd=workdir, capture_output=True, text=True, timeout=120, env=train_env
        )
        assert ran.returncode == 0, ran.stdout + ran.stderr
        assert "converged" in ran.stdout

        assert proc.stop(timeout=60) == 0  # SIGTERM
        unhealthy = _healthcheck(workdir, env, port)
        assert unhealthy.returncode == 1
        events = [json.loads(line) for line in proc.stderr.lines()]
        names = [e["event"] for e in events]
        assert names[0] == "listening" and names[-2:] == ["draining", "drained"]
        assert "session opened" in names and "session closed" in names
        assert "image-test-token" not in json.dumps(events)


@pytest.mark.server
def test_image_refuses_to_start_without_its_secret(tmp_path: Path) -> None:
    stage = _runtime()
    command = stage.exec_form("CMD")
    env = _image_environment(
        stage, TENSOR_SERVER_PORT="0", TENSOR_SERVER_TOKEN_FILE=str(tmp_path / "missing")
    )
    result = subprocess.run(
        [sys.executable, *command[1:], "--check-config"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "TENSOR_SERVER_TOKEN_FILE" in result.stderr


@pytest.mark.parametrize("path", ["docker/README.md", "docker/Dockerfile.dockerignore"])
def test_docker_docs_exist(path: str) -> None:
    assert (ROOT / path).is_file()


def test_health_check_stays_light() -> None:
    """The check runs every few seconds in the container: no numpy, websockets or pydantic."""
    heavy = "{'numpy', 'websockets', 'pydantic'}"
    code = f"import sys, server.healthcheck; print(sorted({heavy} & set(sys.modules)))"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60
    )
    assert result.returncode == 0 and result.stdout.strip() == "[]", result.stderr
