"""The step path's statements find a step's job by its primary key, however stale the planner's
statistics: statistics taken while few jobs were open make the partial indexes of open jobs
look nearly empty, and reading one of those for a job found by its id costs a scan of every
open job at every step (``states.row_test``)."""

import re
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext

import psycopg
import pytest

from service.engine import runner
from service.engine.checkpoints import complete_shard_and_take
from service.engine.claims import fast_shard_claims
from service.engine.runtime import Runtime
from service.engine.shards import FannedOut
from service.engine.steps import StepKey
from service.language.plan import JobPlan
from service.platform.clock import utcnow
from service.platform.db import DirectConnections, libpq_url
from service.platform.models import JobRow
from service.platform.settings import Settings
from service.platform.states import JobStatus
from tests.conftest import Stack
from tests.support.fanouts import fan_profile, submitted
from tests.support.servers import private_database

BACKLOG = 3_000
CHAIN = {
    "name": "lookups",
    "steps": [
        {"id": "a", "action": "noop"},
        {"id": "b", "action": "noop", "depends_on": ["a"]},
        {"id": "c", "action": "noop", "depends_on": ["b"]},
    ],
}
_FILLER = """
INSERT INTO jobs (id, owner, pipeline, profile_hash, params, status, trigger, request_hash)
SELECT gen_random_uuid(), 'filler', 'filler', 'filler', '{}', %s, 'api', 'filler'
  FROM generate_series(1, %s)"""
_JOB_SCANS = re.compile(r"Scan using (\w+) on jobs\b")


@pytest.fixture(scope="module")
def runtime(stack: Stack) -> Iterator[Runtime]:
    """A database of its own, whose statistics of ``jobs`` are stale on purpose: taken while
    no job was open, then a backlog stored without triggers, which autovacuum is kept from
    analysing again."""
    with private_database("flowbeat_lookups") as url:
        with psycopg.connect(libpq_url(url), autocommit=True) as conn:
            conn.execute("ALTER TABLE jobs SET (autovacuum_enabled = false)")
            conn.execute("SET session_replication_role = replica")
            conn.execute(_FILLER, ("succeeded", BACKLOG))
            conn.execute("ANALYZE jobs")
            conn.execute(_FILLER, ("queued", BACKLOG))
        rt = Runtime.start(Settings(database_url=url, broker_url=stack.broker_url))
        yield rt
        rt.sessions.kw["bind"].dispose()


@contextmanager
def _plans(*directs: DirectConnections) -> Iterator[list[str]]:
    """The plan of every statement run on these connections meanwhile (``auto_explain``,
    sent to the client as a notice)."""
    plans: list[str] = []

    def heard(notice: psycopg.errors.Diagnostic) -> None:
        plans.append(notice.message_primary or "")

    for direct in directs:
        with direct.connect() as conn:
            conn.execute("LOAD 'auto_explain'")
            conn.execute("SET auto_explain.log_level = notice")
            conn.execute("SET auto_explain.log_min_duration = 0")
            conn.add_notice_handler(heard)
    try:
        yield plans
    finally:
        for direct in directs:
            with direct.connect() as conn:
                conn.execute("SET auto_explain.log_min_duration = -1")
                conn.remove_notice_handler(heard)


def _job_indexes(plans: list[str]) -> set[str]:
    return {index for plan in plans for index in _JOB_SCANS.findall(plan)}


def _inline(sent: list[JobPlan]) -> runner.Inline:
    return runner.Inline(lambda timeout_s: True, lambda timeout_s: nullcontext(), sent.append)


def test_a_chains_claim_checkpoints_and_success_read_its_job_by_key(runtime: Runtime) -> None:
    key = StepKey(submitted(runtime, CHAIN, {}), "a")

    sent: list[JobPlan] = []
    with _plans(runtime.claims, runtime.checkpoints) as plans:
        runner.run_step(runtime, key, task_id=uuid.uuid4().hex, inline=_inline(sent))

    assert not [plan for plan in sent if plan.steps], "each step followed in this process"
    with runtime.sessions() as session:
        job = session.get(JobRow, key.job_id)
        assert job is not None and job.status == JobStatus.SUCCEEDED
    statements = " ".join(plans)
    assert "WITH claimed AS" in statements
    assert statements.count("WITH done AS") == 3
    assert _job_indexes(plans) == {"pk_jobs"}


def test_a_lanes_shard_statements_read_its_job_by_key(runtime: Runtime) -> None:
    parent = StepKey(submitted(runtime, fan_profile(), {"items": [1, 2, 3]}), "each")
    assert isinstance(runner.run_step(runtime, parent, task_id="fan"), FannedOut)

    with _plans(runtime.claims, runtime.checkpoints) as plans:
        with runtime.claims.connect() as conn:
            (claim,) = fast_shard_claims(
                conn, parent, take=1, task_id="lane", lease_s=60, now=utcnow()
            )
        with runtime.checkpoints.connect() as conn:
            done = complete_shard_and_take(
                conn,
                claim.key,
                claim.lease,
                {"n": 1},
                utcnow(),
                profile=claim.profile,
                task_id="lane",
                lease_s=60,
            )

    assert done.written and done.next_shard is not None
    assert len(plans) == 2
    assert _job_indexes(plans) == {"pk_jobs"}
