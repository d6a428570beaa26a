"""Running a failed job's compensations: each claimed in reverse order of completion, its action
called, its outcome recorded with a retry when attempts are left."""

import uuid
from datetime import datetime

from sqlalchemy.orm import Session

from service.actions import StepContext
from service.engine.attempt import Failure, error_of, retry_in_s
from service.engine.compensations import (
    Busy,
    CompensationClaim,
    Due,
    claim_next,
    idempotency_key,
    next_due,
    record_outcome,
)
from service.engine.leases import release_compensation, renew_compensation
from service.engine.runtime import Runtime
from service.language.snapshots import job_profile
from service.platform import logs
from service.platform.clock import utcnow
from service.platform.db import unit_of_work
from service.platform.errors import ActionError, RetryLater
from service.platform.models import JobRow


def run_compensation(
    rt: Runtime,
    job_id: uuid.UUID,
    step_id: str | None,
    timeout_errors: tuple[type[BaseException], ...] = (),
) -> Due | None:
    """Run the compensation ``step_id`` of an ended job if it is the next one; returns the
    one to send a message for next, if any."""
    with logs.bound(job_id=str(job_id), step_id=step_id):
        with unit_of_work(rt.sessions) as session:
            job = session.get(JobRow, job_id)
            if job is None:
                return None
            profile = job_profile(job)
            claim = claim_next(session, job, profile, step_id, rt.settings.lease_s, utcnow())
        if isinstance(claim, Busy):
            raise RetryLater(claim.retry_in_s, "the next compensation is held by a live lease")
        if not isinstance(claim, CompensationClaim):
            return claim
        with logs.bound(step_id=claim.step_id, attempt=claim.attempt):
            _compensate(rt, claim, timeout_errors)
            with unit_of_work(rt.sessions) as session:
                return next_due(session, job_id, profile)


def _compensate(
    rt: Runtime, claim: CompensationClaim, timeout_errors: tuple[type[BaseException], ...]
) -> None:
    """One attempt of a claimed compensation, and its outcome recorded; ``RetryLater`` when it
    is to be tried again."""
    try:
        failure = _undo(rt, claim, timeout_errors)
    except BaseException:
        with unit_of_work(rt.sessions) as session:
            release_compensation(session, claim.job_id, claim.step_id, claim.token, utcnow())
        raise
    error = None if failure is None else failure.error
    delay = None if failure is None else retry_in_s(claim.spec.retry, claim.attempt, failure)
    with unit_of_work(rt.sessions) as session:
        record_outcome(session, claim, error, delay, utcnow())
    if error is not None and delay is not None:
        raise RetryLater(delay, f"compensation of {claim.step_id} failed: {error['message']}")


def _undo(
    rt: Runtime, claim: CompensationClaim, timeout_errors: tuple[type[BaseException], ...]
) -> Failure | None:
    ctx = StepContext(
        job_id=str(claim.job_id),
        step_id=claim.step_id,
        attempt=claim.attempt,
        shard=None,
        params=claim.params,
        settings=rt.settings,
        idempotency_key=idempotency_key(claim.job_id, claim.step_id),
    )

    def held(session: Session, lease_s: float, now: datetime) -> bool:
        return renew_compensation(session, claim.job_id, claim.step_id, claim.token, lease_s, now)

    try:
        with rt.heartbeats.hold_lease(held, ctx.cancel_event):
            rt.registry.call(claim.spec.action, ctx, claim.inputs)
    except ActionError as exc:
        return Failure(error_of(exc.code, exc.message, exc.details), exc.retryable)
    except timeout_errors as exc:
        return Failure(error_of("timeout", f"compensation timed out: {exc!r}", {}), True)
    except Exception as exc:
        kind = type(exc).__name__
        return Failure(error_of("exception", f"{kind}: {exc}", {"type": kind}), True)
    return None
