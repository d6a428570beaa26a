"""A test's setup that puts rows in a status without running the engine to get there.

The lifecycle trigger (``service.platform.lifecycle``) refuses a status the table does not
allow, so a test cannot set a queued job straight to ``failed``; ``walk`` takes it there one
allowed move at a time, and the event log and dependency triggers see each move as they see
the engine's."""

import uuid
from collections import deque
from typing import Any

from sqlalchemy import ColumnElement, select, update
from sqlalchemy.orm import Session

from service.platform.models import CompensationRow, JobRow, StepRunRow
from service.platform.states import (
    COMPENSATION_TRANSITIONS,
    JOB_TRANSITIONS,
    STEP_TRANSITIONS,
    Transition,
)

Model = type[JobRow] | type[StepRunRow] | type[CompensationRow]
_TABLES: dict[Any, tuple[Transition, ...]] = {
    JobRow: JOB_TRANSITIONS,
    StepRunRow: STEP_TRANSITIONS,
    CompensationRow: COMPENSATION_TRANSITIONS,
}


def path(table: tuple[Transition, ...], start: str, target: str) -> list[str]:
    """The statuses after ``start`` on a shortest way to ``target``, a loop's round reset
    left out."""
    came_from: dict[str, str] = {start: start}
    frontier = deque([start])
    while frontier:
        status = frontier.popleft()
        if status == target:
            way = []
            while status != start:
                way.append(status)
                status = came_from[status]
            return way[::-1]
        for move in table:
            if move.before == status and not move.reopens and move.after not in came_from:
                came_from[move.after] = status
                frontier.append(move.after)
    raise ValueError(f"the lifecycle table has no way from {start} to {target}")


def walk(session: Session, model: Model, *where: ColumnElement[bool], to: str) -> None:
    """Move every row ``where`` selects to status ``to``."""
    statuses = set(session.scalars(select(model.status).where(*where)))
    for start in statuses:
        previous = start
        for status in path(_TABLES[model], start, to):
            session.execute(
                update(model).where(*where, model.status == previous).values(status=status)
            )
            previous = status


def add_job(
    session: Session,
    owner: str,
    status: str,
    *,
    job_id: uuid.UUID | None = None,
    pipeline: str = "dag",
) -> uuid.UUID:
    """A job row with no steps, walked from ``queued`` to ``status``; flushed, not committed."""
    job_id = job_id or uuid.uuid4()
    session.add(
        JobRow(
            id=job_id,
            owner=owner,
            pipeline=pipeline,
            profile_hash="0" * 64,
            params={},
            status="queued",
            trigger="manual",
            request_hash="0" * 64,
        )
    )
    session.flush()
    walk(session, JobRow, JobRow.id == job_id, to=status)
    return job_id
