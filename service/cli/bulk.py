"""The job filter's options, which ``jobs list``, ``jobs cancel`` and ``jobs rerun`` share, and
the bulk cancel and rerun they start: the matching jobs counted and confirmed first, then
changed in batches as ``POST /v1/jobs/cancel`` and ``/v1/jobs/rerun`` do."""

import uuid
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated

import typer

from service.cli.app import celery_app, cli_actor, console, load_settings
from service.platform.db import unit_of_work
from service.platform.states import JobStatus

if TYPE_CHECKING:
    from service.engine.bulk import BulkKind
    from service.engine.filters import JobFilter

PipelineOption = Annotated[str | None, typer.Option(help="only jobs of this pipeline")]
StatusOption = Annotated[
    JobStatus | None, typer.Option(case_sensitive=False, help="only jobs with this status")
]
LabelOption = Annotated[
    list[str] | None,
    typer.Option(
        "--label", metavar="KEY=VALUE", help="only jobs with this label (repeat: every one)"
    ),
]
ErrorCodeOption = Annotated[
    str | None, typer.Option(help="only jobs whose error has this code, e.g. http_status")
]
SinceOption = Annotated[
    datetime | None, typer.Option(help="only jobs created at or after this time (UTC if no zone)")
]
UntilOption = Annotated[
    datetime | None, typer.Option(help="only jobs created before this time (UTC if no zone)")
]
YesOption = Annotated[bool, typer.Option("--yes", "-y", help="do not ask for confirmation")]
BulkIdOption = Annotated[
    str | None,
    typer.Option(
        "--id", metavar="UUID", help="the bulk action's id: give an earlier one's to go on with it"
    ),
]


def in_utc(moment: datetime | None) -> datetime | None:
    """A time typed without a zone is read as UTC, as the tables show times."""
    if moment is None or moment.tzinfo is not None:
        return moment
    return moment.replace(tzinfo=UTC)


def job_filter(
    pipeline: str | None,
    status: JobStatus | None,
    label: list[str] | None,
    error_code: str | None,
    since: datetime | None,
    until: datetime | None,
    parent: uuid.UUID | None = None,
) -> "JobFilter":
    from service.engine.filters import JobFilter
    from service.language.labels import parse_labels

    return JobFilter(
        pipeline=pipeline,
        statuses=(JobStatus(status).value,) if status else (),
        labels=parse_labels(label or []),
        error_code=error_code,
        since=in_utc(since),
        until=in_utc(until),
        parent=parent,
    )


def refuse_json_for_bulk(as_json: bool) -> None:
    """``--json`` prints one job; a bulk action prints its id and its progress, which
    ``GET /v1/jobs/bulk/{id}`` gives as JSON."""
    if as_json:
        raise typer.BadParameter("--json shows one job: name a JOB, or drop --json for a filter")


def run_bulk(
    kind: "BulkKind",
    match: "JobFilter",
    *,
    yes: bool,
    bulk_id: str | None,
    from_step: str | None = None,
    priority: int | None = None,
) -> None:
    """Count the jobs, ask, then act; the action's id is printed before it starts, so one cut
    short is taken up again with ``--id``."""
    from service.engine.bulk import BulkRequest, get_bulk, preview, start_bulk
    from service.engine.runtime import Runtime
    from service.platform.clock import utcnow
    from tasks.bulk import BulkRun

    settings = load_settings()
    rt = Runtime.start(settings)
    request = BulkRequest(kind, match, from_step, priority)
    with unit_of_work(rt.sessions) as session:
        count, _ = preview(session, request, scope=None, now=utcnow())
    if bulk_id is None and count == 0:
        console.print(f"no job to {kind}")
        return
    if not yes and not typer.confirm(f"{kind} {count} jobs?"):
        raise typer.Abort()
    actor = cli_actor(settings, f"jobs {kind}")
    action_id = uuid.uuid4() if bulk_id is None else uuid.UUID(bulk_id)
    with unit_of_work(rt.sessions) as session:
        start_bulk(session, action_id, request, scope=None, actor=actor, now=utcnow())
    console.print(f"bulk {kind} {action_id}", markup=False)
    BulkRun(celery_app(settings), rt, settings).run(action_id, actor)
    with unit_of_work(rt.sessions) as session:
        done = get_bulk(session, action_id, scope=None)
        console.print(f"{kind}: {done.acted} jobs, {done.skipped} skipped", markup=False)
