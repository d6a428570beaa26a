"""A job's relations, as the API, the dashboard and the CLI show them: the job it came from and
how, and the children its ``pipeline.run`` steps started.

``jobs.parent_job_id`` names the job a rerun reruns (trigger ``rerun``) or the job whose success
started it (trigger ``dependency``); it stays empty on a child (trigger ``parent``), whose
caller ``child_calls`` records with the step and attempt that started it. ``Parent.relation``
says which of the three a link is, so that no reader has to know that the column serves two of
them and the table the third. A rerun that took over the child of the job it reruns lists that
child among its own: its call recorded it.
"""

import uuid
from dataclasses import dataclass, field

from sqlalchemy import ColumnElement, or_, select
from sqlalchemy.orm import Session

from service.platform.constants import TRIGGER_DEPENDENCY, TRIGGER_PARENT, TRIGGER_RERUN
from service.platform.models import ChildCallRow, JobRow

RELATION_RERUN = "rerun"
"""The job reruns its parent."""
RELATION_DEPENDENCY = "dependency"
"""The parent's success started the job (a dependency trigger)."""
RELATION_CHILD = "child"
"""A ``pipeline.run`` step of the parent started the job."""
_RELATION_OF_TRIGGER = {TRIGGER_RERUN: RELATION_RERUN, TRIGGER_DEPENDENCY: RELATION_DEPENDENCY}


@dataclass(frozen=True)
class Parent:
    job_id: uuid.UUID
    relation: str
    step_id: str | None = None
    """The parent's step that started a child; ``None`` for the other relations."""


@dataclass(frozen=True)
class Child:
    """A child job one attempt of a ``pipeline.run`` step started."""

    job_id: uuid.UUID
    step_id: str
    attempt: int
    pipeline: str
    status: str


@dataclass(frozen=True)
class Family:
    parent: Parent | None = None
    children: list[Child] = field(default_factory=list)
    """Oldest call first; a call not started yet, or whose child retention pruned, is left
    out."""

    def children_of(self, step_id: str) -> list[Child]:
        return [child for child in self.children if child.step_id == step_id]


def job_family(session: Session, job: JobRow) -> Family:
    return Family(_parent(session, job), _children(session, job.id))


def _parent(session: Session, job: JobRow) -> Parent | None:
    if job.trigger == TRIGGER_PARENT:
        caller = session.execute(
            select(ChildCallRow.job_id, ChildCallRow.step_id)
            .where(ChildCallRow.child_job_id == job.id)
            .order_by(ChildCallRow.created_at)
            .limit(1)
        ).first()
        return None if caller is None else Parent(caller[0], RELATION_CHILD, caller[1])
    if job.parent_job_id is None:
        return None
    return Parent(job.parent_job_id, _RELATION_OF_TRIGGER.get(job.trigger, job.trigger))


def _children(session: Session, job_id: uuid.UUID) -> list[Child]:
    rows = session.execute(
        select(
            ChildCallRow.child_job_id,
            ChildCallRow.step_id,
            ChildCallRow.attempt,
            JobRow.pipeline,
            JobRow.status,
        )
        .join(JobRow, JobRow.id == ChildCallRow.child_job_id)
        .where(ChildCallRow.job_id == job_id)
        .order_by(ChildCallRow.created_at, ChildCallRow.step_id, ChildCallRow.attempt)
    )
    return [
        Child(child_id, step_id, attempt, pipeline, status)
        for child_id, step_id, attempt, pipeline, status in rows
        if child_id is not None
    ]


def came_from(parent_id: uuid.UUID) -> ColumnElement[bool]:
    """The jobs whose parent is ``parent_id``, in any relation: for ``GET /v1/jobs?parent=``."""
    called = select(ChildCallRow.child_job_id).where(
        ChildCallRow.job_id == parent_id, ChildCallRow.child_job_id.is_not(None)
    )
    return or_(JobRow.parent_job_id == parent_id, JobRow.id.in_(called))
