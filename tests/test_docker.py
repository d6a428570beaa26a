"""The compose file and the image definition agree with the CLI and with the runbook."""

from __future__ import annotations

import re
import shlex
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from service.platform.settings import Settings

DOCKER = Path(__file__).resolve().parent.parent / "docker"
FLOWBEAT_SUBCOMMANDS = {"migrate", "api", "worker", "beat", "dev", "run", "jobs", "keys", "flower"}
FLOWBEAT_SERVICES = {"migrate", "api", "worker", "beat", "flower"}
SERVING = {"postgres", "redis", "api", "flower"}


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    loaded = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    assert isinstance(loaded, dict)
    return loaded


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    found = compose["services"]
    assert isinstance(found, dict)
    return found


def _argv(value: object) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return shlex.split(value)
    assert isinstance(value, list)
    return [str(item) for item in value]


def _dockerfile_entrypoint() -> list[str]:
    entrypoints = [
        line.split(None, 1)[1]
        for line in (DOCKER / "Dockerfile").read_text().splitlines()
        if line.strip().upper().startswith("ENTRYPOINT")
    ]
    assert entrypoints, "the Dockerfile has no ENTRYPOINT"
    parsed = yaml.safe_load(entrypoints[-1])
    return _argv(parsed)


def _command_line(service: dict[str, Any]) -> list[str]:
    entrypoint = (
        _argv(service["entrypoint"]) if "entrypoint" in service else _dockerfile_entrypoint()
    )
    if service.get("image", "").startswith(("postgres", "redis")):
        entrypoint = []
    return entrypoint + _argv(service.get("command"))


def _depends(service: dict[str, Any]) -> dict[str, str]:
    raw = service.get("depends_on", {})
    assert isinstance(raw, dict), "depends_on must use the long form, with conditions"
    return {name: spec["condition"] for name, spec in raw.items()}


def test_expected_services(services: dict[str, dict[str, Any]]) -> None:
    assert set(services) >= {"postgres", "redis", "migrate", "api", "worker", "beat", "flower"}


def test_every_flowbeat_command_is_a_real_subcommand(services: dict[str, dict[str, Any]]) -> None:
    seen = set()
    for name, service in services.items():
        argv = _command_line(service)
        if argv and Path(argv[0]).name == "flowbeat":
            assert len(argv) > 1, f"{name} runs bare `flowbeat`"
            assert argv[1] in FLOWBEAT_SUBCOMMANDS, f"{name} runs unknown `flowbeat {argv[1]}`"
            seen.add(name)
    assert seen >= FLOWBEAT_SERVICES


def test_api_and_flower_command_lines(services: dict[str, dict[str, Any]]) -> None:
    assert _command_line(services["api"]) == [
        "flowbeat",
        "api",
        "--host",
        "0.0.0.0",
        "--port",
        "8000",
    ]
    assert _command_line(services["flower"])[:2] == ["flowbeat", "flower"]
    environment = services["flower"]["environment"]
    assert environment["FLOWBEAT_FLOWER_BASIC_AUTH"].startswith("${FLOWBEAT_FLOWER_BASIC_AUTH:?")
    assert "FLOWER_UNAUTHENTICATED_API" not in environment


def test_serving_services_have_healthchecks(services: dict[str, dict[str, Any]]) -> None:
    for name in SERVING:
        check = services[name].get("healthcheck")
        assert check and check.get("test"), f"{name} has no healthcheck"
    assert "pg_isready" in " ".join(_argv(services["postgres"]["healthcheck"]["test"]))
    assert "redis-cli ping" in " ".join(_argv(services["redis"]["healthcheck"]["test"]))
    assert "/health" in " ".join(_argv(services["api"]["healthcheck"]["test"]))


def test_redis_and_postgres_require_a_password(services: dict[str, dict[str, Any]]) -> None:
    argv = _argv(services["redis"]["command"])
    assert argv[argv.index("--requirepass") + 1].startswith("${REDIS_PASSWORD:?")
    assert services["redis"]["environment"]["REDISCLI_AUTH"].startswith("${REDIS_PASSWORD:?")
    assert services["postgres"]["environment"]["POSTGRES_PASSWORD"].startswith("${")
    broker = services["api"]["environment"]["FLOWBEAT_BROKER_URL"]
    assert broker.startswith("redis://:${REDIS_PASSWORD:?")


def test_redis_persists(services: dict[str, dict[str, Any]]) -> None:
    argv = _argv(services["redis"].get("command"))
    assert "--appendonly" in argv
    assert argv[argv.index("--appendonly") + 1] == "yes"
    assert services["redis"]["image"].startswith("redis:7")


def test_postgres_version(services: dict[str, dict[str, Any]]) -> None:
    match = re.match(r"postgres:(\d+)", services["postgres"]["image"])
    assert match and int(match.group(1)) >= 16


def test_worker_is_scalable(services: dict[str, dict[str, Any]]) -> None:
    worker = services["worker"]
    assert "container_name" not in worker
    assert "ports" not in worker
    for name, service in services.items():
        if name in {"worker", "beat"}:
            assert "container_name" not in service


def test_every_worker_shares_one_data_store_volume(
    compose: dict[str, Any], services: dict[str, dict[str, Any]]
) -> None:
    """A scaled worker's ``data.parse`` reads what another replica's ``data.download`` wrote;
    the image makes the directory its user's, and a new named volume takes that owner."""
    worker = services["worker"]
    store = worker["environment"]["FLOWBEAT_DATA_STORE"]
    mounts = dict(mount.split(":", 1)[::-1] for mount in worker["volumes"])
    assert mounts[store] in compose["volumes"], "the store is a named volume, shared by replicas"
    final = "\n".join(_dockerfile_stages()[-1])
    assert re.search(rf"chown 10001:10001 [^\n]*{re.escape(store)}\b", final)


def test_dependency_conditions(services: dict[str, dict[str, Any]]) -> None:
    assert _depends(services["migrate"]) == {"postgres": "service_healthy"}
    for name in ("api", "worker", "beat"):
        depends = _depends(services[name])
        assert depends.get("migrate") == "service_completed_successfully", name
        assert depends.get("redis") == "service_healthy", name
    assert _depends(services["flower"]).get("redis") == "service_healthy"
    assert services["migrate"].get("restart") in (None, "no")


def test_configuration_comes_from_environment(services: dict[str, dict[str, Any]]) -> None:
    for name in FLOWBEAT_SERVICES:
        env = services[name].get("environment", {})
        assert isinstance(env, dict)
        assert env["FLOWBEAT_DATABASE_URL"].startswith("postgresql+psycopg://")
        assert "@postgres:5432/" in env["FLOWBEAT_DATABASE_URL"]
        assert env["FLOWBEAT_BROKER_URL"].endswith("@redis:6379/0")
        assert not any("API_KEY" in key.upper() for key in env), f"{name} bakes in an API key"


def test_every_flowbeat_variable_is_a_real_setting(services: dict[str, dict[str, Any]]) -> None:
    known = {f"FLOWBEAT_{name.upper()}" for name in Settings.model_fields}
    for name in FLOWBEAT_SERVICES:
        variables = {key for key in services[name].get("environment", {}) if "FLOWBEAT_" in key}
        assert variables <= known, (name, sorted(variables - known))


def test_prometheus_scrapes_every_replica_of_the_exporters_compose_turns_on(
    services: dict[str, dict[str, Any]],
) -> None:
    scrape = yaml.safe_load((DOCKER / "prometheus" / "prometheus.yml").read_text())
    found = {
        job["job_name"]: job["dns_sd_configs"][0]
        for job in scrape["scrape_configs"]
        if "dns_sd_configs" in job
    }
    for service, setting in (("worker", "WORKER"), ("beat", "BEAT")):
        env = services[service]["environment"]
        target = found[f"flowbeat-{service}"]
        assert target["names"] == [service]
        assert env[f"FLOWBEAT_{setting}_METRICS_PORT"] == str(target["port"])
        assert env["FLOWBEAT_METRICS_HOST"] == "0.0.0.0"
        assert env["FLOWBEAT_METRICS_TOKEN"].startswith("${FLOWBEAT_METRICS_TOKEN:?")


def _dockerfile_stages() -> list[list[str]]:
    lines = [line.strip() for line in (DOCKER / "Dockerfile").read_text().splitlines()]
    starts = [i for i, line in enumerate(lines) if line.upper().startswith("FROM ")]
    return [lines[start:end] for start, end in zip(starts, [*starts[1:], len(lines)], strict=True)]


def test_dockerfile_runs_as_non_root_that_owns_its_data_dir() -> None:
    final = _dockerfile_stages()[-1]
    assert final[0].split()[1].startswith("python:3.11-slim")
    users = [line.split(None, 1)[1] for line in final if line.upper().startswith("USER ")]
    assert users, "the final stage never switches USER"
    user = users[-1]
    assert user.split(":", 1)[0] not in {"root", "0"}
    data_dir = re.search(r"FLOWBEAT_DATA_DIR=(\S+)", "\n".join(final))
    assert data_dir, "the image does not set FLOWBEAT_DATA_DIR"
    assert f"chown {user} {data_dir[1]}" in "\n".join(final)
    assert f"VOLUME {data_dir[1]}" in final
    assert _dockerfile_entrypoint() == ["flowbeat"]


def test_the_image_installs_the_locked_dependencies_then_flowbeat_alone() -> None:
    build = "\n".join(_dockerfile_stages()[0])
    lock = build.index("pip install --require-hashes -r requirements.lock")
    assert build.index("COPY requirements.lock") < lock < build.index("COPY service")
    assert "pip install --no-deps --no-build-isolation ." in build[lock:]
    assert "requirements.lock" not in (DOCKER.parent / ".dockerignore").read_text().split()


def test_the_image_copies_every_package_the_wheel_ships() -> None:
    build = _dockerfile_stages()[0]
    setup = tomllib.loads((DOCKER.parent / "pyproject.toml").read_text())["tool"]["setuptools"]
    packages = [pattern.rstrip("*") for pattern in setup["packages"]["find"]["include"]]
    assert "flowbeat_client" in packages
    for package in packages:
        assert f"COPY {package} ./{package}" in build, package


def test_dockerignore_keeps_secrets_and_caches_out() -> None:
    ignored = (DOCKER.parent / ".dockerignore").read_text().split()
    assert ".git" in ignored
    assert ".env" in ignored
