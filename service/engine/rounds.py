"""What the rounds of a loop left behind, read by claims (``loop.*`` references) and views."""

import uuid
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.language.profiles import Profile
from service.platform.constants import SHARD_NONE
from service.platform.models import StepRoundRow, StepRunRow


def loop_context(
    session: Session, job_id: uuid.UUID, step_id: str, profile: Profile
) -> dict[str, Any]:
    """``loop.round`` and ``loop.previous`` for a step of a loop; empty outside loops."""
    loop = profile.loop_of(step_id)
    if loop is None:
        return {}
    current = session.scalar(
        select(StepRunRow.round).where(
            StepRunRow.job_id == job_id,
            StepRunRow.step_id == step_id,
            StepRunRow.shard == SHARD_NONE,
        )
    )
    assert current is not None
    previous = session.execute(
        select(StepRoundRow.step_id, StepRoundRow.output).where(
            StepRoundRow.job_id == job_id,
            StepRoundRow.step_id.in_(loop.steps),
            StepRoundRow.round == current - 1,
        )
    )
    return {"round": current, "previous": {step: output for step, output in previous}}


def rounds_of(session: Session, job_id: uuid.UUID) -> dict[str, list[StepRoundRow]]:
    """Every finished round of a job's loop steps, by step, oldest first."""
    rows = session.scalars(
        select(StepRoundRow)
        .where(StepRoundRow.job_id == job_id)
        .order_by(StepRoundRow.step_id, StepRoundRow.round)
    )
    found: dict[str, list[StepRoundRow]] = {}
    for row in rows:
        found.setdefault(row.step_id, []).append(row)
    return found
