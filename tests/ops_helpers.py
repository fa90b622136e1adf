"""Helpers for the deployment tests: HTTP on a server's port, metrics, Dockerfile parsing."""

from __future__ import annotations

import json
import shlex
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families


def http_get(port: int, path: str, token: str | None = None) -> tuple[int, str, bytes]:
    """``(status, content type, body)`` of ``GET http://127.0.0.1:PORT/PATH``."""
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}")
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.headers["Content-Type"], response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers["Content-Type"], exc.read()


def health(port: int) -> tuple[int, dict[str, object]]:
    status, content_type, body = http_get(port, "/healthz")
    assert content_type == "application/json"
    return status, json.loads(body)


def metrics(
    port: int, token: str | None = None
) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of ``/metrics``, keyed by ``(name, sorted labels)``; parsed by the
    Prometheus client's own parser, so the exposition must be valid text format."""
    status, content_type, body = http_get(port, "/metrics", token)
    assert status == 200, body
    assert content_type.startswith("text/plain; version=")
    samples = {}
    for family in text_string_to_metric_families(body.decode()):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def value(
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str
) -> float:
    """One sample's value; 0.0 when the series does not exist yet."""
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


# --- Dockerfile -------------------------------------------------------------------------------


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)  # (INSTRUCTION, rest)

    def all(self, instruction: str) -> list[str]:
        return [rest for name, rest in self.instructions if name == instruction]

    def env(self) -> dict[str, str]:
        """Every ``ENV key=value`` of the stage, in order."""
        values: dict[str, str] = {}
        for rest in self.all("ENV"):
            for pair in shlex.split(rest):
                key, sep, val = pair.partition("=")
                assert sep, f"ENV {rest!r}: use the key=value form"
                values[key] = val
        return values

    def exec_form(self, instruction: str) -> list[str]:
        """The JSON (exec) form of the stage's last ``CMD``/``ENTRYPOINT``; [] if none."""
        found = self.all(instruction)
        return json.loads(found[-1]) if found else []


def parse_dockerfile(path: Path) -> list[Stage]:
    """Stages with their instructions: continuations joined, comments and blank lines dropped."""
    logical: list[str] = []
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue  # a comment inside a continued instruction
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        logical.append(pending + line)
        pending = ""
    stages: list[Stage] = []
    for line in logical:
        instruction, _, rest = line.partition(" ")
        instruction = instruction.upper()
        if instruction == "FROM":
            words = rest.split()
            name = words[2] if len(words) >= 3 and words[1].upper() == "AS" else None
            stages.append(Stage(words[0], name))
        elif stages:
            stages[-1].instructions.append((instruction, rest.strip()))
    return stages
