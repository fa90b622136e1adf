"""docker/k8s/: the kustomization lists exactly the directory's manifests, every manifest passes
the Kubernetes schemas (kubernetes-validate, strict, at pinned versions), and the manifests keep
their promises: probes on /healthz, stable names through the headless Service, the token only
from the Secret, the memory budget from the memory limit, a drain that fits the grace period,
peers and the example Job naming the StatefulSet's own pods, and a NetworkPolicy that admits
only clients and the servers. No cluster and no kustomize binary needed: the kustomization is
resolved here, and the server's environment is expanded as the kubelet would and checked by
``python -m server --check-config``."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from copy import deepcopy
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import referencing
import yaml

from server.config import AUTO_BUDGET_FRACTION, ServerConfig, cgroup_memory_limit
from server.endpoints import HEALTH_PATH, METRICS_PATH

from .ops_helpers import parse_dockerfile
from .servers import ROOT

K8S = ROOT / "docker" / "k8s"
KUSTOMIZATION = K8S / "kustomization.yaml"
# the Prometheus Operator's ServiceMonitor: a kustomization of its own (its CRD is not core)
MONITORING = K8S / "monitoring"
# the oldest Kubernetes these manifests claim, and the newest schemas kubernetes-validate ships
KUBERNETES_VERSIONS = ("1.30.0", "1.37.0")
# the keys the resolver below understands; a kustomization using others needs it taught
KNOWN_KEYS = {"apiVersion", "kind", "namespace", "resources"}
CLIENT_LABEL = {"tensorwire-client": "true"}

Resource = dict[str, Any]


def _documents(path: Path) -> list[Resource]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def _kustomization() -> Resource:
    (document,) = _documents(KUSTOMIZATION)
    return document


def _build() -> list[Resource]:
    """What ``kustomize build docker/k8s`` gives for the keys in KNOWN_KEYS: every resource
    file's documents, in order, with the kustomization's namespace set."""
    kustomization = _kustomization()
    resources = []
    for name in kustomization["resources"]:
        for document in _documents(K8S / name):
            document["metadata"]["namespace"] = kustomization["namespace"]
            resources.append(document)
    return resources


def _one(kind: str, name: str | None = None) -> Resource:
    found = [r for r in _build() if r["kind"] == kind and name in (None, r["metadata"]["name"])]
    assert len(found) == 1, f"{len(found)} {kind} named {name}"
    return found[0]


def _servers() -> Resource:
    return _one("StatefulSet")


def _server_pod() -> Resource:
    return dict(_servers()["spec"]["template"])


def _server_container() -> Resource:
    (container,) = _server_pod()["spec"]["containers"]
    return dict(container)


def _job_pod() -> Resource:
    return dict(_one("Job")["spec"]["template"])


def _selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return selector.items() <= labels.items()


def _quantity(text: str) -> float:
    """A Kubernetes quantity (``4Gi``, ``500m``, ``2``) as a number."""
    suffixes = {
        "Ki": 2**10,
        "Mi": 2**20,
        "Gi": 2**30,
        "Ti": 2**40,
        "k": 1e3,
        "M": 1e6,
        "G": 1e9,
        "m": 1e-3,
        "": 1,
    }
    match = re.fullmatch(r"([0-9.]+)([A-Za-z]*)", str(text))
    assert match is not None, f"not a quantity: {text!r}"
    return float(match[1]) * suffixes[match[2]]


def _environment(container: Resource, namespace: str) -> dict[str, str]:
    """The container's variables as the kubelet sets them: the pod's namespace, a resource
    limit rounded up in its divisor's unit, and ``$(NAME)`` of a variable defined above."""
    env: dict[str, str] = {}
    for variable in container.get("env", []):
        source = variable.get("valueFrom", {})
        if "fieldRef" in source:
            assert source["fieldRef"]["fieldPath"] == "metadata.namespace"
            value = namespace
        elif "resourceFieldRef" in source:
            ref = source["resourceFieldRef"]
            limit = _quantity(container["resources"]["limits"][ref["resource"].split(".")[1]])
            value = str(math.ceil(limit / _quantity(ref.get("divisor", "1"))))
        else:
            assert not source, f"{variable['name']}: only fieldRef and resourceFieldRef here"
            value = re.sub(r"\$\((\w+)\)", lambda m: env.get(m[1], m[0]), variable["value"])
        env[variable["name"]] = value
    return env


def _expanded(command: list[str], env: dict[str, str]) -> list[str]:
    """``command`` with ``$(NAME)`` of the container's variables filled in, as the kubelet does."""
    return [re.sub(r"\$\((\w+)\)", lambda m: env.get(m[1], m[0]), arg) for arg in command]


def _server_env() -> dict[str, str]:
    return _environment(_server_container(), _kustomization()["namespace"])


def _port(container: Resource, port: int | str) -> int:
    """A container port given by number or by name."""
    if isinstance(port, int):
        return port
    (number,) = [p["containerPort"] for p in container["ports"] if p.get("name") == port]
    return int(number)


def _pod_dns_names() -> list[str]:
    """``NAME-i.SERVICE.NAMESPACE.svc`` for every pod the StatefulSet runs."""
    servers, namespace = _servers(), _kustomization()["namespace"]
    name, service = servers["metadata"]["name"], servers["spec"]["serviceName"]
    replicas = servers["spec"]["replicas"]
    return [f"{name}-{i}.{service}.{namespace}.svc" for i in range(replicas)]


def _server_port() -> int:
    (port,) = _server_container()["ports"]
    return int(port["containerPort"])


# --- the kustomization and the schemas ----------------------------------------------------------


def test_kustomization_lists_every_manifest_once() -> None:
    kustomization = _kustomization()
    assert set(kustomization) <= KNOWN_KEYS, "tests/test_k8s.py's resolver must learn these keys"
    assert kustomization["apiVersion"] == "kustomize.config.k8s.io/v1beta1"
    assert kustomization["kind"] == "Kustomization"
    listed = kustomization["resources"]
    on_disk = sorted(p.name for p in K8S.iterdir() if p not in (KUSTOMIZATION, MONITORING))
    assert len(listed) == len(set(listed)) and sorted(listed) == on_disk


def test_the_build_holds_the_deployment() -> None:
    kinds = sorted((r["kind"], r["metadata"]["name"]) for r in _build())
    assert kinds == [
        ("Job", "tensorwire-train-parallel"),
        ("NetworkPolicy", "tensorwire"),
        ("Service", "tensorwire"),
        ("Service", "tensorwire-any"),
        ("StatefulSet", "tensorwire"),
    ]
    # the Secret is created with kubectl, never kept here (docker/README.md, "Kubernetes")
    assert "secretGenerator" not in _kustomization()


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_manifest_passes_the_kubernetes_schemas(version: str) -> None:
    for resource in _build():
        kubernetes_validate.validate(resource, version, strict=True)


@pytest.mark.parametrize(
    "break_it",
    [
        lambda s: s["spec"].update(replicas="two"),  # a string where an integer belongs
        lambda s: s["spec"]["template"]["spec"]["containers"][0].update(livenesProbe={}),
        lambda s: s["spec"].pop("selector"),  # required
    ],
    ids=["wrong-type", "unknown-field", "missing-field"],
)
def test_the_schema_check_can_fail(break_it: Any) -> None:
    broken = deepcopy(_servers())
    break_it(broken)
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES_VERSIONS[0], strict=True)


# --- the servers --------------------------------------------------------------------------------


def test_servers_run_the_image_as_compose_builds_it() -> None:
    runtime = parse_dockerfile(ROOT / "docker" / "Dockerfile")[-1]
    compose = yaml.safe_load((ROOT / "docker" / "compose.yaml").read_text())
    image = re.sub(r"\$\{\w+:-(\w+)\}", r"\1", compose["services"]["server"]["image"])
    container, pod = _server_container(), _server_pod()["spec"]
    assert container["image"] == image == "tensorwire:latest"
    assert container["command"] == runtime.exec_form("CMD")
    uid, gid = runtime.all("USER")[-1].split(":")
    assert (pod["securityContext"]["runAsUser"], pod["securityContext"]["runAsGroup"]) == (
        int(uid),
        int(gid),
    )
    assert _server_port() == int(_server_env()["TENSOR_SERVER_PORT"]) == 8765


@pytest.mark.parametrize("pod", [_server_pod, _job_pod], ids=["servers", "job"])
def test_pods_run_restricted(pod: Any) -> None:
    spec = pod()["spec"]
    assert spec["automountServiceAccountToken"] is False
    assert spec["enableServiceLinks"] is False  # no variables that look like settings
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    for container in spec["containers"] + spec.get("initContainers", []):
        context = container["securityContext"]
        assert context["allowPrivilegeEscalation"] is False
        assert context["readOnlyRootFilesystem"] is True
        assert context["privileged"] is False
        assert context["capabilities"] == {"drop": ["ALL"]}
        assert container["resources"]["limits"]["memory"]


def test_probes_ask_healthz_on_the_container_port() -> None:
    container = _server_container()
    for probe in ("readinessProbe", "livenessProbe"):
        get = container[probe]["httpGet"]
        assert get["path"] == HEALTH_PATH and "scheme" not in get  # plain HTTP: no TLS set
        assert _port(container, get["port"]) == _server_port()
    # 503 while draining takes the pod out of the Services within two periods
    assert container["readinessProbe"]["failureThreshold"] * 5 <= 10


def test_headless_service_gives_each_server_a_name() -> None:
    servers, headless = _servers(), _one("Service", "tensorwire")
    pod_labels = _server_pod()["metadata"]["labels"]
    assert headless["spec"]["clusterIP"] == "None"
    assert servers["spec"]["serviceName"] == headless["metadata"]["name"]
    assert servers["spec"]["selector"]["matchLabels"] == pod_labels
    job_labels = _job_pod()["metadata"]["labels"]
    for service in (headless, _one("Service", "tensorwire-any")):
        assert _selects(service["spec"]["selector"], pod_labels)
        assert not _selects(service["spec"]["selector"], job_labels)  # never the example
        (port,) = service["spec"]["ports"]
        assert _port(_server_container(), port["targetPort"]) == _server_port() == port["port"]
    assert _one("Service", "tensorwire-any")["spec"].get("clusterIP") != "None"


def _secret_mount(pod: Resource, container: Resource) -> tuple[str, str]:
    """``(secret name, mount path)`` of the container's one Secret volume."""
    secrets = {v["name"]: v["secret"] for v in pod["spec"]["volumes"] if "secret" in v}
    (mount,) = [m for m in container["volumeMounts"] if m["name"] in secrets]
    assert mount["readOnly"] is True
    return secrets[mount["name"]]["secretName"], mount["mountPath"]


def test_the_token_comes_only_from_the_secret() -> None:
    pod, container = _server_pod(), _server_container()
    secret, mounted_at = _secret_mount(pod, container)
    env = _server_env()
    assert Path(env["TENSOR_SERVER_TOKEN_FILE"]).parent == Path(mounted_at)
    assert not {"TENSOR_SERVER_TOKEN", "TENSOR_SERVER_PEER_TOKEN_FILE"} & env.keys()
    (volume,) = [v["secret"] for v in pod["spec"]["volumes"] if "secret" in v]
    assert volume["items"] == [{"key": "token", "path": Path(env["TENSOR_SERVER_TOKEN_FILE"]).name}]
    job_pod = _job_pod()
    (train,) = job_pod["spec"]["containers"]
    job_secret, job_mount = _secret_mount(job_pod, train)
    token_file = train["command"][train["command"].index("--token-file") + 1]
    assert job_secret == secret and Path(token_file) == Path(job_mount) / "token"
    assert all(r["kind"] not in ("Secret", "ConfigMap") for r in _build())
    for path in K8S.rglob("*.yaml"):  # no Secret data, and no token in any variable
        text = path.read_text()
        assert not re.search(r"^\s*(data|stringData):", text, re.M), path
        assert not re.search(r"name: TENSOR_SERVER_TOKEN\s*$", text, re.M), path


def test_memory_budget_is_auto_under_a_memory_limit(tmp_path: Path) -> None:
    container, env = _server_container(), _server_env()
    limit = int(_quantity(container["resources"]["limits"]["memory"]))
    assert env["TENSOR_SERVER_MEMORY_BUDGET"] == "auto"
    # the container's limit, in bytes, in its cgroup v2 memory.max: what "auto" reads
    memory_max = tmp_path / "memory.max"
    memory_max.write_text(f"{limit}\n")
    assert cgroup_memory_limit(memory_max) == limit
    budget = int(limit * AUTO_BUDGET_FRACTION)
    assert budget >= 2**30 and limit - budget >= 2**30  # tensors, and Python and buffers


def test_the_drain_fits_the_grace_period() -> None:
    grace = float(_server_env()["TENSOR_SERVER_SHUTDOWN_GRACE"])
    assert _server_pod()["spec"]["terminationGracePeriodSeconds"] >= grace + 5


@pytest.mark.server
def test_every_variable_is_a_server_setting_and_the_server_accepts_them(tmp_path: Path) -> None:
    """A misspelt TENSOR_SERVER_* variable is ignored by the server, so each must name a field;
    then ``--check-config`` validates the whole environment the pods get."""
    env = _server_env()
    settings = {k.removeprefix("TENSOR_SERVER_").lower() for k in env if "TENSOR_SERVER_" in k}
    assert settings <= ServerConfig.model_fields.keys(), settings - ServerConfig.model_fields.keys()
    token = tmp_path / "token"
    token.write_text("k8s-test-token\n")
    env["TENSOR_SERVER_TOKEN_FILE"] = str(token)
    result = subprocess.run(
        [sys.executable, *_server_container()["command"][1:], "--check-config"],
        env={"PATH": "/usr/bin:/bin", **env},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    checked = json.loads(result.stdout.partition(": ")[2])
    assert checked["host"] == "0.0.0.0" and checked["worker_threads"] == 2
    assert checked["shutdown_grace"] == float(env["TENSOR_SERVER_SHUTDOWN_GRACE"])


def test_peers_admit_every_server_pod_and_nothing_else() -> None:
    from server.config import ServerConfig
    from server.peers import PeerFetcher

    namespace, port = _kustomization()["namespace"], _server_port()
    peers = _server_env()["TENSOR_SERVER_PEERS"].replace("$(POD_NAMESPACE)", namespace)
    fetcher = PeerFetcher(ServerConfig(peers=peers))
    names = _pod_dns_names()
    assert len(names) == 2
    scaled = [n.replace("-1.", "-17.") for n in names]  # a pod added by scaling
    for name in [*names, *scaled]:
        assert fetcher.allows(f"ws://{name}:{port}"), name
    host = names[0]
    for other in [
        f"ws://{host.removesuffix(f'.{namespace}.svc')}:{port}",  # short: the search list
        f"ws://{host.replace(namespace, 'elsewhere')}:{port}",
        f"ws://{host}:{port + 1}",
        f"ws://evil.example:{port}",
        f"ws://{host.replace('.', '.evil.', 1)}:{port}",
        f"ws://x@evil.example:80/.{host}:{port}",
        f"wss://{host}:{port}",
    ]:
        assert not fetcher.allows(other), other


# --- the example Job and the NetworkPolicy ------------------------------------------------------


def test_the_job_trains_across_every_server() -> None:
    spec = _job_pod()["spec"]
    (train,) = spec["containers"]
    command, port = train["command"], _server_port()
    # the Dockerfile's "examples" stage: the server's image and the examples' extras
    assert train["image"] == _server_container()["image"].replace(
        "tensorwire:", "tensorwire-examples:"
    )
    stages = {stage.name for stage in parse_dockerfile(ROOT / "docker" / "Dockerfile")}
    assert "examples" in stages
    assert command[:2] == ["python", "examples/train_data_parallel.py"]
    assert (ROOT / command[1]).is_file(), f"{command[1]} does not exist"
    namespace = _kustomization()["namespace"]
    command = _expanded(command, _environment(train, namespace))
    urls = [command[i + 1] for i, arg in enumerate(command) if arg == "--url"]
    assert urls == [f"ws://{name}:{port}" for name in _pod_dns_names()]
    (wait,) = spec["initContainers"]  # starts training once every server is ready
    waited = _expanded(wait["command"], _environment(wait, namespace))
    assert waited[-len(urls) :] == [
        f"http://{name}:{port}{HEALTH_PATH}" for name in _pod_dns_names()
    ]
    assert "python -m server.healthcheck --url" in wait["command"][2]
    assert spec["restartPolicy"] == "Never"


def _admits(pod_labels: dict[str, str], namespace_labels: dict[str, str], same: bool) -> bool:
    """Whether the NetworkPolicy admits a pod to the servers' port: ``same`` when it runs in
    the policy's namespace. Implements NetworkPolicyPeer for what the policy uses."""
    spec = _one("NetworkPolicy")["spec"]
    (rule,) = spec["ingress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": _server_port()}]
    for peer in rule["from"]:
        assert peer and set(peer) <= {"podSelector", "namespaceSelector"}  # no ipBlock
        assert all(set(s) == {"matchLabels"} for s in peer.values())
        pods = peer.get("podSelector", {}).get("matchLabels", {})
        namespaces = peer.get("namespaceSelector")
        in_namespace = (
            same if namespaces is None else _selects(namespaces["matchLabels"], namespace_labels)
        )
        if in_namespace and _selects(pods, pod_labels):
            return True
    return False


def test_the_network_policy_admits_only_clients_and_the_servers() -> None:
    policy = _one("NetworkPolicy")["spec"]
    server_labels, job_labels = (
        _server_pod()["metadata"]["labels"],
        _job_pod()["metadata"]["labels"],
    )
    assert policy["podSelector"]["matchLabels"] == server_labels
    assert policy["policyTypes"] == ["Ingress"]
    assert _admits(server_labels, {}, same=True)  # the servers pull from each other
    assert _admits(job_labels, {}, same=True)  # the example Job
    assert _admits({}, CLIENT_LABEL, same=False)  # any pod of a clients' namespace
    assert not _admits({}, {}, same=True)  # another pod of the servers' namespace
    assert not _admits({"app": "other"}, {"team": "x"}, same=False)  # another namespace
    assert not _admits(CLIENT_LABEL, {}, same=False)  # a pod's own label, elsewhere
    assert not _admits(server_labels, {}, same=False)  # server-like labels, elsewhere


# --- the ServiceMonitor (docker/k8s/monitoring/) ------------------------------------------------

# The fields of the operator's ServiceMonitor spec and Endpoint these manifests may use
# (monitoring.coreos.com/v1, the Prometheus Operator's API reference): its CRD schema is not
# among the Kubernetes schemas shipped, so the parts that are core types are checked against
# those (ObjectMeta, LabelSelector) and the rest against these names.
SERVICE_MONITOR_SPEC = {"selector", "endpoints", "namespaceSelector", "jobLabel"}
SERVICE_MONITOR_ENDPOINT = {"port", "path", "scheme", "interval", "scrapeTimeout", "authorization"}


def _service_monitor() -> Resource:
    (kustomization,) = _documents(MONITORING / "kustomization.yaml")
    assert set(kustomization) <= KNOWN_KEYS
    assert kustomization["namespace"] == _kustomization()["namespace"]  # where the Secret is
    assert sorted(kustomization["resources"]) == sorted(
        p.name for p in MONITORING.iterdir() if p.name != "kustomization.yaml"
    )
    (monitor,) = (d for name in kustomization["resources"] for d in _documents(MONITORING / name))
    return monitor


def _core_schema_check(instance: Any, schema_file: str, version: str) -> None:
    """``instance`` against a core type's strict schema that kubernetes-validate ships
    (``labelselector-meta-v1.json``), resolved as its ``validate`` resolves a resource's."""
    directory = f"kubernetes-json-schema/v{version}-local-strict"
    schema = kubernetes_validate.utils.schema_contents(f"{directory}/{schema_file}", version)
    definitions = kubernetes_validate.utils.schema_contents(
        f"{directory}/_definitions.json", version
    )
    registry = referencing.Resource.from_contents(schema) @ referencing.Registry()
    registry = referencing.Resource.from_contents(definitions) @ registry
    jsonschema.validators.Draft202012Validator(schema, registry=registry).validate(instance)


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_the_service_monitor_passes_the_schemas_it_can(version: str) -> None:
    monitor = _service_monitor()
    assert (monitor["apiVersion"], monitor["kind"]) == (
        "monitoring.coreos.com/v1",
        "ServiceMonitor",
    )
    with pytest.raises(kubernetes_validate.SchemaNotFoundError):  # not a core kind: why not
        kubernetes_validate.validate(monitor, version, strict=True)
    assert set(monitor) == {"apiVersion", "kind", "metadata", "spec"}
    _core_schema_check(monitor["metadata"], "objectmeta-meta-v1.json", version)
    _core_schema_check(monitor["spec"]["selector"], "labelselector-meta-v1.json", version)
    assert set(monitor["spec"]) <= SERVICE_MONITOR_SPEC
    for endpoint in monitor["spec"]["endpoints"]:
        assert set(endpoint) <= SERVICE_MONITOR_ENDPOINT


def test_the_core_schema_check_can_fail() -> None:
    with pytest.raises(jsonschema.ValidationError):
        _core_schema_check(
            {"matchLabels": {"a": 1}},  # a label value must be a string
            "labelselector-meta-v1.json",
            KUBERNETES_VERSIONS[0],
        )


def test_the_service_monitor_scrapes_each_server_once_with_the_token() -> None:
    monitor = _service_monitor()
    selector = monitor["spec"]["selector"]["matchLabels"]
    selected = [
        r
        for r in _build()
        if r["kind"] == "Service" and _selects(selector, r["metadata"]["labels"])
    ]
    assert [s["metadata"]["name"] for s in selected] == [_servers()["spec"]["serviceName"]]
    (service,) = selected
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] in {port["name"] for port in service["spec"]["ports"]}
    assert endpoint["path"] == METRICS_PATH and endpoint["scheme"] == "http"
    secrets = [v["secret"] for v in _server_pod()["spec"]["volumes"] if "secret" in v]
    (secret,) = secrets
    credentials = endpoint["authorization"]["credentials"]
    assert endpoint["authorization"]["type"] == "Bearer"
    assert credentials["name"] == secret["secretName"]
    assert credentials["key"] in {item["key"] for item in secret["items"]}
    assert "metrics_auth" not in {  # the servers keep /metrics behind the token
        k.removeprefix("TENSOR_SERVER_").lower() for k in _server_env()
    }
