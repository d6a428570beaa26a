"""``flowbeat schedules``: list, show, pause, resume and delete, as the schedule routes do; the
elected scheduler is woken by each change when it commits."""

from typing import Annotated, Any

import typer
from rich.markup import escape

from service.cli.app import (
    JsonOption,
    OwnerOption,
    acting_owner,
    console,
    emit_json,
    load_settings,
    schedules_cli,
)
from service.cli.tables import narrow_table
from service.platform.db import make_engine, make_session_factory, unit_of_work
from service.triggers.schedules import ScheduleSummary


def _iso(value: Any) -> str | None:
    return value.isoformat() if value is not None else None


def schedule_document(summary: ScheduleSummary) -> dict[str, Any]:
    """A schedule as ``--json`` prints it: the keys of the API's schedule."""
    row = summary.schedule
    return {
        "id": str(row.id),
        "pipeline": row.pipeline,
        "owner": row.owner,
        "cron": row.cron,
        "every_s": row.every_s,
        "timezone": row.timezone,
        "params": row.params,
        "enabled": row.enabled,
        "overlap": row.overlap,
        "catchup": row.catchup,
        "catchup_window_s": row.catchup_window_s,
        "jitter_s": row.jitter_s,
        "diff_mode": row.diff_mode,
        "notify_url": row.notify_url,
        "next_fire_at": _iso(row.next_fire_at),
        "last_fire_at": _iso(row.last_fire_at),
        "last_job_id": str(row.last_job_id) if row.last_job_id else None,
        "last_status": summary.last_status,
        "run_count": summary.run_count,
        "created_at": _iso(row.created_at),
        "updated_at": _iso(row.updated_at),
    }


def _timing(doc: dict[str, Any]) -> str:
    return f"{doc['cron']} {doc['timezone']}" if doc["cron"] else f"every {doc['every_s']}s"


def _print(documents: list[dict[str, Any]]) -> None:
    rows = []
    for doc in documents:
        last = f"{(doc['last_fire_at'] or '')[:16]} {doc['last_status'] or ''}".strip()
        rows.append(
            [
                doc["pipeline"],
                escape(doc["owner"]),
                escape(_timing(doc)),
                "active" if doc["enabled"] else "paused",
                (doc["next_fire_at"] or "-")[:16],
                last or "-",
                str(doc["run_count"]),
            ]
        )
    headers = ["pipeline", "owner", "when", "state", "next fire (UTC)", "last", "runs"]
    table = narrow_table(
        headers,
        rows,
        width=console.width,
        keep=["pipeline", "runs", "next fire (UTC)", "state", "last"],
    )
    console.print(table)


@schedules_cli.command("list")
def schedules_list(
    owner: Annotated[str | None, typer.Option(help="only this owner's schedules")] = None,
    as_json: JsonOption = False,
) -> None:
    """Every schedule with its next and last fire, the last run's status and its run count."""
    from service.triggers.schedules import list_schedules

    sessions = make_session_factory(make_engine(load_settings().require_database_url()))
    with unit_of_work(sessions) as session:
        documents = [schedule_document(s) for s in list_schedules(session, owner=owner)]
    if as_json:
        emit_json({"schedules": documents})
    else:
        _print(documents)


@schedules_cli.command("show")
def schedules_show(name: str, owner: OwnerOption = None, as_json: JsonOption = False) -> None:
    """One pipeline's schedule."""
    from service.triggers.schedules import get_schedule, summarize

    settings = load_settings()
    sessions = make_session_factory(make_engine(settings.require_database_url()))
    with unit_of_work(sessions) as session:
        row = get_schedule(session, owner=acting_owner(settings, owner), pipeline=name)
        document = schedule_document(summarize(session, [row])[0])
    if as_json:
        emit_json({"schedule": document})
        return
    _print([document])
    console.print(
        f"params {document['params']}, overlap {document['overlap']}, "
        f"catch-up {document['catchup']}",
        highlight=False,
        markup=False,
    )


def _set_enabled(name: str, owner: str | None, enabled: bool) -> None:
    from service.platform.clock import utcnow
    from service.triggers.schedules import set_schedule_enabled

    settings = load_settings()
    sessions = make_session_factory(make_engine(settings.require_database_url()))
    with unit_of_work(sessions) as session:
        row = set_schedule_enabled(
            session,
            owner=acting_owner(settings, owner),
            pipeline=name,
            enabled=enabled,
            settings=settings,
            now=utcnow(),
        )
        next_fire = _iso(row.next_fire_at)
    if enabled:
        console.print(f"{name}: active, next fire {next_fire} UTC", markup=False)
    else:
        console.print(f"{name}: paused", markup=False)


@schedules_cli.command("pause")
def schedules_pause(name: str, owner: OwnerOption = None) -> None:
    """Stop firing; the schedule and its history stay."""
    _set_enabled(name, owner, False)


@schedules_cli.command("resume")
def schedules_resume(name: str, owner: OwnerOption = None) -> None:
    """Fire again from now on (fires missed while paused are not caught up)."""
    _set_enabled(name, owner, True)


@schedules_cli.command("delete")
def schedules_delete(name: str, owner: OwnerOption = None) -> None:
    """Delete a schedule; the jobs it created stay."""
    from service.triggers.schedules import delete_schedule

    settings = load_settings()
    sessions = make_session_factory(make_engine(settings.require_database_url()))
    with unit_of_work(sessions) as session:
        delete_schedule(session, owner=acting_owner(settings, owner), pipeline=name)
    console.print(f"{name}: schedule deleted", markup=False)
