"""Monitoring as operators run it (docker/monitoring/, compose's "monitoring" profile): every
panel of the provisioned Grafana dashboard queries metrics a real server exports, Prometheus
scrapes the servers compose runs with their token, Grafana's provisioning points at both, and
the server exports its process metrics and its version."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

import client
import protocol

from .ops_helpers import http_get, metrics
from .servers import ROOT, ServerProcess, run_server

MONITORING = ROOT / "docker" / "monitoring"
DASHBOARDS = MONITORING / "grafana" / "dashboards"
PROVISIONING = MONITORING / "grafana" / "provisioning"
COMPOSE = ROOT / "docker" / "compose.yaml"
PROMETHEUS_OWN = {"up"}  # series Prometheus makes for every target itself
PROCESS_METRICS = (
    "process_resident_memory_bytes",
    "process_cpu_seconds_total",
    "process_open_fds",
    "process_start_time_seconds",
)
# PromQL words that are not metric names: functions are followed by "(", so only these remain
PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset"}


def promql_metrics(expr: str) -> set[str]:
    """The metric names a PromQL expression selects: its identifiers, without label matchers,
    ``by (...)`` groupings, range and offset durations, strings, numbers and function names."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # strings (label values)
    expr = re.sub(r"\{[^}]*\}", " ", expr)  # label matchers
    expr = re.sub(r"\b(?:by|without|on|ignoring)\s*\([^)]*\)", " ", expr)  # groupings
    expr = re.sub(r"\[[^\]]*\]", " ", expr)  # ranges
    names = set()
    for match in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", expr):
        following = expr[match.end() :].lstrip()
        if following.startswith("(") or match[0] in PROMQL_WORDS:
            continue  # a function, or a keyword
        if match.start() > 0 and (
            expr[match.start() - 1].isdigit() or expr[match.start() - 1] == "."
        ):
            continue  # part of a number (1e3)
        names.add(match[0])
    return names


def _dashboard() -> dict[str, Any]:
    (path,) = DASHBOARDS.glob("*.json")
    loaded: dict[str, Any] = json.loads(path.read_text())
    return loaded


def _panel_queries() -> Iterator[tuple[str, str]]:
    for panel in _dashboard()["panels"]:
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            yield panel["title"], target["expr"]


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[ServerProcess, set[str]]]:
    """A real server that ran a session's ops, one failing, and the names of the series its
    /metrics exposes (a labelled family shows series only once it has counted something)."""
    with run_server("--memory-budget", "1GiB") as proc:
        with client.RemoteDevice(proc.url) as dev:
            xp = client.namespace(dev)
            (xp.ones(4) + 1).numpy()
            with pytest.raises(client.RemoteError):
                xp.linalg.inv(xp.zeros((2, 2))).numpy()  # singular: an op error
        status, _, body = http_get(proc.port, "/metrics")
        assert status == 200
        names = set()
        for family in text_string_to_metric_families(body.decode()):
            names.update(sample.name for sample in family.samples)
        yield proc, names


@pytest.mark.server
def test_every_panel_queries_metrics_the_server_exports(
    served: tuple[ServerProcess, set[str]],
) -> None:
    _, exported = served
    queried = [(title, promql_metrics(expr)) for title, expr in _panel_queries()]
    assert all(names for _, names in queried)  # each query names at least one metric
    missing = [
        (title, sorted(names - exported - PROMETHEUS_OWN))
        for title, names in queried
        if names - exported - PROMETHEUS_OWN
    ]
    assert missing == []
    used = set().union(*(names for _, names in queried))
    assert set(PROCESS_METRICS) | {"tensorwire_build_info", "tensorwire_ops_total"} <= used


def test_the_query_parser_finds_a_metric_the_server_does_not_export() -> None:
    expr = 'sum by (kind) (rate(tensorwire_opz_total{job="tensorwire"}[5m])) / 1e3'
    assert promql_metrics(expr) == {"tensorwire_opz_total"}
    assert promql_metrics("histogram_quantile(0.99, sum by (le) (rate(a_bucket[1m])))") == {
        "a_bucket"
    }
    assert promql_metrics("time() - process_start_time_seconds") == {"process_start_time_seconds"}


@pytest.mark.server
def test_the_server_exports_its_process_and_version(
    served: tuple[ServerProcess, set[str]],
) -> None:
    proc, exported = served
    samples = metrics(proc.port)
    build = {k: v for k, v in samples.items() if k[0] == "tensorwire_build_info"}
    labels = (("protocol", str(protocol.PROTOCOL_VERSION)), ("version", protocol.__version__))
    assert build == {("tensorwire_build_info", labels): 1.0}
    values = {name: v for (name, labels), v in samples.items() if not labels}
    assert values["process_resident_memory_bytes"] > 10 * 2**20  # numpy alone is more
    assert values["process_open_fds"] >= 3 and values["process_cpu_seconds_total"] > 0
    assert values["process_start_time_seconds"] > 1.7e9


def test_the_panels_use_the_provisioned_data_source_and_the_scrape_job() -> None:
    (source,) = yaml.safe_load((PROVISIONING / "datasources" / "prometheus.yaml").read_text())[
        "datasources"
    ]
    assert source["url"] == "http://prometheus:9090" and source["type"] == "prometheus"
    job = yaml.safe_load((MONITORING / "prometheus.yml").read_text())["scrape_configs"][0]
    for panel in _dashboard()["panels"]:
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == source["uid"], panel["title"]
            for matched in re.findall(r'job="([^"]*)"', target["expr"]):
                assert matched == job["job_name"], panel["title"]
    ids = [panel["id"] for panel in _dashboard()["panels"]]
    assert len(ids) == len(set(ids))


def test_compose_mounts_the_monitoring_files_and_scrapes_every_server() -> None:
    compose = yaml.safe_load(COMPOSE.read_text())
    services = compose["services"]
    prometheus, grafana = services["prometheus"], services["grafana"]
    assert prometheus["profiles"] == grafana["profiles"] == ["monitoring"]
    mounts = {
        (COMPOSE.parent / host).resolve(): target.removesuffix(":ro")
        for service in (prometheus, grafana)
        for host, _, target in (v.partition(":") for v in service["volumes"])
        if host.startswith(".")
    }
    assert mounts == {
        MONITORING / "prometheus.yml": "/etc/prometheus/prometheus.yml",
        PROVISIONING: "/etc/grafana/provisioning",
        DASHBOARDS: "/var/lib/grafana/dashboards",
    }
    (provider,) = yaml.safe_load((PROVISIONING / "dashboards" / "tensorwire.yaml").read_text())[
        "providers"
    ]
    assert provider["options"]["path"] == mounts[DASHBOARDS]
    job = yaml.safe_load((MONITORING / "prometheus.yml").read_text())["scrape_configs"][0]
    servers = {
        name
        for name, s in services.items()
        if s.get("healthcheck", {}).get("test", [""])[-1] == "server.healthcheck"
    }
    (targets,) = (c["targets"] for c in job["static_configs"])
    assert sorted(targets) == sorted(f"{name}:8765" for name in servers)
    secret = f"/run/secrets/{prometheus['secrets'][0]}"
    assert job["authorization"]["credentials_file"] == secret
    assert all(str(p).startswith("127.0.0.1:") for s in (prometheus, grafana) for p in s["ports"])


def test_compose_limits_the_servers_cpus() -> None:
    services = yaml.safe_load(COMPOSE.read_text())["services"]
    for name in ("server", "server-0", "server-1"):
        assert services[name]["deploy"]["resources"]["limits"]["cpus"], name
