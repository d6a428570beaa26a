"""The Kubernetes manifests, rendered as ``kubectl apply -k deploy/k8s/overlays/example`` would,
are valid objects of their kinds and agree with the code they deploy.

No cluster runs here. Built-in kinds are checked against Kubernetes' own OpenAPI schemas in
their strict form (an unknown or misspelt field fails), by ``kubernetes-validate``; KEDA's
kinds, which those schemas do not cover, by their required fields. The renderer implements only
the kustomize features the manifests use and refuses any other, so a manifest can never rely on
one that is not checked here.
"""

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from service.language.specs import StepSpec
from service.platform.constants import QUEUE_STEPS
from service.platform.settings import Settings

ROOT = Path(__file__).resolve().parents[1]
OVERLAY = ROOT / "deploy" / "k8s" / "overlays" / "example"
KUBERNETES_VERSION = "1.30.0"
KEDA = "keda.sh/v1alpha1"
UNDERSTOOD = {
    "apiVersion",
    "kind",
    "resources",
    "namespace",
    "labels",
    "images",
    "secretGenerator",
    "generatorOptions",
}
SUBCOMMANDS = {"api", "worker", "beat", "flower", "migrate"}


def _env_file(path: Path) -> dict[str, str]:
    """``secrets.env`` is the operator's own and never committed; its example stands in."""
    source = path if path.exists() else path.with_name(path.name + ".example")
    pairs = (line.split("=", 1) for line in source.read_text().splitlines() if "=" in line)
    return {key.strip(): value.strip() for key, value in pairs}


def _render(directory: Path) -> list[dict[str, Any]]:
    spec = yaml.safe_load((directory / "kustomization.yaml").read_text())
    assert set(spec) <= UNDERSTOOD, f"kustomize features not checked here: {set(spec) - UNDERSTOOD}"
    objects: list[dict[str, Any]] = []
    for entry in spec.get("resources", []):
        path = (directory / entry).resolve()
        if path.is_dir():
            objects += _render(path)
        else:
            objects += [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
    for generated in spec.get("secretGenerator", []):
        data: dict[str, str] = {}
        for env in generated.get("envs", []):
            data |= _env_file(directory / env)
        meta = {"name": generated["name"]}
        objects.append({"apiVersion": "v1", "kind": "Secret", "metadata": meta, "stringData": data})
    for obj in objects:
        _apply(spec, obj)
    return objects


def _apply(spec: dict[str, Any], obj: dict[str, Any]) -> None:
    meta = obj.setdefault("metadata", {})
    if "namespace" in spec:
        meta["namespace"] = spec["namespace"]
    for group in spec.get("labels", []):
        meta.setdefault("labels", {}).update(group["pairs"])
    for image in spec.get("images", []):
        for container in _containers(obj):
            if container["image"].split(":")[0] == image["name"]:
                container["image"] = f"{image['newName']}:{image['newTag']}"


def _containers(obj: dict[str, Any]) -> Iterator[dict[str, Any]]:
    pod = _pod(obj)
    if pod is not None:
        yield from pod.get("initContainers", [])
        yield from pod["containers"]


def _pod(obj: dict[str, Any]) -> dict[str, Any] | None:
    if obj["kind"] in {"Deployment", "Job"}:
        pod: dict[str, Any] = obj["spec"]["template"]["spec"]
        return pod
    return None


@pytest.fixture(scope="module")
def rendered() -> list[dict[str, Any]]:
    return _render(OVERLAY)


def _of(rendered: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {obj["metadata"]["name"]: obj for obj in rendered if obj["kind"] == kind}


def test_every_built_in_object_is_valid_against_the_strict_kubernetes_schema(
    rendered: list[dict[str, Any]],
) -> None:
    built_in = [obj for obj in rendered if obj["apiVersion"] != KEDA]
    assert {obj["kind"] for obj in built_in} >= {
        "ConfigMap",
        "Deployment",
        "Job",
        "PodDisruptionBudget",
        "Secret",
        "Service",
    }
    for obj in built_in:
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)


def test_the_strict_schema_refuses_a_misspelt_field(rendered: list[dict[str, Any]]) -> None:
    api = dict(_of(rendered, "Deployment")["flowbeat-api"])
    api["spec"] = {**api["spec"], "replica": 2}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(api, KUBERNETES_VERSION, strict=True)


def test_workers_scale_on_the_steps_queue_with_keda(rendered: list[dict[str, Any]]) -> None:
    [scaled] = _of(rendered, "ScaledObject").values()
    [auth] = _of(rendered, "TriggerAuthentication").values()
    secret = _of(rendered, "Secret")["flowbeat-secrets"]["stringData"]

    assert scaled["spec"]["scaleTargetRef"]["name"] in _of(rendered, "Deployment")
    assert scaled["spec"]["scaleTargetRef"]["name"] == "flowbeat-worker"
    [trigger] = scaled["spec"]["triggers"]
    assert trigger["type"] == "redis" and trigger["metadata"]["listName"] == QUEUE_STEPS
    assert trigger["authenticationRef"]["name"] == auth["metadata"]["name"]
    for ref in auth["spec"]["secretTargetRef"]:
        assert ref["name"] == "flowbeat-secrets" and ref["key"] in secret
    assert 1 <= scaled["spec"]["minReplicaCount"] < scaled["spec"]["maxReplicaCount"]


def test_every_setting_the_manifests_pass_is_a_real_one(rendered: list[dict[str, Any]]) -> None:
    known = {f"FLOWBEAT_{name.upper()}" for name in Settings.model_fields}
    config = _of(rendered, "ConfigMap")["flowbeat-config"]["data"]
    secret = _of(rendered, "Secret")["flowbeat-secrets"]["stringData"]
    passed = {key for key in (*config, *secret) if key.startswith("FLOWBEAT_")}
    assert passed and passed <= known, passed - known
    Settings.model_validate(
        {key[len("FLOWBEAT_") :].lower(): value for key, value in config.items()}
    )


def test_every_container_runs_a_flowbeat_command_as_a_non_root_user_from_the_image(
    rendered: list[dict[str, Any]],
) -> None:
    config_and_secrets = {"flowbeat-config", "flowbeat-secrets"}
    for obj in rendered:
        pod = _pod(obj)
        if pod is None:
            continue
        assert pod["securityContext"]["runAsNonRoot"] is True
        for container in pod["containers"]:
            assert container["image"] == "registry.example.org/flowbeat:0.1.0"
            assert container["args"][0] in SUBCOMMANDS
            assert container["securityContext"]["readOnlyRootFilesystem"] is True
            mounts = {mount["mountPath"] for mount in container["volumeMounts"]}
            assert {"/app/data", "/tmp"} <= mounts
            refs = {next(iter(ref.values()))["name"] for ref in container["envFrom"]}
            assert refs == config_and_secrets


def test_every_worker_mounts_one_shared_data_store(rendered: list[dict[str, Any]]) -> None:
    """Worker pods land on any node: the store they share is a ReadWriteMany claim, mounted
    where ``FLOWBEAT_DATA_STORE`` says and writable by the pods' group."""
    store = _of(rendered, "ConfigMap")["flowbeat-config"]["data"]["FLOWBEAT_DATA_STORE"]
    pod = _of(rendered, "Deployment")["flowbeat-worker"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    mounted = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volume = next(v for v in pod["volumes"] if v["name"] == mounted[store])
    claim = _of(rendered, "PersistentVolumeClaim")[volume["persistentVolumeClaim"]["claimName"]]
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    assert pod["securityContext"]["fsGroup"] == pod["securityContext"]["runAsGroup"]


def test_selectors_services_and_budgets_match_their_pods(rendered: list[dict[str, Any]]) -> None:
    deployments = _of(rendered, "Deployment")
    pods = {name: d["spec"]["template"]["metadata"]["labels"] for name, d in deployments.items()}
    for deployment in deployments.values():
        selector = deployment["spec"]["selector"]["matchLabels"]
        assert selector.items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    for budget in _of(rendered, "PodDisruptionBudget").values():
        wanted = budget["spec"]["selector"]["matchLabels"].items()
        assert [name for name, labels in pods.items() if wanted <= labels.items()]
    for service in _of(rendered, "Service").values():
        wanted = service["spec"]["selector"].items()
        [target] = [deployments[n] for n, labels in pods.items() if wanted <= labels.items()]
        ports = {p["name"] for c in _containers(target) for p in c.get("ports", [])}
        assert {port["targetPort"] for port in service["spec"]["ports"]} <= ports
    assert set(_of(rendered, "PodDisruptionBudget")) >= {
        "flowbeat-api",
        "flowbeat-worker",
        "flowbeat-beat",
    }


def test_the_api_is_probed_on_health_and_beat_runs_replicas(
    rendered: list[dict[str, Any]],
) -> None:
    deployments = _of(rendered, "Deployment")
    [api] = deployments["flowbeat-api"]["spec"]["template"]["spec"]["containers"]
    port = int(api["args"][api["args"].index("--port") + 1])
    assert {p["containerPort"] for p in api["ports"]} == {port}
    for probe in ("readinessProbe", "livenessProbe"):
        assert api[probe]["httpGet"]["path"] == "/health"
    assert deployments["flowbeat-beat"]["spec"]["replicas"] >= 2


def test_a_worker_gets_to_finish_its_steps_before_it_is_killed(
    rendered: list[dict[str, Any]],
) -> None:
    """SIGTERM starts Celery's warm shutdown: running steps finish, nothing new starts. A step
    still running at the grace period's end is killed, its lease lapses and another worker runs
    it again; the grace period covers a step of the default timeout."""
    worker = _of(rendered, "Deployment")["flowbeat-worker"]["spec"]["template"]["spec"]
    config = _of(rendered, "ConfigMap")["flowbeat-config"]["data"]
    default_timeout = StepSpec.model_fields["timeout_s"].default
    lease_s = float(config.get("FLOWBEAT_LEASE_S", Settings.model_fields["lease_s"].default))
    assert worker["terminationGracePeriodSeconds"] > default_timeout + lease_s


def test_only_placeholders_of_secrets_are_committed() -> None:
    example = _env_file(OVERLAY / "secrets.env.example")
    secret_like = {k: v for k, v in example.items() if re.search(r"URL|PASSWORD|TOKEN|AUTH", k)}
    assert secret_like and all("CHANGE-ME" in value for value in secret_like.values())
    assert "deploy/k8s/overlays/*/secrets.env" in (ROOT / ".gitignore").read_text()
