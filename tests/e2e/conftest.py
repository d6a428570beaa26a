"""Real worker and beat processes for end-to-end tests and fault drills."""

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Generator, Iterator, Mapping
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from playwright.sync_api import Browser
from sqlalchemy import func, select

from service.platform.settings import Settings
from tests.conftest import Stack
from tests.support.leftovers import end_earlier_work, forget_earlier_tests

ROOT = Path(__file__).resolve().parents[2]
FINAL = {"succeeded", "failed", "cancelled"}
LOG_TAIL_LINES = 40
"""Of each of its processes' logs, shown with a failed test: a run on CI keeps nothing else."""


def wait_for(predicate: Callable[[], Any], timeout_s: float, what: str) -> Any:
    """Poll a condition instead of sleeping a fixed time; fail with what was awaited."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")


class Proc:
    """A flowbeat process in its own process group, with its output in a log file."""

    def __init__(self, argv: list[str], env: dict[str, str], log: Path) -> None:
        self.log = log
        self.handle = log.open("wb")
        self.popen = subprocess.Popen(
            argv,
            env=env,
            cwd=ROOT,
            stdout=self.handle,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_ready(self, marker: str, timeout_s: float = 30) -> None:
        wait_for(
            lambda: marker in self.output() or self.popen.poll() is not None, timeout_s, marker
        )
        if self.popen.poll() is not None:
            raise AssertionError(f"process exited early:\n{self.output()[-3000:]}")

    def children(self) -> list[int]:
        out = subprocess.run(
            ["pgrep", "-P", str(self.popen.pid)], capture_output=True, text=True, check=False
        ).stdout
        return [int(pid) for pid in out.split()]

    def kill(self) -> None:
        if self.popen.poll() is None:
            os.killpg(self.popen.pid, signal.SIGKILL)
            self.popen.wait(timeout=10)

    def kill_whole(self) -> dict[int, float]:
        """SIGKILL to the main process and its children at once, as an OOM kill, a lost
        machine or a pod deleted without grace does; each pid and when it was killed."""
        pids = [self.popen.pid, *self.children()]
        self.kill()
        return dict.fromkeys(pids, time.time())

    def stop(self) -> None:
        if self.popen.poll() is None:
            os.killpg(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()
        self.handle.close()


def _healthy(base: str) -> bool:
    try:
        return httpx.get(f"{base}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


class Cluster:
    """Starts workers and beat against one stack; stops whatever is left at the end."""

    def __init__(self, stack: Stack, tmp: Path) -> None:
        self.stack = stack
        self.tmp = tmp
        self.procs: list[Proc] = []
        self.env = {**os.environ, **stack.env, "PYTHONPATH": str(ROOT)}

    def worker(self, concurrency: int = 2, **settings: str) -> Proc:
        """A worker; ``settings`` override FLOWBEAT_* values for this process only."""
        name = f"w{len(self.procs)}-{uuid.uuid4().hex[:4]}@%h"
        argv = [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "tasks.app",
            "worker",
            "--pool=prefork",
            f"--concurrency={concurrency}",
            "--loglevel=INFO",
            "-n",
            name,
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
        ]
        env = {**self.env, **{f"FLOWBEAT_{k.upper()}": v for k, v in settings.items()}}
        proc = Proc(argv, env, self.tmp / f"worker-{len(self.procs)}.log")
        self.procs.append(proc)
        proc.wait_ready("ready.")
        return proc

    def beat(self, scheduler: str = "scheduler.beat:FlowbeatScheduler", **settings: str) -> Proc:
        """A beat process as ``flowbeat beat`` runs it; ``settings`` as for ``worker``."""
        schedule = self.tmp / f"beat-{uuid.uuid4().hex[:6]}"
        argv = [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "tasks.app",
            "beat",
            "--loglevel=INFO",
            f"--schedule={schedule}",
            "-S",
            scheduler,
        ]
        env = {**self.env, **{f"FLOWBEAT_{k.upper()}": v for k, v in settings.items()}}
        proc = Proc(argv, env, self.tmp / f"beat-{len(self.procs)}.log")
        self.procs.append(proc)
        proc.wait_ready("beat: Starting")
        return proc

    def api(self, **settings: str) -> str:
        """A live API, as ``flowbeat api`` serves it in production, on a free port; returns its
        base URL."""
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        argv = [sys.executable, "-m", "service.cli", "api", "--host", "127.0.0.1"]
        argv += ["--port", str(port)]
        env = {**self.env, **{f"FLOWBEAT_{k.upper()}": v for k, v in settings.items()}}
        proc = Proc(argv, env, self.tmp / f"api-{len(self.procs)}.log")
        self.procs.append(proc)
        base = f"http://127.0.0.1:{port}"
        wait_for(lambda: _healthy(base) or proc.popen.poll() is not None, 60, "the API")
        if proc.popen.poll() is not None:
            raise AssertionError(f"the API exited early:\n{proc.output()[-3000:]}")
        return base

    def close(self) -> None:
        for proc in self.procs:
            proc.stop()


class Client:
    """Submits jobs through the same service and publish path as the API, and reads them back."""

    def __init__(self, stack: Stack, settings: Settings | None = None) -> None:
        """``settings`` in place of the stack's, for a scenario on a database of its own."""
        from service.engine.runtime import Runtime
        from service.platform.settings import get_settings
        from tasks.app import app

        self.settings = settings or get_settings()
        self.rt = Runtime.start(self.settings)
        self.app = app
        self.counters = redis.Redis.from_url(stack.broker_url.rsplit("/", 1)[0] + "/0")
        self.broker = redis.Redis.from_url(stack.broker_url)

    def submit(self, pipeline: str | Mapping[str, Any], **params: Any) -> uuid.UUID:
        return self.submit_at(None, pipeline, **params)

    def submit_at(
        self,
        priority: int | None,
        pipeline: str | Mapping[str, Any],
        *,
        owner: str = "tests",
        fair_share_ahead: int = 0,
        labels: Mapping[str, str] | None = None,
        refresh: bool = False,
        **params: Any,
    ) -> uuid.UUID:
        """``submit`` with a priority (``None``: the profile's), as ``owner``, taking turns
        with other owners' jobs as the API does with fair share on, with ``labels``, and
        with ``refresh`` taking nothing from the step cache."""
        from service.engine.submission import JobRequest, submit_job
        from service.language.plan import load_plan
        from service.platform.db import unit_of_work
        from tasks.dispatch import publish_new_job

        with unit_of_work(self.rt.sessions) as session:
            job, _ = submit_job(
                session,
                JobRequest(
                    pipeline=pipeline,
                    params=params,
                    priority=priority,
                    labels=labels or {},
                    refresh=refresh,
                ),
                owner=owner,
                profiles_dir=self.settings.profiles_dir,
                known_actions=self.rt.registry.names(),
                fair_share_ahead=fair_share_ahead,
            )
        if job.waiting_for is not None:
            return job.id
        with unit_of_work(self.rt.sessions) as session:
            plan = load_plan(session, job.id)
        assert plan is not None
        publish_new_job(self.app, self.rt, plan)
        return job.id

    def rerun(self, parent: uuid.UUID, request: Any) -> uuid.UUID:
        """Rerun through the same service call and publish path as the rerun route."""
        from service.engine.reruns import rerun_job
        from service.language.plan import load_plan
        from service.platform.clock import utcnow
        from service.platform.db import unit_of_work
        from tasks.dispatch import publish_new_job

        with unit_of_work(self.rt.sessions) as session:
            job_id = rerun_job(session, parent, request, visible_to=None, now=utcnow()).id
        with unit_of_work(self.rt.sessions) as session:
            plan = load_plan(session, job_id)
        assert plan is not None
        publish_new_job(self.app, self.rt, plan)
        return job_id

    def decide(self, job_id: uuid.UUID, step_id: str, *, approve: bool, **given: Any) -> Any:
        """Decide through the same service call and publish path as the approval routes."""
        from service.engine.approvals import decide
        from service.platform.clock import utcnow
        from service.platform.db import unit_of_work
        from tasks.dispatch import publish_or_defer

        with unit_of_work(self.rt.sessions) as session:
            decided = decide(
                session,
                job_id,
                step_id,
                approve=approve,
                by="tests",
                visible_to=None,
                now=utcnow(),
                **given,
            )
        publish_or_defer(self.app, self.rt, decided.ready)
        return decided.approval

    def cancel(self, job_id: uuid.UUID) -> None:
        """Cancel as the route does, sending the job's compensations and revoking its tasks
        after the commit."""
        from service.engine.jobs import cancel_job
        from service.language.plan import JobPlan
        from service.platform.clock import utcnow
        from service.platform.db import unit_of_work
        from tasks.dispatch import publish_or_defer, revoke_unstarted

        with unit_of_work(self.rt.sessions) as session:
            _, running = cancel_job(session, job_id, owner=None, now=utcnow())
        publish_or_defer(self.app, self.rt, JobPlan(job_id, compensate=True))
        revoke_unstarted(self.app, running)

    def view(self, job_id: uuid.UUID) -> Any:
        from service.engine.jobs import get_job, job_view
        from service.platform.db import unit_of_work

        with unit_of_work(self.rt.sessions) as session:
            return job_view(session, get_job(session, job_id))

    def steps(self, job_id: uuid.UUID) -> dict[str, Any]:
        return {step.step_id: step for step in self.view(job_id).steps}

    def wait_final(self, job_id: uuid.UUID, timeout_s: float = 60) -> Any:
        return wait_for(
            lambda: (v := self.view(job_id)).job.status in FINAL and v,
            timeout_s,
            f"job {job_id} to finish",
        )

    def settled_at(self, job_ids: list[uuid.UUID]) -> float | None:
        """When the last of the jobs, and of their compensations, finished; ``None`` while one
        is open. A saga's job fails before its compensations have run."""
        from service.platform.db import unit_of_work
        from service.platform.models import CompensationRow, JobRow

        with unit_of_work(self.rt.sessions) as session:
            jobs = session.execute(
                select(JobRow.status, JobRow.finished_at).where(JobRow.id.in_(job_ids))
            ).all()
            undone = session.execute(
                select(CompensationRow.status, CompensationRow.finished_at).where(
                    CompensationRow.job_id.in_(job_ids)
                )
            ).all()
        if len(jobs) < len(set(job_ids)) or any(status not in FINAL for status, _ in jobs):
            return None
        if any(status in ("pending", "running") for status, _ in undone):
            return None
        ends = [end.timestamp() for _, end in [*jobs, *undone] if end is not None]
        return max(ends, default=0.0)

    def count(self, job_id: uuid.UUID, name: str, what: str = "finished") -> int:
        raw = self.counters.get(f"drill:{job_id}:{name}:{what}")
        return int(raw) if raw else 0

    def checkpoints(self, job_id: uuid.UUID, step_id: str) -> int:
        from service.platform.db import unit_of_work
        from service.platform.models import StepRunRow

        with unit_of_work(self.rt.sessions) as session:
            return int(
                session.scalar(
                    select(func.count())
                    .select_from(StepRunRow)
                    .where(
                        StepRunRow.job_id == job_id,
                        StepRunRow.output.is_not(None),
                        StepRunRow.step_id == step_id,
                    )
                )
                or 0
            )

    def task_id(self, job_id: uuid.UUID, step_id: str) -> str:
        from service.platform.db import unit_of_work
        from service.platform.models import StepRunRow

        with unit_of_work(self.rt.sessions) as session:
            return str(
                session.scalar(
                    select(StepRunRow.task_id).where(
                        StepRunRow.job_id == job_id, StepRunRow.step_id == step_id
                    )
                )
            )

    def close(self) -> None:
        self.counters.close()
        self.broker.close()


@pytest.fixture(scope="session")
def client(stack: Stack) -> Iterator[Client]:
    client = Client(stack)
    yield client
    client.close()


@pytest.fixture
def cluster(stack: Stack, client: Client, tmp_path: Path) -> Iterator[Cluster]:
    """Processes of this test only, on a broker DB cleared of earlier tests' leftovers
    (``forget_earlier_tests``) and a database where earlier tests' jobs are all over and their
    schedules disabled (``end_earlier_work``): a beat's sweeper sends every open job again, and
    it fires every due schedule, so earlier tests' work would take this one's workers."""
    end_earlier_work(client.rt.sessions)
    broker = redis.Redis.from_url(stack.broker_url)
    try:
        forget_earlier_tests(broker)
    finally:
        broker.close()
    cluster = Cluster(stack, tmp_path)
    yield cluster
    cluster.close()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item,
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A failed test's report ends with the last lines of its workers', beats' and APIs'
    logs, read while they still run."""
    report = yield
    if report.when == "call" and report.failed:
        for proc in _procs_of(item):
            lines = proc.output().splitlines()[-LOG_TAIL_LINES:]
            report.sections.append((f"{proc.log.name}, last {len(lines)} lines", "\n".join(lines)))
    return report


def _procs_of(item: pytest.Item) -> list["Proc"]:
    found: list[Proc] = []
    for value in getattr(item, "funcargs", {}).values():
        if isinstance(value, Cluster):
            found.extend(value.procs)
        elif isinstance(value, Proc):
            found.append(value)
    return found


@pytest.fixture(scope="module")
def shared_worker(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    cluster = Cluster(stack, tmp_path_factory.mktemp("shared"))
    worker = cluster.worker()
    yield worker
    cluster.close()


CHROMIUM = Path("/usr/bin/chromium")
needs_chromium = pytest.mark.skipif(
    not CHROMIUM.exists(), reason="needs Debian's chromium (.ci/run installs it)"
)


@pytest.fixture
def browser() -> Iterator[Browser]:
    """Headless Chromium from Debian's package, driven by Playwright (which downloads none)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as driver:
        launched = driver.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
        yield launched
        launched.close()
