"""The matcher reads the event log by cursor: each event that a rule matches is queued once,
also when its transaction commits after a later one's, and a dedupe window per subject holds
back the rest of a burst while counting it."""

import uuid
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import insert

from service.alerts.matching import LogEvent, candidate_of, match_events
from service.alerts.offers import Offered
from service.engine.runtime import Runtime
from service.platform.clock import utcnow
from service.platform.db import unit_of_work
from service.platform.models import AlertRuleRow, JobEventRow, JobRow
from tests.service.alerts.support import failed_job, one_step, outbox, rule
from tests.support.fanouts import submitted


def _match(rt: Runtime) -> int:
    with unit_of_work(rt.sessions) as session:
        return match_events(session, utcnow()).queued


def _owned(rt: Runtime, owner: str, *, dedupe_s: int = 0, **body: Any) -> uuid.UUID:
    return rule(rt, owner, dedupe_s=dedupe_s, **body).rule.id


def test_a_failed_job_is_queued_once_for_its_owners_rule_and_never_again(runtime: Runtime) -> None:
    _match(runtime)
    job = failed_job(runtime)
    mine = _owned(runtime, job.owner)
    others = _owned(runtime, f"other-{uuid.uuid4().hex[:6]}")

    _match(runtime)
    _match(runtime)

    [queued] = outbox(runtime, mine)
    assert queued.status == "pending" and queued.subject == f"pipeline:{job.pipeline}"
    assert queued.payload["job_id"] == str(job.id)
    assert queued.payload["error"]["code"] == "boom"
    assert outbox(runtime, others) == []


def test_an_event_committed_after_a_later_one_was_read_is_still_queued_once(
    runtime: Runtime,
) -> None:
    """Ids are taken at insert: the late transaction's event has the lower id, yet the reader
    has moved past the higher one. The skipped id is kept until its transaction is over."""
    _match(runtime)
    early = submitted(runtime, one_step("late"), {})
    with unit_of_work(runtime.sessions) as session:
        job = session.get(JobRow, early)
        assert job is not None
        rule_id = _owned(runtime, job.owner)
    late = runtime.sessions()
    late.begin()
    late.execute(
        insert(JobEventRow).values(
            job_id=early, kind="job.failed", data={"error": {"code": "boom", "message": "x"}}
        )
    )
    late.flush()
    try:
        other = failed_job(runtime)
        _owned(runtime, other.owner, name="other")
        _match(runtime)
        assert outbox(runtime, rule_id) == []
        late.commit()
    finally:
        late.close()

    _match(runtime)
    _match(runtime)

    [queued] = outbox(runtime, rule_id)
    assert queued.payload["job_id"] == str(early)


def test_each_event_of_a_row_that_holds_several_is_its_own_alert(runtime: Runtime) -> None:
    """A statement's events share a row (ADR 20): those before the row's last are matched as
    well, each under its own key."""
    _match(runtime)
    job = failed_job(runtime)
    rule_id = _owned(runtime, job.owner, dedupe_s=0)
    failure = {"kind": "job.failed", "step_id": None, "data": {"error": {"code": "early"}}}
    with unit_of_work(runtime.sessions) as session:
        session.execute(
            insert(JobEventRow).values(
                job_id=job.id,
                kind="job.failed",
                data={"error": {"code": "late"}},
                more=[failure, {"kind": "step.running", "step_id": "a", "data": {}}],
            )
        )

    _match(runtime)
    _match(runtime)

    codes = sorted(queued.payload["error"]["code"] for queued in outbox(runtime, rule_id))
    assert codes == ["boom", "early", "late"]


def test_a_burst_of_failures_of_one_pipeline_sends_one_alert_counting_the_rest(
    runtime: Runtime,
) -> None:
    _match(runtime)
    first = failed_job(runtime)
    rule_id = _owned(runtime, first.owner, dedupe_s=300)
    with unit_of_work(runtime.sessions) as session:
        session.execute(
            insert(JobEventRow),
            [{"job_id": first.id, "kind": "job.failed", "data": {}} for _ in range(3)],
        )

    _match(runtime)

    [queued] = outbox(runtime, rule_id)
    assert queued.suppressed == 3


def test_without_a_window_every_failure_is_its_own_alert(runtime: Runtime) -> None:
    _match(runtime)
    first = failed_job(runtime)
    rule_id = _owned(runtime, first.owner, dedupe_s=0)
    with unit_of_work(runtime.sessions) as session:
        session.execute(insert(JobEventRow).values(job_id=first.id, kind="job.failed", data={}))

    _match(runtime)

    assert len(outbox(runtime, rule_id)) == 2


def _event(kind: str, data: dict[str, object], step_id: str | None = None) -> LogEvent:
    at = datetime(2026, 11, 29, tzinfo=UTC)
    return LogEvent(7, "7", kind, str(uuid.uuid4()), step_id, data, at, "acme", "papers")


def _rule(kind: str, threshold: int | None = None, pipeline: str | None = None) -> AlertRuleRow:
    return AlertRuleRow(owner="acme", name="r", kind=kind, threshold=threshold, pipeline=pipeline)


def test_a_deadline_rule_takes_only_failures_by_job_timeout() -> None:
    timeout = _event("job.failed", {"error": {"code": "job_timeout", "message": "late"}})
    other = _event("job.failed", {"error": {"code": "boom"}})

    assert candidate_of(_rule("deadline_passed"), timeout) is not None
    assert candidate_of(_rule("deadline_passed"), other) is None
    assert candidate_of(_rule("job_failed"), timeout) is not None


def test_a_retry_rule_takes_retries_past_its_threshold_per_step() -> None:
    third = _event("step.retrying", {"attempt": 3}, step_id="fetch")
    second = _event("step.retrying", {"attempt": 2}, step_id="fetch")

    matched = candidate_of(_rule("step_retried", threshold=2), third)

    assert matched is not None and matched.subject == "step:papers:fetch"
    assert candidate_of(_rule("step_retried", threshold=2), second) is None


def test_an_escalation_is_its_own_subject_and_a_pipeline_filter_holds() -> None:
    escalated = _event("approval.escalated", {}, step_id="ship")

    matched = candidate_of(_rule("approval_escalated"), escalated)

    assert matched is not None and matched.subject == f"approval:{escalated.job_id}:ship"
    assert candidate_of(_rule("approval_escalated", pipeline="other"), escalated) is None
    assert candidate_of(_rule("job_failed"), escalated) is None


def test_a_pass_stops_at_its_batch_and_the_next_one_reads_on(runtime: Runtime) -> None:
    _match(runtime)
    job = failed_job(runtime)
    rule_id = _owned(runtime, job.owner)
    with unit_of_work(runtime.sessions) as session:
        session.execute(
            insert(JobEventRow), [{"job_id": job.id, "kind": "job.failed", "data": {}}] * 3
        )

    passes: list[Offered] = []
    while not passes or passes[-1].more:
        with unit_of_work(runtime.sessions) as session:
            passes.append(match_events(session, utcnow(), limit=2))

    assert len(passes) >= 3
    assert sum(p.queued for p in passes) == len(outbox(runtime, rule_id)) == 4
