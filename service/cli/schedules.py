"""``flowbeat schedules``: list, show, set, pause, resume and delete, as the schedule routes do;
the elected scheduler is woken by each change when it commits.

A pipeline may have several schedules: ``--schedule`` names one by its name or id. Without it
a command means the pipeline's only schedule and is refused (``schedule_ambiguous``, listing
the ids and names) when it has several, as the one-schedule routes are."""

from typing import Annotated, Any

import typer
from pydantic import ValidationError

from service.cli.app import (
    JsonOption,
    OwnerOption,
    acting_owner,
    cli_actor,
    console,
    emit_json,
    load_settings,
    schedules_cli,
)
from service.cli.follow import parse_params
from service.cli.tables import print_table
from service.language.cron import ScheduleSpec
from service.platform.audit import record, record_schedule_state, schedule_event, schedule_saved
from service.platform.constants import MAX_PRIORITY
from service.platform.db import sessions_of, unit_of_work
from service.platform.errors import ScheduleNotFound
from service.platform.models import ScheduleRow
from service.triggers.schedules import ScheduleSummary


def _iso(value: Any) -> str | None:
    return value.isoformat() if value is not None else None


def schedule_document(summary: ScheduleSummary) -> dict[str, Any]:
    """A schedule as ``--json`` prints it: the keys of the API's schedule."""
    row = summary.schedule
    return {
        "id": str(row.id),
        "name": row.name,
        "pipeline": row.pipeline,
        "owner": row.owner,
        "priority": row.priority,
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
    """When it fires, after its name when it has one: a column of its own would not leave an
    80-column terminal room for the pipeline's name on one line."""
    when = f"{doc['cron']} {doc['timezone']}" if doc["cron"] else f"every {doc['every_s']}s"
    return f"{doc['name']}: {when}" if doc["name"] else when


def _print(documents: list[dict[str, Any]]) -> None:
    rows = []
    for doc in documents:
        last = f"{(doc['last_fire_at'] or '')[:16]} {doc['last_status'] or ''}".strip()
        rows.append(
            [
                doc["pipeline"],
                doc["owner"],
                _timing(doc),
                "active" if doc["enabled"] else "paused",
                (doc["next_fire_at"] or "-")[:16],
                last or "-",
                str(doc["run_count"]),
            ]
        )
    headers = ["pipeline", "owner", "when", "state", "next fire (UTC)", "last", "runs"]
    keep = ["runs", "next fire (UTC)", "last"]
    print_table(headers, rows, whole={"pipeline", "state"}, keep=keep)


ScheduleOption = Annotated[
    str | None,
    typer.Option(
        "--schedule",
        help="which of the pipeline's schedules, by name or id; needed when it has several",
    ),
]


@schedules_cli.command("list")
def schedules_list(
    owner: Annotated[str | None, typer.Option(help="only this owner's schedules")] = None,
    pipeline: Annotated[str | None, typer.Option(help="only this pipeline's schedules")] = None,
    as_json: JsonOption = False,
) -> None:
    """Every schedule with its next and last fire, the last run's status and its run count."""
    from service.triggers.schedules import list_schedules

    sessions = sessions_of(load_settings())
    with unit_of_work(sessions) as session:
        documents = [
            schedule_document(s) for s in list_schedules(session, owner=owner, pipeline=pipeline)
        ]
    if as_json:
        emit_json({"schedules": documents})
    else:
        _print(documents)


@schedules_cli.command("show")
def schedules_show(
    name: str,
    schedule: ScheduleOption = None,
    owner: OwnerOption = None,
    as_json: JsonOption = False,
) -> None:
    """One of a pipeline's schedules, with its id, params and priority."""
    from service.triggers.schedules import get_schedule, summarize

    settings = load_settings()
    sessions = sessions_of(settings)
    with unit_of_work(sessions) as session:
        row = get_schedule(
            session, owner=acting_owner(settings, owner), pipeline=name, schedule=schedule
        )
        document = schedule_document(summarize(session, [row])[0])
    if as_json:
        emit_json({"schedule": document})
        return
    _print([document])
    priority = "the profile's" if document["priority"] is None else document["priority"]
    console.print(
        f"id {document['id']}, params {document['params']}, priority {priority}, "
        f"overlap {document['overlap']}, catch-up {document['catchup']}",
        highlight=False,
        markup=False,
    )


@schedules_cli.command("set")
def schedules_set(
    name: str,
    schedule: ScheduleOption = None,
    add: Annotated[
        bool, typer.Option("--add", help="a new schedule beside those the pipeline has")
    ] = False,
    rename: Annotated[str | None, typer.Option("--name", help="the schedule's name")] = None,
    cron: Annotated[str | None, typer.Option(help="five fields, on --timezone's clock")] = None,
    every: Annotated[str | None, typer.Option(help="an interval: 30m, 6h, 1d")] = None,
    timezone: Annotated[str | None, typer.Option(help="an IANA zone")] = None,
    param: Annotated[
        list[str], typer.Option("-p", "--param", help="key=value; replaces the params")
    ] = [],  # noqa: B006
    priority: Annotated[
        int | None, typer.Option(min=0, max=MAX_PRIORITY, help="of the jobs it starts")
    ] = None,
    overlap: Annotated[
        str | None, typer.Option(help="skip, allow, buffer_one or cancel_previous")
    ] = None,
    owner: OwnerOption = None,
    as_json: JsonOption = False,
) -> None:
    """Create or change a schedule. What the options leave out is kept from the schedule or,
    for a new one, taken from the profile's ``schedule:`` block; a --schedule name the
    pipeline has no schedule of yet creates it."""
    from service.engine.runtime import Runtime
    from service.engine.submission import resolve_request
    from service.platform.clock import utcnow
    from service.triggers.schedules import (
        create_schedule,
        find_schedule,
        put_schedule,
        set_schedule,
        spec_of,
        summarize,
    )

    settings = load_settings()
    acting = acting_owner(settings, owner)
    rt = Runtime.start(settings)
    try:
        with unit_of_work(rt.sessions) as session:
            profile = resolve_request(
                session,
                name,
                owner=acting,
                profiles_dir=settings.profiles_dir,
                known_actions=rt.registry.names(),
            ).profile
            current = None
            if not add:
                try:
                    current = find_schedule(session, owner=acting, pipeline=name, schedule=schedule)
                except ScheduleNotFound:
                    current = None
            base = spec_of(current) if current is not None else profile.schedule
            fields = base.model_dump(exclude_unset=True) if base is not None else {}
            changes: dict[str, Any] = {
                key: value
                for key, value in {
                    "name": rename,
                    "timezone": timezone,
                    "priority": priority,
                    "overlap": overlap,
                }.items()
                if value is not None
            }
            if cron is not None or every is not None:
                changes |= {"cron": cron, "every": every}
            if param:
                changes["params"] = parse_params(param)
            try:
                spec = ScheduleSpec.model_validate({**fields, **changes})
            except ValidationError as exc:
                raise typer.BadParameter(str(exc)) from None
            now = utcnow()
            if add:
                row = create_schedule(
                    session, owner=acting, profile=profile, spec=spec, settings=settings, now=now
                )
            elif schedule is None:
                row = put_schedule(
                    session, owner=acting, profile=profile, spec=spec, settings=settings, now=now
                )
            else:
                row, _ = set_schedule(
                    session,
                    owner=acting,
                    profile=profile,
                    schedule=schedule,
                    spec=spec,
                    settings=settings,
                    now=now,
                )
            actor = cli_actor(settings, "schedules set", owner)
            record(session, actor, schedule_saved(row, now), *schedule_event(row), at=now)
            document = schedule_document(summarize(session, [row])[0])
    finally:
        rt.sessions.kw["bind"].dispose()
    if as_json:
        emit_json({"schedule": document})
        return
    _print([document])
    console.print(f"id {document['id']}", highlight=False, markup=False)


def _label(name: str, row: ScheduleRow) -> str:
    return f"{name} ({row.name})" if row.name else name


def _set_enabled(name: str, schedule: str | None, owner: str | None, enabled: bool) -> None:
    from service.platform.clock import utcnow
    from service.triggers.schedules import set_schedule_enabled

    settings = load_settings()
    sessions = sessions_of(settings)
    now = utcnow()
    with unit_of_work(sessions) as session:
        row = set_schedule_enabled(
            session,
            owner=acting_owner(settings, owner),
            pipeline=name,
            enabled=enabled,
            settings=settings,
            now=now,
            schedule=schedule,
        )
        command = "schedules resume" if enabled else "schedules pause"
        record_schedule_state(session, cli_actor(settings, command, owner), row, now)
        next_fire = _iso(row.next_fire_at)
        label = _label(name, row)
    if enabled:
        console.print(f"{label}: active, next fire {next_fire} UTC", markup=False)
    else:
        console.print(f"{label}: paused", markup=False)


@schedules_cli.command("pause")
def schedules_pause(name: str, schedule: ScheduleOption = None, owner: OwnerOption = None) -> None:
    """Stop firing; the schedule and its history stay."""
    _set_enabled(name, schedule, owner, False)


@schedules_cli.command("resume")
def schedules_resume(name: str, schedule: ScheduleOption = None, owner: OwnerOption = None) -> None:
    """Fire again from now on (fires missed while paused are not caught up)."""
    _set_enabled(name, schedule, owner, True)


@schedules_cli.command("delete")
def schedules_delete(name: str, schedule: ScheduleOption = None, owner: OwnerOption = None) -> None:
    """Delete a schedule; the jobs it created stay."""
    from service.triggers.schedules import delete_schedule

    settings = load_settings()
    sessions = sessions_of(settings)
    with unit_of_work(sessions) as session:
        row = delete_schedule(
            session, owner=acting_owner(settings, owner), pipeline=name, schedule=schedule
        )
        actor = cli_actor(settings, "schedules delete", owner)
        record(session, actor, "schedule.delete", *schedule_event(row))
        label = _label(name, row)
    console.print(f"{label}: schedule deleted", markup=False)
