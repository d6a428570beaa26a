"""In the embedded default the command learns its broker only once the servers run: the job
commands publish there, never to a broker Celery would default to."""

import base64
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from service.engine.runtime import Runtime
from tests.conftest import Stack
from tests.e2e.conftest import Proc, wait_for
from tests.support.embedded_cli import BROKER_ENV, DATABASE_ENV

pytestmark = pytest.mark.e2e  # runs the flowbeat CLI as a process

ROOT = Path(__file__).resolve().parents[3]
STEPS_QUEUE = "flowbeat.steps"
EMBEDDED_ARGV = [sys.executable, "-m", "tests.support.embedded_cli"]

Cli = Callable[..., subprocess.CompletedProcess[str]]

GATED = {
    "name": "gated",
    "steps": [
        {"id": "gate", "action": "noop", "approval": {"on_timeout": "escalate"}},
        {"id": "after", "action": "noop", "depends_on": ["gate"]},
    ],
}
ONE_STEP = {"name": "single", "steps": [{"id": "only", "action": "noop"}]}


@pytest.fixture(scope="module")
def embedded_env(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Neither server set, as after ``pip install`` on a fresh machine."""
    env = {
        key: value
        for key, value in {**os.environ, **stack.env}.items()
        if key not in {"FLOWBEAT_DATABASE_URL", "FLOWBEAT_BROKER_URL"}
    }
    return env | {
        "PYTHONPATH": str(ROOT),
        "COLUMNS": "200",
        "FLOWBEAT_DATA_DIR": str(tmp_path_factory.mktemp("embedded-cli")),
        DATABASE_ENV: stack.database_url,
        BROKER_ENV: stack.broker_url,
    }


@pytest.fixture(scope="module")
def embedded_flowbeat(embedded_env: dict[str, str]) -> Cli:
    """The command in the embedded default."""

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*EMBEDDED_ARGV, *args],
            env=embedded_env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    return run


@pytest.fixture
def broker(stack: Stack) -> Iterator[redis.Redis]:
    client: redis.Redis = redis.Redis.from_url(stack.broker_url)
    for key in client.scan_iter(f"{STEPS_QUEUE}*"):
        client.delete(key)
    yield client
    client.close()


def _queued_bodies(client: redis.Redis) -> str:
    """The decoded bodies of every message waiting on the steps queue (priorities included)."""
    bodies = []
    for key in client.scan_iter(f"{STEPS_QUEUE}*"):
        for raw in client.lrange(key, 0, -1):
            envelope = json.loads(raw)
            body = envelope["body"]
            if envelope.get("properties", {}).get("body_encoding") == "base64":
                body = base64.b64decode(body).decode()
            bodies.append(body)
    return "\n".join(bodies)


def _submit(runtime: Runtime, profile: dict[str, Any], claim: str) -> uuid.UUID:
    """A job whose step ``claim`` a worker took (a gate parks there), without a worker."""
    from service.engine.claims import claim_step
    from service.engine.steps import StepKey
    from service.engine.submission import JobRequest, submit_job
    from service.platform.clock import utcnow
    from service.platform.db import unit_of_work

    with unit_of_work(runtime.sessions) as session:
        job, _ = submit_job(
            session,
            JobRequest(pipeline=profile, params={}, trigger="cli"),
            owner="default",
            profiles_dir=None,
            known_actions=runtime.registry.names(),
            publish_now=False,
        )
        job_id = job.id
    with unit_of_work(runtime.sessions) as session:
        claim_step(
            session, StepKey(job_id, claim), task_id=f"task-{job_id}", lease_s=30, now=utcnow()
        )
    return job_id


def _cancel(runtime: Runtime, job_id: uuid.UUID) -> None:
    from service.engine.jobs import cancel_job
    from service.platform.clock import utcnow
    from service.platform.db import unit_of_work

    with unit_of_work(runtime.sessions) as session:
        cancel_job(session, job_id, owner=None, now=utcnow())


def test_jobs_approve_sends_the_next_step_to_the_embedded_broker(
    embedded_flowbeat: Cli, runtime: Runtime, broker: redis.Redis
) -> None:
    job_id = _submit(runtime, GATED, "gate")

    done = embedded_flowbeat("jobs", "approve", str(job_id), "gate")

    assert done.returncode == 0, done.stdout + done.stderr
    assert "approved by cli" in done.stdout
    assert str(job_id) in _queued_bodies(broker)


def test_jobs_rerun_sends_the_new_job_to_the_embedded_broker(
    embedded_flowbeat: Cli, runtime: Runtime, broker: redis.Redis
) -> None:
    parent = _submit(runtime, ONE_STEP, "only")
    _cancel(runtime, parent)

    done = embedded_flowbeat("jobs", "rerun", str(parent))

    assert done.returncode == 0, done.stdout + done.stderr
    [new_id] = re.findall(r"job (\S+) queued", done.stdout)
    assert new_id in _queued_bodies(broker)


def test_jobs_cancel_revokes_the_running_step_through_the_embedded_broker(
    embedded_flowbeat: Cli, runtime: Runtime, stack: Stack
) -> None:
    """The revoke is a broadcast (Redis pub/sub on the broker's DB), seen only by a subscriber."""
    job_id = _submit(runtime, ONE_STEP, "only")
    client: redis.Redis = redis.Redis.from_url(stack.broker_url)
    db = client.connection_pool.connection_kwargs.get("db", 0)
    listener = client.pubsub(ignore_subscribe_messages=True)  # type: ignore[no-untyped-call]
    listener.psubscribe(f"/{db}.*")
    try:
        done = embedded_flowbeat("jobs", "cancel", str(job_id))

        assert done.returncode == 0, done.stdout + done.stderr
        assert f"job {job_id}: cancelled" in done.stdout
        assert "no revoke" not in done.stdout
        assert f"task-{job_id}" in _next_broadcast(listener, timeout_s=10)
    finally:
        listener.close()
        client.close()


def _next_broadcast(listener: Any, timeout_s: float) -> str:
    """The body of the first message published on the channels, skipping the confirmations."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        message = listener.get_message(timeout=deadline - time.monotonic())
        if message is not None:
            return base64.b64decode(json.loads(message["data"])["body"]).decode()
    raise AssertionError(f"nothing was broadcast within {timeout_s}s")


def test_the_command_acts_as_the_owner_of_the_dev_key(
    embedded_flowbeat: Cli, runtime: Runtime, tmp_path: Path
) -> None:
    """What a client of ``flowbeat dev``'s key saved is what the command saves over and shows."""
    from service.catalogue.saving import save_pipeline
    from service.platform.db import unit_of_work

    name = f"shared-{uuid.uuid4().hex[:8]}"
    text = f"name: {name}\nsteps:\n  - {{id: s1, action: noop}}\n"
    with unit_of_work(runtime.sessions) as session:
        save_pipeline(
            session,
            owner="dev",
            name=None,
            body=text,
            settings=runtime.settings,
            known_actions=runtime.registry.names(),
        )
    file = tmp_path / f"{name}.yaml"
    file.write_text(text.replace("noop", "noop, timeout_s: 5"))

    saved = embedded_flowbeat("pipelines", "save", str(file))
    listed = embedded_flowbeat("pipelines", "list", "--json")

    assert saved.returncode == 0, saved.stdout + saved.stderr
    assert f"{name} v2" in saved.stdout
    mine = [p for p in json.loads(listed.stdout)["pipelines"] if p["name"] == name]
    assert [(p["owner"], p["version"]) for p in mine] == [("dev", 2)]


@pytest.mark.timeout(180)
def test_a_job_approved_from_the_command_goes_on_at_once_under_flowbeat_dev(
    embedded_env: dict[str, str], embedded_flowbeat: Cli, tmp_path: Path
) -> None:
    """Real processes: ``flowbeat dev``'s worker takes the step the approval made ready from the
    broker the command published to, well before the sweeper's stall check (5 minutes) would
    find it; a publish to any other broker would leave the job waiting here. 90 s: ten
    seconds alone, it took over 30 once in a full parallel run."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    dev = Proc([*EMBEDDED_ARGV, "dev", "--port", str(port)], embedded_env, tmp_path / "dev.out")
    try:
        key = embedded_flowbeat("keys", "create", "--scopes", "admin").stdout.strip()
        api = httpx.Client(
            base_url=f"http://127.0.0.1:{port}", headers={"Authorization": f"Bearer {key}"}
        )
        wait_for(lambda: _answers(api), 60, "flowbeat dev's API")
        submitted = api.post("/v1/jobs", json={"pipeline": GATED, "params": {}})
        assert submitted.status_code == 202, submitted.text
        job_id = submitted.json()["job"]["id"]
        wait_for(lambda: _status(api, job_id) == "awaiting_approval", 60, "the gate")

        done = embedded_flowbeat("jobs", "approve", job_id[:8], "gate")

        assert done.returncode == 0, done.stdout + done.stderr
        assert "broker unreachable" not in done.stdout, "left for the sweeper, not published"
        wait_for(lambda: _status(api, job_id) == "succeeded", 90, "the step after the gate")
    finally:
        dev.popen.send_signal(signal.SIGINT)
        try:
            dev.popen.wait(timeout=60)
        except subprocess.TimeoutExpired:
            dev.kill()


def _answers(api: httpx.Client) -> bool:
    try:
        return api.get("/health").status_code == 200
    except httpx.HTTPError:
        return False


def _status(api: httpx.Client, job_id: str) -> str:
    return str(api.get(f"/v1/jobs/{job_id}").json()["job"]["status"])
