"""``flowbeat schedules backfill``, ``backfills`` and ``backfill-cancel``: run a cron
schedule's fires over a past range, follow its progress, cancel it whole, as the backfill
routes do. The elected scheduler starts a backfill's fires once its commit wakes it.

``--from`` and ``--to`` take a date or a time; without a zone they are read in the schedule's
time zone, so ``--from 2026-01-01`` means midnight where the schedule fires."""

import uuid
from datetime import datetime
from typing import Annotated, Any

import typer

from service.cli.app import (
    JsonOption,
    OwnerOption,
    acting_owner,
    celery_app,
    cli_actor,
    console,
    emit_json,
    load_settings,
    schedules_cli,
)
from service.cli.schedules import ScheduleOption
from service.cli.tables import print_table
from service.language.cron import zone
from service.platform.db import sessions_of, unit_of_work
from service.platform.errors import BackfillInvalid
from service.triggers.backfills import BackfillFire, BackfillProgress


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def backfill_document(view: BackfillProgress) -> dict[str, Any]:
    """A backfill as ``--json`` prints it: the keys of the API's backfill."""
    row = view.backfill
    return {
        "id": str(row.id),
        "schedule_id": str(row.schedule_id),
        "pipeline": row.pipeline,
        "owner": row.owner,
        "range_from": _iso(row.range_from),
        "range_to": _iso(row.range_to),
        "cron": row.cron,
        "timezone": row.timezone,
        "max_active": row.max_active,
        "status": row.status,
        "total": row.total,
        "started": view.started,
        "skipped": row.skipped,
        "pending": view.pending,
        "open": view.open,
        "jobs": view.jobs,
        "cursor": _iso(row.cursor),
        "created_by": row.created_by,
        "created_at": _iso(row.created_at),
        "finished_at": _iso(row.finished_at),
    }


def _moment(text: str, option: str, timezone: str) -> datetime:
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        raise BackfillInvalid(
            f"{option}: {text!r} is not a date or an ISO 8601 time", {"option": option}
        ) from None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=zone(timezone))


def _progress_cell(doc: dict[str, Any]) -> str:
    done = doc["started"] - doc["open"]
    return f"{done + doc['skipped']}/{doc['total']} ({doc['open']} open, {doc['skipped']} skipped)"


def _print(documents: list[dict[str, Any]]) -> None:
    rows = [
        [
            doc["id"],
            doc["status"],
            f"{doc['range_from'][:16]} .. {doc['range_to'][:16]}",
            _progress_cell(doc),
            ", ".join(f"{status} {n}" for status, n in sorted(doc["jobs"].items())) or "-",
        ]
        for doc in documents
    ]
    headers = ["id", "status", "range (UTC)", "done", "jobs"]
    print_table(headers, rows, whole={"id", "status"}, keep=["done"])


def _print_fires(fires: list[BackfillFire]) -> None:
    rows = [[f.fire_at.isoformat()[:16], f.status, str(f.job_id or "-")] for f in fires]
    print_table(["fire (UTC)", "status", "job"], rows, whole={"job"})


@schedules_cli.command("backfill")
def schedules_backfill(
    name: str,
    start: Annotated[str, typer.Option("--from", help="first fire time covered (inclusive)")],
    end: Annotated[str, typer.Option("--to", help="end of the range (exclusive), not later")],
    max_active: Annotated[int, typer.Option(help="how many of its jobs may be open at once")] = 1,
    schedule: ScheduleOption = None,
    owner: OwnerOption = None,
    as_json: JsonOption = False,
) -> None:
    """One job per fire time of the schedule's cron in the range, in its time zone, oldest
    first; a fire that has run already is skipped."""
    from service.platform.clock import utcnow
    from service.triggers.backfills import BackfillRange, create_backfill, progress
    from service.triggers.schedules import find_schedule

    settings = load_settings()
    who = acting_owner(settings, owner)
    actor = cli_actor(settings, "schedules backfill", owner)
    now = utcnow()
    with unit_of_work(sessions_of(settings)) as session:
        timezone = find_schedule(session, owner=who, pipeline=name, schedule=schedule).timezone
        span = BackfillRange(
            _moment(start, "--from", timezone), _moment(end, "--to", timezone), max_active
        )
        row = create_backfill(
            session,
            owner=who,
            pipeline=name,
            schedule=schedule,
            span=span,
            settings=settings,
            actor=actor,
            now=now,
        )
        document = backfill_document(progress(session, [row])[0])
    if as_json:
        emit_json({"backfill": document})
        return
    console.print(
        f"backfill {document['id']}: {document['total']} fire times, "
        f"at most {document['max_active']} open at once",
        markup=False,
    )


@schedules_cli.command("backfills")
def schedules_backfills(
    name: str,
    backfill: Annotated[
        str | None, typer.Argument(help="one backfill's id: its fires and their jobs")
    ] = None,
    schedule: ScheduleOption = None,
    owner: OwnerOption = None,
    as_json: JsonOption = False,
) -> None:
    """A pipeline's backfills with their progress, newest first, or one with its fires."""
    from service.triggers.backfills import (
        find_backfill,
        fires_of,
        list_backfills,
        pipeline_backfills,
        progress,
    )

    settings = load_settings()
    who = acting_owner(settings, owner)
    with unit_of_work(sessions_of(settings)) as session:
        if backfill is not None:
            row = find_backfill(
                session,
                owner=who,
                pipeline=name,
                schedule=schedule,
                backfill_id=_backfill_id(backfill),
            )
            views = progress(session, [row])
            fires = fires_of(session, row.id)
        elif schedule is not None:
            views = list_backfills(session, owner=who, pipeline=name, schedule=schedule)
        else:
            views = pipeline_backfills(session, owner=who, pipeline=name)
        documents = [backfill_document(view) for view in views]
    if backfill is not None and as_json:
        fire_docs = [
            {"fire_at": _iso(f.fire_at), "job_id": str(f.job_id or "") or None, "status": f.status}
            for f in fires
        ]
        emit_json({"backfill": {**documents[0], "fires": fire_docs}})
    elif as_json:
        emit_json({"backfills": documents})
    else:
        _print(documents)
        if backfill is not None:
            _print_fires(fires)


def _backfill_id(text: str) -> uuid.UUID:
    try:
        return uuid.UUID(text)
    except ValueError:
        raise BackfillInvalid(f"{text!r} is not a backfill id", {"backfill_id": text}) from None


@schedules_cli.command("backfill-cancel")
def schedules_backfill_cancel(
    name: str,
    backfill: Annotated[str, typer.Argument(help="the backfill's id")],
    owner: OwnerOption = None,
) -> None:
    """Start no more of the backfill's fires and cancel its open jobs."""
    from service.engine.runtime import Runtime
    from service.language.plan import JobPlan
    from service.platform.clock import utcnow
    from service.triggers.backfills import cancel_backfill
    from tasks.dispatch import publish_or_defer, revoke_unstarted

    settings = load_settings()
    now = utcnow()
    runtime = Runtime.start(settings)
    with unit_of_work(runtime.sessions) as session:
        row, ended = cancel_backfill(
            session,
            owner=acting_owner(settings, owner),
            pipeline=name,
            schedule=None,
            backfill_id=_backfill_id(backfill),
            actor=cli_actor(settings, "schedules backfill-cancel", owner),
            now=now,
        )
    app = celery_app(settings)
    for job_id in ended.compensate:
        publish_or_defer(app, runtime, JobPlan(job_id, compensate=True))
    console.print(f"backfill {row.id}: cancelled, {len(ended.cancelled)} open jobs cancelled")
    if not revoke_unstarted(app, ended.revoke):
        typer.echo("running steps stop at their next heartbeat (the revoke did not go out)")
