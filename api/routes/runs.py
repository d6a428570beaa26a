"""Run history of a pipeline and the diff of a run against the previous successful one."""

import uuid
from typing import Annotated, Any

from fastapi import APIRouter, Path, Query
from pydantic import BaseModel

from api.deps import Reader, SessionDep
from api.openapi import errors
from api.schemas import UtcDatetime
from service.catalogue.diffs import DiffKind, diff_counts, diff_page
from service.engine.filters import JobFilter
from service.engine.jobs import get_job, list_jobs
from service.language.specs import NAME_PATTERN
from service.platform.auth import Principal
from service.platform.constants import (
    DIFF_PAGE_DEFAULT_LIMIT,
    DIFF_PAGE_MAX_LIMIT,
    JOB_LIST_DEFAULT_LIMIT,
    JOB_LIST_MAX_LIMIT,
)
from service.platform.errors import JobNotFound
from service.platform.models import JobRow

router = APIRouter(tags=["runs"])


class RunPublic(BaseModel):
    job_id: uuid.UUID
    trigger: str
    status: str
    created_at: UtcDatetime
    started_at: UtcDatetime | None
    finished_at: UtcDatetime | None
    item_count: int | None
    new_count: int | None
    removed_count: int | None
    no_new_items: bool

    @classmethod
    def of(cls, job: JobRow) -> "RunPublic":
        return cls(
            job_id=job.id,
            trigger=job.trigger,
            status=job.status,
            created_at=job.created_at,
            started_at=job.started_at,
            finished_at=job.finished_at,
            item_count=job.item_count,
            new_count=job.new_count,
            removed_count=job.removed_count,
            no_new_items=bool(job.diff_mode and job.new_count == 0),
        )


class RunList(BaseModel):
    runs: list[RunPublic]
    next_cursor: str | None


class DiffCountsPublic(BaseModel):
    new: int
    removed: int
    unchanged: int


class DiffPublic(BaseModel):
    job_id: uuid.UUID
    previous_job_id: uuid.UUID | None
    kind: DiffKind
    counts: DiffCountsPublic
    items: list[Any]
    next_cursor: str | None


def _visible_to(principal: Principal) -> str | None:
    return None if principal.has("admin") else principal.owner


@router.get(
    "/v1/pipelines/{name}/runs",
    response_model=RunList,
    responses=errors({400: "invalid_query, invalid_cursor"}),
)
def pipeline_runs(
    name: Annotated[str, Path(pattern=NAME_PATTERN)],
    principal: Reader,
    session: SessionDep,
    limit: Annotated[int, Query(ge=1, le=JOB_LIST_MAX_LIMIT)] = JOB_LIST_DEFAULT_LIMIT,
    cursor: Annotated[str | None, Query(max_length=512)] = None,
) -> RunList:
    """Newest first, with each run's item counts against the run before it."""
    jobs, next_cursor = list_jobs(
        session,
        owner=_visible_to(principal),
        match=JobFilter(pipeline=name),
        limit=limit,
        cursor=cursor or None,
    )
    return RunList(runs=[RunPublic.of(job) for job in jobs], next_cursor=next_cursor)


@router.get(
    "/v1/jobs/{job_id}/diff",
    response_model=DiffPublic,
    responses=errors(
        {
            400: "invalid_query, invalid_cursor",
            404: "job_not_found",
            410: "job_expired: pruned by retention (details: pruned_at, finished_at)",
            409: "no_result_items: the job stored no result items to compare",
        }
    ),
)
def job_diff(
    job_id: str,
    principal: Reader,
    session: SessionDep,
    kind: DiffKind = DiffKind.NEW,
    limit: Annotated[int, Query(ge=1, le=DIFF_PAGE_MAX_LIMIT)] = DIFF_PAGE_DEFAULT_LIMIT,
    cursor: Annotated[str | None, Query(max_length=1024)] = None,
) -> DiffPublic:
    """Counts of all three kinds, and one page of the items of ``kind``, ordered by key."""
    try:
        parsed = uuid.UUID(job_id)
    except ValueError:
        raise JobNotFound(f"no job {job_id}", {"job_id": job_id}) from None
    job = get_job(session, parsed, owner=_visible_to(principal))
    counts = diff_counts(session, job)
    page = diff_page(session, job, kind, limit=limit, cursor=cursor or None)
    return DiffPublic(
        job_id=job.id,
        previous_job_id=job.previous_job_id,
        kind=kind,
        counts=DiffCountsPublic(**counts.as_dict()),
        items=page.items,
        next_cursor=page.next_cursor,
    )
