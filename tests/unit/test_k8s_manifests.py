"""Static checks of the Kubernetes manifests, the Dockerfile and the Prometheus files.

Everything here reads files only.
"""

from __future__ import annotations

import functools
import importlib
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "k8s"
PROM = K8S / "prometheus"

# Vigil's own components, by their app.kubernetes.io/component label.
SERVICES = ("gateway", "grader", "model-server", "dashboard")
PREFIX = {
    "gateway": "VIGIL_GATEWAY_",
    "grader": "VIGIL_GRADER_",
    "model-server": "VIGIL_MODEL_",
    "dashboard": "VIGIL_DASHBOARD_",
}
KNOWN_SETTINGS = {
    "gateway": {
        "HOST", "PORT", "METRICS_PORT", "DB_PATH", "BENCHMARK_ROOT", "MAX_CONCURRENCY",
        "REQUEST_TIMEOUT_S",
    },
    "grader": {
        "HOST", "PORT", "METRICS_PORT", "DB_PATH", "BENCHMARK_ROOT", "GATEWAY_ADDRESS",
        "BOOTSTRAP_RESAMPLES",
    },
    "model-server": {"BACKEND", "MODEL_PATH", "MODEL_NAME", "HOST", "PORT", "METRICS_PORT"},
    "dashboard": {"GRADER_ADDRESS", "GATEWAY_ADDRESS", "BENCHMARK_ROOT", "HOST", "PORT"},
}  # fmt: skip
# Variables outside the per-service prefixes that a component may set, and why.
OTHER_ENV = {
    "gateway": {"VIGIL_DATA_DIR"},
    "grader": {"VIGIL_DATA_DIR"},
    # Never reach a hub; size torch's thread pool by the CPU limit.
    "model-server": {"HF_HUB_OFFLINE", "OMP_NUM_THREADS"},
    "dashboard": set(),
    "benchmark-builder": set(),
}
DEFAULT_PORTS = {
    "gateway": {"grpc": 50051, "metrics": 9101},
    "grader": {"grpc": 50052, "metrics": 9102},
    "model-server": {"grpc": 50061, "metrics": 9111},
    "dashboard": {"http": 8501},
}
PROTO_AREA = {"gateway": "gateway", "grader": "grader", "model-server": "model"}
DUCKDB_OWNERS = {"vigil-gateway": "gateway.duckdb", "vigil-grader": "grader.duckdb"}
BENCHMARK_PVC = "vigil-benchmarks"
BENCHMARK_READERS = ("vigil-gateway", "vigil-grader", "vigil-dashboard")
SCRAPE_JOBS = {"vigil-gateway", "vigil-grader", "vigil-model"}
ALERTS = {
    "VigilGatewayDown", "VigilGraderDown", "VigilTransportErrorsHigh",
    "VigilConfidentlyWrongHigh", "VigilRegression", "VigilGraderLagging",
}  # fmt: skip
EXPORTED_METRICS = {
    "up",
    "vigil_gateway_requests_total", "vigil_gateway_request_latency_seconds",
    "vigil_gateway_run_completed_items", "vigil_gateway_run_total_items",
    "vigil_gateway_active_runs",
    "vigil_grader_metric", "vigil_grader_last_seq", "vigil_grader_graded_responses_total",
    "vigil_grader_active_alerts", "vigil_grader_lag_seconds",
    "vigil_model_requests_total", "vigil_model_generate_latency_seconds", "vigil_model_ready",
}  # fmt: skip
CLUSTER_SCOPED = {"Namespace"}
WORKLOAD_KINDS = {"Deployment", "Job"}


# ---------------------------------------------------------------------------------------------
# Loading


@functools.cache
def yaml_files() -> dict[Path, list[Any]]:
    files = sorted([*K8S.rglob("*.yaml"), *K8S.rglob("*.yml")])
    return {
        path: [d for d in yaml.safe_load_all(path.read_text()) if d is not None] for path in files
    }


@functools.cache
def kustomization() -> dict[str, Any]:
    return yaml.safe_load((K8S / "kustomization.yaml").read_text())


def manifest_files() -> dict[Path, list[dict[str, Any]]]:
    """Files holding Kubernetes objects (not the kustomization or Prometheus's own files)."""
    out = {}
    for path, docs in yaml_files().items():
        objects = [d for d in docs if isinstance(d, dict) and "apiVersion" in d and "kind" in d]
        if objects and path.name != "kustomization.yaml":
            out[path] = objects
    return out


def objects(kind: str | None = None) -> list[dict[str, Any]]:
    found = [o for docs in manifest_files().values() for o in docs]
    return [o for o in found if kind is None or o["kind"] == kind]


def by_name(kind: str, name: str) -> dict[str, Any]:
    matches = [o for o in objects(kind) if o["metadata"]["name"] == name]
    assert len(matches) == 1, f"expected one {kind} {name}, found {len(matches)}"
    return matches[0]


def workloads() -> list[dict[str, Any]]:
    return [o for o in objects() if o["kind"] in WORKLOAD_KINDS]


def pod_spec(workload: dict[str, Any]) -> dict[str, Any]:
    return workload["spec"]["template"]["spec"]


def pod_labels(workload: dict[str, Any]) -> dict[str, str]:
    return workload["spec"]["template"]["metadata"]["labels"]


def component(workload: dict[str, Any]) -> str:
    return pod_labels(workload)["app.kubernetes.io/component"]


def vigil_containers() -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(workload, container) for every container that runs the Vigil image."""
    return [
        (w, c)
        for w in workloads()
        for c in pod_spec(w)["containers"]
        if c["image"].split(":")[0] == "vigil"
    ]


def service_containers(kind: str = "Deployment") -> list[tuple[dict[str, Any], dict[str, Any]]]:
    return [(w, c) for w, c in vigil_containers() if w["kind"] == kind]


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value") for e in container.get("env", [])}


def ports_of(container: dict[str, Any]) -> dict[str, int]:
    return {p["name"]: p["containerPort"] for p in container.get("ports", [])}


def mounts_of(workload: dict[str, Any], container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """mountPath -> {"mount": volumeMount, "volume": the pod volume it mounts}."""
    volumes = {v["name"]: v for v in pod_spec(workload).get("volumes", [])}
    return {
        m["mountPath"]: {"mount": m, "volume": volumes[m["name"]]}
        for m in container.get("volumeMounts", [])
    }


def health_service_name(area: str) -> str:
    text = (ROOT / "proto" / "vigil" / area / "v1" / f"{area}.proto").read_text()
    package = re.search(r"^package\s+([\w.]+);", text, re.M)
    service = re.search(r"^service\s+(\w+)", text, re.M)
    assert package and service, f"no package or service in {area}.proto"
    return f"{package.group(1)}.{service.group(1)}"


def project_version() -> str:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


def quantity(value: str | int | float) -> float:
    """A Kubernetes quantity as a float (CPU in cores, memory in bytes)."""
    text = str(value)
    units = {"m": 1e-3, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 1e3, "M": 1e6}
    for suffix, factor in sorted(units.items(), key=lambda kv: -len(kv[0])):
        if text.endswith(suffix):
            return float(text[: -len(suffix)]) * factor
    return float(text)


# ---------------------------------------------------------------------------------------------
# Files and kustomization


def test_every_yaml_file_under_k8s_parses() -> None:
    assert yaml_files(), "no YAML under k8s/"
    for path, docs in yaml_files().items():
        assert docs, f"{path} holds no document"


def test_kustomization_lists_existing_files_and_every_manifest() -> None:
    kust = kustomization()
    listed = [K8S / r for r in kust["resources"]]
    for path in listed:
        assert path.is_file(), f"kustomization lists missing {path}"
    for generator in kust.get("configMapGenerator", []):
        for entry in generator["files"]:
            assert (K8S / entry.split("=")[-1]).is_file(), f"missing generator file {entry}"
    assert set(manifest_files()) == set(listed), "a manifest is not listed in kustomization.yaml"
    assert kust["namespace"] == "vigil"


def test_namespaced_objects_live_in_vigil() -> None:
    assert [n["metadata"]["name"] for n in objects("Namespace")] == ["vigil"]
    for obj in objects():
        if obj["kind"] not in CLUSTER_SCOPED:
            assert obj["metadata"].get("namespace") == "vigil", obj["metadata"]["name"]


def test_objects_carry_recommended_labels() -> None:
    for obj in objects():
        labels = obj["metadata"].get("labels", {})
        assert labels.get("app.kubernetes.io/part-of") == "vigil", obj["metadata"]["name"]
        assert "app.kubernetes.io/name" in labels, obj["metadata"]["name"]
    for workload in workloads():
        labels = pod_labels(workload)
        for key in ("name", "instance", "component", "part-of"):
            assert f"app.kubernetes.io/{key}" in labels, workload["metadata"]["name"]
        selector = workload["spec"].get("selector", {}).get("matchLabels", {})
        assert selector.items() <= labels.items(), workload["metadata"]["name"]


def test_vigil_image_matches_project_version() -> None:
    version = project_version()
    assert vigil_containers()
    for workload, container in vigil_containers():
        assert container["image"] == f"vigil:{version}", workload["metadata"]["name"]
        assert pod_labels(workload).get("app.kubernetes.io/version") == version
    assert {"name": "vigil", "newTag": version} in kustomization()["images"]


# ---------------------------------------------------------------------------------------------
# Workloads


@pytest.mark.parametrize("name", sorted(DUCKDB_OWNERS))
def test_duckdb_owner_is_one_replica_recreated_on_its_own_volume(name: str) -> None:
    deployment = by_name("Deployment", name)
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"]["type"] == "Recreate"
    (container,) = pod_spec(deployment)["containers"]
    env = env_of(container)
    db_path = Path(env[f"{PREFIX[component(deployment)]}DB_PATH"])
    assert db_path.name == DUCKDB_OWNERS[name]
    assert db_path == Path(env["VIGIL_DATA_DIR"]) / db_path.name
    mount = mounts_of(deployment, container)[str(db_path.parent)]
    assert not mount["mount"].get("readOnly", False)
    claim = mount["volume"]["persistentVolumeClaim"]["claimName"]
    pvc = by_name("PersistentVolumeClaim", claim)
    assert pvc["spec"]["accessModes"] in (["ReadWriteOnce"], ["ReadWriteOncePod"])
    others = [
        w["metadata"]["name"]
        for w in workloads()
        if w is not deployment
        for v in pod_spec(w).get("volumes", [])
        if v.get("persistentVolumeClaim", {}).get("claimName") == claim
    ]
    assert others == [], f"{claim} is mounted by {others} as well: one writer per DuckDB file"


def test_every_container_has_requests_and_limits() -> None:
    for workload in workloads():
        for container in pod_spec(workload)["containers"]:
            where = f"{workload['metadata']['name']}/{container['name']}"
            resources = container.get("resources", {})
            for resource in ("cpu", "memory"):
                request = resources.get("requests", {}).get(resource)
                limit = resources.get("limits", {}).get(resource)
                assert request is not None and limit is not None, f"{where}: {resource}"
                assert quantity(request) <= quantity(limit), f"{where}: {resource}"


def test_every_long_running_container_has_probes() -> None:
    deployments = objects("Deployment")
    assert deployments
    for deployment in deployments:
        for container in pod_spec(deployment)["containers"]:
            for probe in ("readinessProbe", "livenessProbe"):
                assert probe in container, f"{deployment['metadata']['name']}: no {probe}"


def test_grpc_servers_probe_their_service_with_native_grpc_probes() -> None:
    checked = 0
    for workload, container in service_containers():
        comp = component(workload)
        if comp not in PROTO_AREA:
            continue
        grpc_port = ports_of(container)["grpc"]
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            if probe not in container:
                continue
            spec = container[probe]["grpc"]
            assert spec["port"] == grpc_port, f"{workload['metadata']['name']}: {probe}"
            assert spec["service"] == health_service_name(PROTO_AREA[comp])
            checked += 1
    assert checked >= 2 * 4  # readiness and liveness of gateway, grader and both models


def test_ports_match_the_defaults() -> None:
    seen = set()
    for workload, container in service_containers():
        comp = component(workload)
        seen.add(comp)
        ports = ports_of(container)
        assert ports == DEFAULT_PORTS[comp], workload["metadata"]["name"]
        env = env_of(container)
        prefix = PREFIX[comp]
        assert env[f"{prefix}HOST"] == "0.0.0.0", "a loopback bind is unreachable in a pod"
        if "http" in ports:
            assert env[f"{prefix}PORT"] == str(ports["http"])
        if "grpc" in ports:
            assert env[f"{prefix}PORT"] == str(ports["grpc"])
            assert env[f"{prefix}METRICS_PORT"] == str(ports["metrics"])
            annotations = workload["spec"]["template"]["metadata"]["annotations"]
            assert annotations["prometheus.io/port"] == str(ports["metrics"])
    assert seen == set(SERVICES)


def test_clients_address_the_services_by_their_ports() -> None:
    services = {s["metadata"]["name"]: s for s in objects("Service")}
    for _, container in service_containers():
        for name, value in env_of(container).items():
            if name.endswith("_ADDRESS"):
                host, port = value.rsplit(":", 1)
                assert host in services, f"{name}={value}: no such Service"
                assert int(port) in [p["port"] for p in services[host]["spec"]["ports"]]


def test_services_select_existing_pods_and_ports() -> None:
    services = objects("Service")
    assert {s["metadata"]["name"] for s in services} >= {
        "vigil-gateway", "vigil-grader", "vigil-model-random", "vigil-model-hf",
        "vigil-dashboard",
    }  # fmt: skip
    for service in services:
        name = service["metadata"]["name"]
        assert service["spec"].get("type", "ClusterIP") == "ClusterIP"
        selector = service["spec"]["selector"]
        targets = [w for w in objects("Deployment") if selector.items() <= pod_labels(w).items()]
        assert len(targets) == 1, f"Service {name} selects {len(targets)} Deployments"
        (container,) = pod_spec(targets[0])["containers"]
        ports = ports_of(container)
        for port in service["spec"]["ports"]:
            target = port.get("targetPort", port["port"])
            number = ports.get(target) if isinstance(target, str) else target
            assert number in ports.values(), f"Service {name}: no container port {target}"
            if component(targets[0]) in SERVICES:
                assert port["port"] == number, f"Service {name} should keep the default port"


def test_env_names_are_known_settings() -> None:
    for workload, container in vigil_containers():
        comp = component(workload)
        prefix = PREFIX.get(comp)
        for name in env_of(container):
            where = f"{workload['metadata']['name']}: {name}"
            if name in OTHER_ENV[comp]:
                continue
            assert prefix and name.startswith(prefix), f"{where} lacks the prefix {prefix}"
            assert name.removeprefix(prefix) in KNOWN_SETTINGS[comp], f"{where} is no setting"


SETTINGS_MODULES = {
    "gateway": "gateway.settings",
    "grader": "grader.settings",
    "model-server": "model_servers.settings",
    "dashboard": "dashboard.settings",
}


@pytest.mark.parametrize("comp", SERVICES)
def test_env_names_are_fields_of_the_services_settings(comp: str) -> None:
    """The manifests against the services' own settings classes (pydantic-settings ignores an
    unknown variable in the environment, so a misspelt one would silently do nothing)."""
    module = importlib.import_module(SETTINGS_MODULES[comp])
    from pydantic_settings import BaseSettings

    classes = [
        obj
        for obj in vars(module).values()
        if isinstance(obj, type)
        and issubclass(obj, BaseSettings)
        and obj.model_config.get("env_prefix") == PREFIX[comp]
    ]
    assert len(classes) == 1, f"{SETTINGS_MODULES[comp]}: no settings class for {PREFIX[comp]}"
    fields = {name.upper() for name in classes[0].model_fields}
    for workload, container in service_containers():
        if component(workload) == comp:
            for name in env_of(container):
                if name.startswith(PREFIX[comp]):
                    assert name.removeprefix(PREFIX[comp]) in fields, name


def test_pods_are_locked_down() -> None:
    for workload in workloads():
        name = workload["metadata"]["name"]
        spec = pod_spec(workload)
        assert spec["securityContext"]["runAsNonRoot"] is True, name
        assert spec["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault", name
        assert isinstance(spec.get("terminationGracePeriodSeconds"), int), name
        assert spec.get("automountServiceAccountToken") is False, name
        # Service links would put VIGIL_GATEWAY_PORT=tcp://... into the settings prefixes.
        assert spec.get("enableServiceLinks") is False, name
        for container in spec["containers"]:
            context = container["securityContext"]
            assert context["allowPrivilegeEscalation"] is False, name
            assert context["readOnlyRootFilesystem"] is True, name
            assert context["capabilities"]["drop"] == ["ALL"], name


def test_vigil_pods_have_a_writable_tmp_and_run_as_the_image_user() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    user = re.search(r"^USER\s+(\d+)(?::(\d+))?\s*$", dockerfile, re.M)
    assert user, "the Dockerfile should switch to a numeric non-root user"
    uid = int(user.group(1))
    assert uid != 0
    for workload, container in vigil_containers():
        context = pod_spec(workload)["securityContext"]
        assert context["runAsUser"] == uid, workload["metadata"]["name"]
        assert context["fsGroup"] == int(user.group(2) or uid), workload["metadata"]["name"]
        assert "emptyDir" in mounts_of(workload, container)["/tmp"]["volume"]


def test_dockerfile_builds_the_vigil_image() -> None:
    text = (ROOT / "Dockerfile").read_text()
    froms = re.findall(r"^FROM\s+(\S+)", text, re.M)
    default_base = re.search(r"^ARG PYTHON_IMAGE=(\S+)", text, re.M)
    bases = {default_base.group(1) if default_base and f == "${PYTHON_IMAGE}" else f for f in froms}
    assert bases == {"python:3.11-slim"}
    assert 'ENTRYPOINT ["vigil"]' in text
    assert '".[hf]"' in text and '"torch==2.13.0"' in text
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert ".venv" in ignored and ".git" in ignored


def test_benchmark_store_is_built_once_and_read_only_for_readers() -> None:
    pvc = by_name("PersistentVolumeClaim", BENCHMARK_PVC)
    assert "ReadOnlyMany" in pvc["spec"]["accessModes"]
    for name in BENCHMARK_READERS:
        deployment = by_name("Deployment", name)
        (container,) = pod_spec(deployment)["containers"]
        root = env_of(container)[f"{PREFIX[component(deployment)]}BENCHMARK_ROOT"]
        mount = mounts_of(deployment, container)[root]
        assert mount["volume"]["persistentVolumeClaim"] == {
            "claimName": BENCHMARK_PVC,
            "readOnly": True,
        }, name
        assert mount["mount"]["readOnly"] is True, name
    (job,) = objects("Job")
    (container,) = pod_spec(job)["containers"]
    args = container["args"]
    assert args[:6] == ["benchmark", "build", "brain-mri", "--size", "paper", "--root"]
    mount = mounts_of(job, container)[args[args.index("--root") + 1]]
    assert mount["volume"]["persistentVolumeClaim"]["claimName"] == BENCHMARK_PVC
    assert not mount["mount"].get("readOnly", False)
    assert pod_spec(job)["restartPolicy"] == "Never"


def test_model_deployments_match_their_backends() -> None:
    backends = {}
    for workload, container in service_containers():
        if component(workload) != "model-server":
            continue
        args = container["args"]
        assert args[:2] == ["serve", "model"]
        backend = args[args.index("--backend") + 1]
        assert env_of(container)["VIGIL_MODEL_BACKEND"] == backend
        assert workload["spec"]["replicas"] == 1
        backends[backend] = (workload, container)
    assert set(backends) == {"random", "hf"}
    workload, container = backends["hf"]
    model_path = Path(env_of(container)["VIGIL_MODEL_MODEL_PATH"])
    mounts = mounts_of(workload, container)
    parents = [m for path, m in mounts.items() if Path(path) in model_path.parents]
    assert len(parents) == 1, "VIGIL_MODEL_MODEL_PATH should lie on the model volume"
    assert parents[0]["mount"]["readOnly"] is True
    assert parents[0]["volume"]["persistentVolumeClaim"]["readOnly"] is True


def test_prometheus_mounts_the_generated_config() -> None:
    generated = {g["name"]: g for g in kustomization()["configMapGenerator"]}
    deployment = by_name("Deployment", "vigil-prometheus")
    (container,) = pod_spec(deployment)["containers"]
    config_arg = next(a for a in container["args"] if a.startswith("--config.file="))
    config_path = Path(config_arg.split("=", 1)[1])
    mount = mounts_of(deployment, container)[str(config_path.parent)]
    config_map = mount["volume"]["configMap"]["name"]
    files = {Path(f).name for f in generated[config_map]["files"]}
    assert files == {config_path.name, "rules.yml"}


# ---------------------------------------------------------------------------------------------
# Prometheus files


def test_scrape_jobs_target_the_services_metrics_ports() -> None:
    config = yaml.safe_load((PROM / "prometheus.yml").read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert set(jobs) == SCRAPE_JOBS
    for rule_file in config["rule_files"]:
        assert (PROM / rule_file).is_file()
    services = {s["metadata"]["name"]: s for s in objects("Service")}
    scraped = set()
    for job in jobs.values():
        for static in job["static_configs"]:
            for target in static["targets"]:
                host, port = target.rsplit(":", 1)
                name, namespace, *_ = host.split(".")
                assert namespace == "vigil"
                ports = {p["name"]: p["port"] for p in services[name]["spec"]["ports"]}
                assert ports.get("metrics") == int(port), target
                scraped.add(name)
    wanted = {
        name
        for name, service in services.items()
        if service["metadata"]["labels"]["app.kubernetes.io/component"]
        in ("gateway", "grader", "model-server")
    }
    assert scraped == wanted, "every metrics-serving Service is scraped, and nothing else"


def test_alert_rules_use_exported_metric_names() -> None:
    groups = yaml.safe_load((PROM / "rules.yml").read_text())["groups"]
    rules = [rule for group in groups for rule in group["rules"]]
    assert {rule["alert"] for rule in rules} == ALERTS
    for rule in rules:
        expr = re.sub(r'"[^"]*"', '""', rule["expr"])  # drop label values
        expr = re.sub(r"\bby\s*\([^)]*\)", "", expr)  # and grouping labels
        names = set(re.findall(r"\b(?:up|vigil_[a-z_]+)\b(?=\s*[{\[)]|\s*[<>=!])", expr))
        assert names, rule["alert"]
        assert names <= EXPORTED_METRICS, f"{rule['alert']}: unknown {names - EXPORTED_METRICS}"
        assert rule["labels"]["severity"] in ("warning", "critical")
        assert {"summary", "description"} <= set(rule["annotations"])


def test_rule_tests_show_every_alert_firing_and_quiet() -> None:
    suite = yaml.safe_load((PROM / "rules.test.yml").read_text())
    assert suite["rule_files"] == ["rules.yml"]
    firing, quiet = set(), set()
    for case in suite["tests"]:
        for check in case.get("alert_rule_test", []):
            (firing if check.get("exp_alerts") else quiet).add(check["alertname"])
    assert firing == ALERTS
    assert quiet == ALERTS
