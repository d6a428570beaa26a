"""Step concurrency keys: at most ``limit`` steps with the same key running at once, across
every job (a rate-limited service, a licence, a GPU).

A step with a key takes its lease as any step does, then asks for a slot under the key's
advisory lock (migration 0028): while fewer than ``limit`` steps of the key run with a live
lease, and none waits ahead of it, it keeps its lease and runs. Otherwise it gives its lease
back and waits ``awaiting_slot``, holding no worker and no message. When a step of the key
stops running, PostgreSQL wakes the beat leader, which lets in the oldest waiting steps (kept a
slot each, ``slot_reserved``) and sends them; the leader also looks every fraction of a second
while steps wait, since a slot also frees when a killed worker's lease lapses, which nothing
announces. Whoever is let in takes the slot kept for it, so no newcomer takes it in between.
"""

import uuid
from datetime import datetime

from sqlalchemy import text
from sqlalchemy.orm import Session

from service.engine.steps import StepKey
from service.language.expressions import CONCURRENCY_ROOTS, ExprContext, resolve
from service.language.plan import JobPlan, steps_plan
from service.language.snapshots import job_profile
from service.language.specs import StepSpec
from service.platform.models import JobRow
from service.platform.states import StepStatus

_TAKE = text("SELECT flowbeat_take_step_slot(:key, :limit, :job, :step, :at)")
_LET_IN = text("SELECT let_job, let_step FROM flowbeat_let_in_steps(:at)")
_ANY_WAITING = text(f"SELECT 1 FROM step_runs WHERE status = '{StepStatus.AWAITING_SLOT}' LIMIT 1")


def step_key(spec: StepSpec, params: dict[str, object]) -> str | None:
    """A step's key is the same across jobs and owners: it names what they share."""
    if spec.concurrency is None:
        return None
    value = resolve(spec.concurrency.key, ExprContext(params=params, outputs={}), CONCURRENCY_ROOTS)
    return str(value)


def take_step_slot(
    session: Session, key: StepKey, spec: StepSpec, params: dict[str, object], now: datetime
) -> bool:
    """Whether the step, whose lease this worker holds, may run now; when not, it waits for a
    slot without its lease, its attempt not counted."""
    slot = step_key(spec, params)
    if slot is None or spec.concurrency is None:
        return True
    values = {
        "key": slot,
        "limit": spec.concurrency.limit,
        "job": key.job_id,
        "step": key.step_id,
        "at": now,
    }
    taken = bool(session.execute(_TAKE, values).scalar_one())
    session.expire_all()
    return taken


def let_in_steps(session: Session, now: datetime) -> list[JobPlan]:
    """The steps whose turn for a slot came, as plans of their jobs at their priorities, to
    send once the caller has committed."""
    by_job: dict[uuid.UUID, list[str]] = {}
    for job_id, step_id in session.execute(_LET_IN, {"at": now}):
        by_job.setdefault(job_id, []).append(step_id)
    plans = []
    for job_id, step_ids in by_job.items():
        job = session.get(JobRow, job_id)
        if job is not None:
            plans.append(steps_plan(job_profile(job), job_id, step_ids).at(job.priority))
    return plans


def steps_waiting(session: Session) -> bool:
    return session.execute(_ANY_WAITING).first() is not None
