"""deploy/k8s/: the kustomize base renders, validates offline, and configures a real node.

Rules:

- ``kubectl kustomize`` renders the base (whichever kubectl is installed: Debian 12's
  kubernetes-client, kubectl 1.20 with kustomize v2, in CI; a newer one elsewhere).
  kubectl and promtool are installed by scripts/install-system-deps.sh: a missing one fails
  these tests, never skips them.
- Built-in kinds (and the two ``*.example.yaml``, the Secret and the migration Job) are
  checked by kubernetes-validate, strict (no unknown field), against the oldest Kubernetes
  the base supports (1.27: unhealthyPodEvictionPolicy) and the newest it knows. The
  Prometheus operator's kinds are checked with jsonschema against the CRDs kept in
  tests/schemas/prometheus-operator/ (README there), made strict the same way; their rules
  by ``promtool check rules``; the PrometheusRule must be what
  scripts/k8s-prometheusrule.py generates from deploy/prometheus/allocator-alerts.yml, and
  the rules' job selectors must match the job the ServiceMonitor gives.
- Every ALLOCATOR_* variable the manifests set is a configuration key, and the variables a
  pod gets (ConfigMap, its own env, the example Secret's files) load as a valid
  configuration with the project's own loader.
"""

from __future__ import annotations

import copy
import functools
import importlib.util
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

import allocator
from allocator.config import KEYS, SECRET_KEYS, Config, env_name, load_config, secret_file_env

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
CRDS = ROOT / "tests" / "schemas" / "prometheus-operator"
ALERT_RULES = ROOT / "deploy" / "prometheus" / "allocator-alerts.yml"
GENERATOR = ROOT / "scripts" / "k8s-prometheusrule.py"
OPERATOR_GROUP = "monitoring.coreos.com"
OLDEST_KUBERNETES = "1.27"
CONFIG_ENV = {env_name(key) for key in KEYS}
SECRET_FILE_ENV = {secret_file_env(key) for key in SECRET_KEYS}
SECURED_ZOOKEEPER_SECRETS = {"zookeeper.sasl_password", "zookeeper.tls_key_password"}
"""Only for an ensemble with SASL or an encrypted TLS key (docs/zookeeper-acls.md): the kit
mounts the secrets every cluster has."""
POD = {"metadata.name": "allocator-0", "status.podIP": "10.0.3.7"}
"""What the kubelet fills in for a fieldRef, for the configuration the pod would load."""


def tool(name: str, package: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is missing: run scripts/install-system-deps.sh (Debian's {package})")
    return path


@pytest.fixture(scope="module")
def rendered() -> list[dict[str, Any]]:
    kubectl = tool("kubectl", "kubernetes-client")
    result = subprocess.run(
        [kubectl, "kustomize", str(K8S)], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [doc for doc in docs if doc["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, got {len(found)}"
    return found[0]


def example_secret() -> dict[str, Any]:
    secret: dict[str, Any] = yaml.safe_load((K8S / "secret.example.yaml").read_text())
    return secret


def node_container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    containers = one(docs, "StatefulSet")["spec"]["template"]["spec"]["containers"]
    assert [c["name"] for c in containers] == ["node"]
    container: dict[str, Any] = containers[0]
    return container


def secret_files(docs: list[dict[str, Any]]) -> dict[str, str]:
    """Each file the Secret's volume puts in the container: its path, and the Secret's key."""
    pod = one(docs, "StatefulSet")["spec"]["template"]["spec"]
    name = example_secret()["metadata"]["name"]
    volumes = {v["name"] for v in pod["volumes"] if v.get("secret", {}).get("secretName") == name}
    files: dict[str, str] = {}
    for mount in node_container(docs)["volumeMounts"]:
        if mount["name"] in volumes:
            files.update(
                {f"{mount['mountPath']}/{key}": key for key in example_secret()["stringData"]}
            )
    return files


def pod_environment(docs: list[dict[str, Any]], secrets_dir: Path) -> dict[str, str]:
    """The variables the node container gets, as the kubelet would resolve them; a path
    into the Secret's volume becomes the same file in ``secrets_dir``, which holds the
    example Secret's values."""
    container = node_container(docs)
    configmaps = {
        doc["metadata"]["name"]: doc["data"] for doc in docs if doc["kind"] == "ConfigMap"
    }
    for key, value in example_secret()["stringData"].items():
        (secrets_dir / key).write_text(value + "\n")
    files = secret_files(docs)
    env: dict[str, str] = {}
    for source in container["envFrom"]:
        env.update(configmaps[source["configMapRef"]["name"]])
    for var in container["env"]:
        if "value" in var:  # $(NAME) refers to a variable defined before it
            env[var["name"]] = re.sub(r"\$\((\w+)\)", lambda m: env[m[1]], var["value"])
        else:
            env[var["name"]] = POD[var["valueFrom"]["fieldRef"]["fieldPath"]]
    for name, value in env.items():
        if name.endswith("_FILE"):
            assert value in files, f"{name}={value} is no file of the Secret's volume"
            env[name] = str(secrets_dir / files[value])
    return env


def test_base_renders_the_node_kit(rendered: list[dict[str, Any]]) -> None:
    kinds = sorted(doc["kind"] for doc in rendered)
    assert kinds == sorted(
        [
            "ConfigMap",
            "PodDisruptionBudget",
            "PrometheusRule",
            "Service",
            "ServiceMonitor",
            "StatefulSet",
        ]
    )


@pytest.mark.parametrize("version", [OLDEST_KUBERNETES, kubernetes_validate.latest_version()])
def test_builtin_kinds_validate_strictly(rendered: list[dict[str, Any]], version: str) -> None:
    builtin = [doc for doc in rendered if not doc["apiVersion"].startswith(OPERATOR_GROUP)]
    examples = [yaml.safe_load(path.read_text()) for path in sorted(K8S.glob("*.example.yaml"))]
    assert sorted(doc["kind"] for doc in examples) == ["Job", "Secret"]
    for doc in [*builtin, *examples]:
        used = kubernetes_validate.validate(doc, version, strict=True)
        assert used == kubernetes_validate.utils.major_minor(version), doc["kind"]


def strict(schema: Any) -> Any:
    """``schema`` with ``additionalProperties: false`` on every object that lists its
    properties: an unknown (misspelt) field is an error, not silently pruned. Go's regexp
    takes ``^(?i)...``; Python's needs the flag first."""
    if isinstance(schema, dict):
        schema = {key: strict(value) for key, value in schema.items()}
        if isinstance(schema.get("pattern"), str) and schema["pattern"].startswith("^(?i)"):
            schema["pattern"] = "(?i)^" + schema["pattern"].removeprefix("^(?i)")
        if (
            "properties" in schema
            and "additionalProperties" not in schema
            and not schema.get("x-kubernetes-preserve-unknown-fields")
        ):
            schema["additionalProperties"] = False
        return schema
    if isinstance(schema, list):
        return [strict(item) for item in schema]
    return schema


@functools.cache
def crds() -> dict[str, dict[str, Any]]:
    """The kept CRDs by file name (parsed with libyaml when PyYAML has it: they are big)."""
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return {path.name: yaml.load(path.read_text(), loader) for path in CRDS.glob("*.yaml")}  # noqa: S506


def crd_validator(kind: str) -> jsonschema.protocols.Validator:
    crd = next(crd for crd in crds().values() if crd["spec"]["names"]["kind"] == kind)
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    schema = strict(version["schema"]["openAPIV3Schema"])
    jsonschema.Draft4Validator.check_schema(schema)
    return jsonschema.Draft4Validator(schema)


@pytest.mark.parametrize("kind", ["ServiceMonitor", "PrometheusRule"])
def test_operator_kinds_match_the_crd_schemas(rendered: list[dict[str, Any]], kind: str) -> None:
    doc = one(rendered, kind)
    assert doc["apiVersion"] == f"{OPERATOR_GROUP}/v1"
    validator = crd_validator(kind)
    errors = [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(doc)]
    assert not errors
    # The check has teeth: a misspelt field is an error.
    broken = copy.deepcopy(doc)
    broken["spec"]["selectr"] = {}
    assert not validator.is_valid(broken)


def test_crd_schemas_are_the_documented_release() -> None:
    readme = (CRDS / "README.md").read_text()
    assert sorted(crds()) == [
        "monitoring.coreos.com_prometheusrules.yaml",
        "monitoring.coreos.com_servicemonitors.yaml",
    ]
    for name, crd in crds().items():
        version = crd["metadata"]["annotations"]["operator.prometheus.io/version"]
        assert f"v{version}" in readme, name
        assert name in readme


def test_prometheusrule_is_generated_from_the_alert_rules(
    rendered: list[dict[str, Any]],
) -> None:
    spec = importlib.util.spec_from_file_location("k8s_prometheusrule", GENERATOR)
    assert spec is not None
    assert spec.loader is not None
    generator = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generator)
    expected = generator.render(ALERT_RULES.read_text(encoding="utf-8"))
    assert (K8S / "prometheusrule.yaml").read_text(encoding="utf-8") == expected, (
        "deploy/k8s/prometheusrule.yaml is out of date: run "
        ".venv/bin/python scripts/k8s-prometheusrule.py"
    )
    assert one(rendered, "PrometheusRule")["spec"] == yaml.safe_load(ALERT_RULES.read_text())


def test_prometheusrule_rules_pass_promtool(rendered: list[dict[str, Any]], tmp_path: Path) -> None:
    promtool = tool("promtool", "prometheus")
    rules = tmp_path / "rules.yml"
    rules.write_text(yaml.safe_dump(one(rendered, "PrometheusRule")["spec"]))
    result = subprocess.run(
        [promtool, "check", "rules", str(rules)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.fixture(scope="module")
def pod_env(
    rendered: list[dict[str, Any]], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, str]:
    return pod_environment(rendered, tmp_path_factory.mktemp("secrets"))


@pytest.fixture(scope="module")
def pod_config(pod_env: dict[str, str]) -> Config:
    return load_config(env=pod_env)


def test_the_alert_rules_see_the_servicemonitors_job(rendered: list[dict[str, Any]]) -> None:
    monitor, service = one(rendered, "ServiceMonitor"), one(rendered, "Service")
    assert "jobLabel" not in monitor["spec"]  # so the job label is the Service's name
    job = service["metadata"]["name"]
    exprs = [
        rule["expr"]
        for group in one(rendered, "PrometheusRule")["spec"]["groups"]
        for rule in group["rules"]
    ]
    selectors = {m for expr in exprs for m in re.findall(r'job=~"([^"]*)"', expr)}
    selectors |= {re.escape(m) for expr in exprs for m in re.findall(r'job="([^"]*)"', expr)}
    # As the base names it, and as an overlay's nameSuffix (README) renames it.
    for name in [job, f"{job}-eu1"]:
        assert all(re.fullmatch(selector, name) for selector in selectors), (name, selectors)


def allocator_variables(docs: list[dict[str, Any]]) -> Iterator[str]:
    for doc in docs:
        if doc["kind"] == "ConfigMap":
            yield from doc["data"]
    for var in node_container(docs)["env"]:
        yield var["name"]


def test_every_allocator_variable_is_a_configuration_key(
    rendered: list[dict[str, Any]],
) -> None:
    names = list(allocator_variables(rendered))
    assert set(names) - {"POD_IP"} == {name for name in names if name.startswith("ALLOCATOR_")}
    assert not set(names) - CONFIG_ENV - SECRET_FILE_ENV - {"POD_IP"}


def test_the_pod_environment_is_a_valid_configuration(
    rendered: list[dict[str, Any]], pod_config: Config
) -> None:
    node = pod_config.node
    assert node.name == "allocator-0"  # stable: the pod's name
    assert node.admin_address == "10.0.3.7:8470"  # the pod's address, not loopback
    assert node.log_format == "json"
    # Every secret, from the Secret's files.
    assert node.admin_token.get_secret_value()
    assert pod_config.zookeeper.auth.get_secret_value()
    assert not pod_config.zookeeper.insecure
    assert "replace-me@" in pod_config.postgres.url.get_secret_value()
    pod = one(rendered, "StatefulSet")["spec"]["template"]["spec"]
    assert node.shutdown_timeout_s < pod["terminationGracePeriodSeconds"]


def test_secrets_come_from_a_secret_as_files(
    rendered: list[dict[str, Any]], pod_env: dict[str, str]
) -> None:
    container, configmap = node_container(rendered), one(rendered, "ConfigMap")
    assert container["envFrom"] == [{"configMapRef": {"name": configmap["metadata"]["name"]}}]
    # No secret value in the environment, from the ConfigMap or a secretKeyRef.
    assert all("secretKeyRef" not in var.get("valueFrom", {}) for var in container["env"])
    assert not {env_name(key) for key in SECRET_KEYS} & set(pod_env)
    file_vars = {name for name in pod_env if name.endswith("_FILE")}
    assert file_vars == SECRET_FILE_ENV - {secret_file_env(k) for k in SECURED_ZOOKEEPER_SECRETS}
    assert sorted(secret_files(rendered).values()) == sorted(example_secret()["stringData"])
    # The Secret is never part of the base: applying it must not overwrite the real one.
    assert "Secret" not in {doc["kind"] for doc in rendered}


def test_the_state_dir_outlives_the_container(
    rendered: list[dict[str, Any]], pod_config: Config
) -> None:
    statefulset = one(rendered, "StatefulSet")
    pod = statefulset["spec"]["template"]["spec"]
    state_dir = Path(pod_config.node.state_dir)
    mounts = {m["name"]: Path(m["mountPath"]) for m in node_container(rendered)["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    holding = [name for name, path in mounts.items() if path in state_dir.parents]
    assert holding, f"no volume holds {state_dir}"
    # A folder below the mount: the node creates it 0700 (an emptyDir's root is 0777).
    assert all("emptyDir" in volumes[name] for name in holding)
    assert statefulset["spec"]["serviceName"] == one(rendered, "Service")["metadata"]["name"]
    # A Service named allocator-node would inject ALLOCATOR_NODE_SERVICE_HOST.
    assert pod["enableServiceLinks"] is False


def test_probes_scraping_and_budget_reach_the_nodes(
    rendered: list[dict[str, Any]], pod_config: Config
) -> None:
    statefulset, service = one(rendered, "StatefulSet"), one(rendered, "Service")
    labels = statefulset["spec"]["template"]["metadata"]["labels"]
    container = node_container(rendered)
    (port,) = container["ports"]
    assert port["containerPort"] == int(pod_config.node.admin_address.rpartition(":")[2])
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": port["name"]}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": port["name"]}

    assert statefulset["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert service["spec"]["selector"].items() <= labels.items()
    assert service["spec"]["publishNotReadyAddresses"] is True  # scrape unready nodes too
    (service_port,) = service["spec"]["ports"]
    assert service_port["targetPort"] == port["name"]

    monitor = one(rendered, "ServiceMonitor")
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    assert [e["port"] for e in monitor["spec"]["endpoints"]] == [service_port["name"]]
    assert [e["path"] for e in monitor["spec"]["endpoints"]] == ["/metrics"]

    budget = one(rendered, "PodDisruptionBudget")
    assert budget["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert budget["spec"]["maxUnavailable"] == 1


def test_a_zookeeper_outage_restarts_no_pod(
    rendered: list[dict[str, Any]], pod_config: Config
) -> None:
    """Issue 24: the node rides a session loss out in-process, so the liveness probe's
    /healthz stays 200 meanwhile (docs/admin-http.md); restartPolicy brings back only a
    node that exits (fenced, broken)."""
    assert pod_config.node.on_session_loss == "rejoin"
    pod = one(rendered, "StatefulSet")["spec"]["template"]["spec"]
    assert pod["restartPolicy"] == "Always"


def test_images_are_this_version() -> None:
    for name in ["statefulset.yaml", "migrate-job.example.yaml"]:
        workload = yaml.safe_load((K8S / name).read_text())
        (container,) = workload["spec"]["template"]["spec"]["containers"]
        assert container["image"] == f"allocator:{allocator.__version__}", name
