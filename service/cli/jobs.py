"""``flowbeat jobs``: list, show, watch, cancel, rerun, approve, reject and signal, calling the
service functions as the API's routes; each change is committed before its messages go out."""

import json
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any

import typer

from service.cli.app import (
    FINAL,
    JsonOption,
    celery_app,
    cli_actor,
    console,
    emit_json,
    jobs_cli,
    load_settings,
    parse_json_option,
    print_refusal,
)
from service.cli.bulk import (
    BulkIdOption,
    ErrorCodeOption,
    LabelOption,
    PipelineOption,
    SinceOption,
    StatusOption,
    UntilOption,
    YesOption,
    job_filter,
    refuse_json_for_bulk,
    run_bulk,
)
from service.cli.follow import (
    follow_job,
    follow_to_the_end,
    parse_params,
    print_changes,
    print_outcome,
    view_job,
)
from service.cli.tables import print_table
from service.platform.audit import record_cancel, record_decision, record_rerun, record_signal
from service.platform.db import sessions_of, unit_of_work
from service.platform.errors import FlowbeatError
from service.platform.models import JobRow
from service.platform.settings import Settings

if TYPE_CHECKING:
    from celery import Celery

    from service.engine.filters import JobFilter
    from service.engine.runtime import Runtime
    from service.language.plan import JobPlan


def job_document(job: JobRow) -> dict[str, Any]:
    """A job as ``--json`` prints it: the keys of the API's job, without its steps."""
    return {
        "id": str(job.id),
        "pipeline": job.pipeline,
        "status": job.status,
        "trigger": job.trigger,
        "priority": job.priority,
        "waiting_for": job.waiting_for,
        "parent_job_id": str(job.parent_job_id) if job.parent_job_id else None,
        "params": job.params,
        "labels": job.labels,
        "created_at": job.created_at.isoformat(),
        "started_at": job.started_at.isoformat() if job.started_at else None,
        "finished_at": job.finished_at.isoformat() if job.finished_at else None,
        "deadline_at": job.deadline_at.isoformat() if job.deadline_at else None,
        "error": job.error,
    }


JobArgument = Annotated[
    str,
    typer.Argument(
        metavar="JOB",
        help="the job's id, or its first 8 or more hex digits (as the dashboard shows them)",
        show_default=False,
    ),
]


OptionalJob = Annotated[
    str | None,
    typer.Argument(
        metavar="[JOB]",
        help="the job's id or its first 8 or more hex digits; without it, the filter's jobs",
        show_default=False,
    ),
]


def one_job_or_a_filter(match: "JobFilter") -> None:
    if not match.is_empty():
        raise typer.BadParameter("give a JOB or filter options, not both", param_hint="JOB")


def resolve_job(settings: Settings, given: str) -> uuid.UUID:
    """The id of the one job ``given`` names; the CLI sees every owner's jobs, as ``jobs
    list`` does. Refused (exit 2) when it names none, or several."""
    from service.engine.jobids import resolve_job_id

    sessions = sessions_of(settings)
    with unit_of_work(sessions) as session:
        return resolve_job_id(session, given, owner=None)


@dataclass(frozen=True)
class JobCommand:
    """What a command that changes one job needs: the job, and the app it publishes with,
    built from the settings ``load_settings`` resolved, so in the embedded default it
    publishes to the embedded broker, never to one Celery would default to."""

    settings: Settings
    job_id: uuid.UUID
    app: "Celery"
    rt: "Runtime"

    def publish(self, plan: "JobPlan") -> None:
        """Send what the change made ready; with the broker away, say that the sweeper sends
        it later, so a command that could not publish never looks like one that did."""
        from tasks.dispatch import publish_or_defer

        if not publish_or_defer(self.app, self.rt, plan):
            console.print(
                f"broker unreachable: job {self.job_id} waits for the sweeper to send its steps",
                markup=False,
            )


def job_command(job: str) -> JobCommand:
    from service.engine.runtime import Runtime

    settings = load_settings()
    job_id = resolve_job(settings, job)
    return JobCommand(settings, job_id, celery_app(settings), Runtime.start(settings))


@jobs_cli.command("list")
def jobs_list(
    pipeline: PipelineOption = None,
    status: StatusOption = None,
    label: LabelOption = None,
    error_code: ErrorCodeOption = None,
    since: SinceOption = None,
    until: UntilOption = None,
    limit: int = 20,
    parent: Annotated[
        str | None,
        typer.Option(
            metavar="JOB",
            help="only the jobs that came from this one: its children, reruns and dependents",
        ),
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """The newest jobs, with the filter of ``GET /v1/jobs``."""
    from service.engine.jobs import list_jobs

    settings = load_settings()
    parent_id = None if parent is None else resolve_job(settings, parent)
    match = job_filter(pipeline, status, label, error_code, since, until, parent_id)
    sessions = sessions_of(settings)
    with unit_of_work(sessions) as session:
        rows, _ = list_jobs(session, owner=None, match=match, limit=limit)
        if as_json:
            emit_json({"jobs": [job_document(job) for job in rows]})
            return
    cells = [
        [
            str(job.id),
            job.pipeline,
            job.status,
            job.trigger,
            " ".join(f"{key}={value}" for key, value in job.labels.items()),
            job.created_at.strftime("%Y-%m-%d %H:%M"),
        ]
        for job in rows
    ]
    headers = ["id", "pipeline", "status", "trigger", "labels", "created (UTC)"]
    whole = {"id", "pipeline", "status", "created (UTC)"}
    print_table(headers, cells, whole=whole, keep=["trigger"])


@jobs_cli.command("show")
def jobs_show(job: JobArgument, as_json: JsonOption = False) -> None:
    """One job with its steps, and the error of each step that has one."""
    settings = load_settings()
    job_id = resolve_job(settings, job)
    view = view_job(settings, job_id)
    if as_json:
        emit_json({"job": view_document(view)})
        return
    print_changes(view, {}, errors=True)
    if view.job.status in FINAL:
        print_outcome(view)
    else:
        console.print(f"job {job_id}: {view.job.status}")
    if view.job.labels:
        pairs = " ".join(f"{key}={value}" for key, value in view.job.labels.items())
        console.print(f"  labels: {pairs}", markup=False)
    print_family(view)


def print_family(view: Any) -> None:
    """The job it came from and how, and the children its steps started, one line each."""
    parent = view.family.parent
    if parent is not None:
        by = f" (step {parent.step_id})" if parent.step_id else ""
        console.print(f"  parent: {parent.job_id} {parent.relation}{by}", markup=False)
    for child in view.family.children:
        where = f"{child.step_id} #{child.attempt}"
        line = f"  child: {child.job_id} {child.pipeline} {child.status} ({where})"
        console.print(line, markup=False)


@jobs_cli.command("watch")
def jobs_watch(job: JobArgument, timeout_s: float = 3600.0) -> None:
    """Follow a job's steps live until it ends; exits 0 when it succeeded, 1 otherwise."""
    settings = load_settings()
    try:
        job_id = resolve_job(settings, job)
        view_job(settings, job_id)
    except FlowbeatError as exc:
        print_refusal(exc)
        raise typer.Exit(code=2) from exc
    status = follow_job(settings, job_id, timeout_s)
    raise typer.Exit(code=0 if status == "succeeded" else 1)


@jobs_cli.command("logs")
def jobs_logs(
    job: JobArgument,
    step: Annotated[
        str | None,
        typer.Argument(metavar="STEP", help="one step's lines; default: every step's"),
    ] = None,
    attempt: Annotated[int | None, typer.Option(min=1, help="only this attempt's lines")] = None,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="then print new lines until the job ends")
    ] = False,
    timeout_s: float = 3600.0,
    as_json: JsonOption = False,
) -> None:
    """What the job's steps logged and printed, oldest first: time (UTC), level, step (with
    its item, attempt and round), message. With ``--json --follow``, one JSON object a line,
    printed as each line comes."""
    from service.engine.watch import log_lines

    settings = load_settings()
    job_id = resolve_job(settings, job)
    lines = log_lines(settings, job_id, step, attempt=attempt, follow=follow, timeout_s=timeout_s)
    if as_json and not follow:
        emit_json({"lines": [line.public() for line in lines]})
        return
    for line in lines:
        if as_json:
            typer.echo(json.dumps(line.public()))
            continue
        where = line.step_id + ("" if line.shard is None else f"[{line.shard}]")
        where += f" #{line.attempt}" + (f" r{line.round}" if line.round > 1 else "")
        stamp = line.ts.strftime("%H:%M:%S.%f")[:-3]
        console.print(
            f"{stamp} {line.level:<7} {where} {line.message}", highlight=False, markup=False
        )


@jobs_cli.command("cancel")
def jobs_cancel(
    job: OptionalJob = None,
    pipeline: PipelineOption = None,
    status: StatusOption = None,
    label: LabelOption = None,
    error_code: ErrorCodeOption = None,
    since: SinceOption = None,
    until: UntilOption = None,
    yes: YesOption = False,
    bulk_id: BulkIdOption = None,
    as_json: JsonOption = False,
) -> None:
    """Cancel an open job, as ``POST /v1/jobs/{id}/cancel`` does; with ``--json``, the job as
    ``jobs list --json`` prints it, and any note on stderr. Without JOB, every open job the
    filter options match, as ``POST /v1/jobs/cancel`` does, once you confirm their count."""
    from service.engine.jobs import cancel_job, job_view
    from service.language.plan import JobPlan
    from service.platform.clock import utcnow
    from tasks.dispatch import revoke_unstarted

    match = job_filter(pipeline, status, label, error_code, since, until)
    if job is None:
        refuse_json_for_bulk(as_json)
        run_bulk("cancel", match, yes=yes, bulk_id=bulk_id)
        return
    one_job_or_a_filter(match)
    command = job_command(job)
    now = utcnow()
    with unit_of_work(command.rt.sessions) as session:
        cancelled, running = cancel_job(session, command.job_id, owner=None, now=now)
        record_cancel(session, cli_actor(command.settings, "jobs cancel"), cancelled, now)
        compensation = job_view(session, cancelled).compensation
    if compensation is not None and compensation["status"] == "running":
        command.publish(JobPlan(command.job_id, compensate=True))
    if as_json:
        emit_json({"job": job_document(cancelled)})
    else:
        console.print(f"job {command.job_id}: {cancelled.status}")
    if not revoke_unstarted(command.app, running):
        note = "running steps stop at their next heartbeat (the revoke did not go out)"
        typer.echo(note, err=as_json)


@jobs_cli.command("rerun")
def jobs_rerun(
    job: OptionalJob = None,
    from_step: Annotated[
        str | None,
        typer.Option(
            "--from",
            help="the step to run again; default: every step (with a filter: each job's "
            "failed step)",
        ),
    ] = None,
    param: Annotated[list[str], typer.Option("-p", "--param", help="key=value")] = [],  # noqa: B006
    reuse: Annotated[bool, typer.Option(help="reuse the checkpoints upstream of --from")] = True,
    only_failed_items: Annotated[
        bool, typer.Option(help="a for_each step reruns only its failed items")
    ] = False,
    priority: Annotated[
        int | None, typer.Option(min=0, max=9, help="0-9, higher first; default: the job's")
    ] = None,
    wait: Annotated[bool, typer.Option(help="follow the new job until it ends")] = False,
    local_worker: Annotated[bool, typer.Option(help="start a worker while following")] = False,
    pipeline: PipelineOption = None,
    status: StatusOption = None,
    label: LabelOption = None,
    error_code: ErrorCodeOption = None,
    since: SinceOption = None,
    until: UntilOption = None,
    yes: YesOption = False,
    bulk_id: BulkIdOption = None,
    as_json: JsonOption = False,
) -> None:
    """Run a finished job again from a step, reusing what came before it; prints the new id,
    or with ``--json`` the new job (then ``jobs watch`` follows it, not ``--wait``). Without
    JOB, every finished job the filter options match, once each, as ``POST /v1/jobs/rerun``
    does, once you confirm their count."""
    from service.engine.reruns import RerunRequest, rerun_job
    from service.language.plan import load_plan
    from service.platform.clock import utcnow
    from tasks.dispatch import publish_new_job

    match = job_filter(pipeline, status, label, error_code, since, until)
    if job is None:
        refuse_json_for_bulk(as_json)
        run_bulk("rerun", match, yes=yes, bulk_id=bulk_id, from_step=from_step, priority=priority)
        return
    one_job_or_a_filter(match)
    if as_json and wait:
        raise typer.BadParameter("--json prints the new job; follow it with jobs watch")
    request = RerunRequest(from_step, parse_params(param), reuse, only_failed_items, priority)
    command = job_command(job)
    with unit_of_work(command.rt.sessions) as session:
        rerun = rerun_job(session, command.job_id, request, visible_to=None, now=utcnow())
        record_rerun(session, cli_actor(command.settings, "jobs rerun"), rerun, from_step)
        new_id, waiting = rerun.id, rerun.waiting_for is not None
        document = job_document(rerun)
    with unit_of_work(command.rt.sessions) as session:
        plan = None if waiting else load_plan(session, new_id)
    if plan is not None:
        publish_new_job(command.app, command.rt, plan)
    if as_json:
        emit_json({"job": document})
        return
    console.print(f"job [bold]{new_id}[/bold] queued (rerun of {command.job_id})")
    if wait:
        follow_to_the_end(command.settings, new_id, local_worker)


def view_document(view: Any) -> dict[str, Any]:
    """A job with its steps and result, as ``jobs show --json`` prints it."""
    steps = [
        {
            "step_id": step.step_id,
            "status": step.status,
            "attempts": step.attempts,
            "started_at": step.started_at.isoformat() if step.started_at else None,
            "finished_at": step.finished_at.isoformat() if step.finished_at else None,
            "error": step.error,
            "shards": step.shards,
            "round": step.round,
            "wake_at": step.wake_at.isoformat() if step.wake_at else None,
            "cached_from": step.cached_from,
        }
        for step in view.steps
    ]
    family = view.family
    parent = family.parent
    return {
        **job_document(view.job),
        "parent": None if parent is None else {**vars(parent), "job_id": str(parent.job_id)},
        "children": [
            {
                "id": str(child.job_id),
                "step_id": child.step_id,
                "attempt": child.attempt,
                "pipeline": child.pipeline,
                "status": child.status,
            }
            for child in family.children
        ],
        "result": view.job.result,
        "steps": steps,
    }


def _decide(
    job: str,
    step_id: str,
    approve: bool,
    comment: str | None,
    payload: str | None,
    by: str,
) -> None:
    from service.engine.approvals import decide
    from service.platform.clock import utcnow

    body = parse_json_option(payload, "--payload")
    command = job_command(job)
    with unit_of_work(command.rt.sessions) as session:
        decided = decide(
            session,
            command.job_id,
            step_id,
            approve=approve,
            by=by,
            comment=comment,
            payload=body,
            visible_to=None,
            now=utcnow(),
        )
        status = decided.approval.status
        actor = cli_actor(command.settings, "jobs approve" if approve else "jobs reject")
        record_decision(session, actor, command.job_id, step_id, approve=approve, by=by)
    command.publish(decided.ready)
    console.print(f"job {command.job_id} step {step_id}: {status} by {by}", markup=False)


CommentOption = Annotated[str | None, typer.Option(help="recorded with the decision")]
ByOption = Annotated[str, typer.Option(help="who decided, as recorded")]


@jobs_cli.command("approve")
def jobs_approve(
    job: JobArgument,
    step_id: str,
    comment: CommentOption = None,
    payload: Annotated[
        str | None, typer.Option(help="JSON the step reads as ${{ approval.<step>.payload }}")
    ] = None,
    by: ByOption = "cli",
) -> None:
    """Approve a step waiting at its gate, as ``POST .../steps/{step}/approve`` does."""
    _decide(job, step_id, True, comment, payload, by)


@jobs_cli.command("reject")
def jobs_reject(
    job: JobArgument, step_id: str, comment: CommentOption = None, by: ByOption = "cli"
) -> None:
    """Reject a step waiting at its gate; the job's failure policy decides the rest."""
    _decide(job, step_id, False, comment, None, by)


@jobs_cli.command("signal")
def jobs_signal(
    job: JobArgument,
    name: Annotated[str, typer.Argument(help="the signal a step waits for (wait_for.signal)")],
    payload: Annotated[
        str | None, typer.Option(help="JSON the steps read as ${{ signals.<name>.payload }}")
    ] = None,
    by: Annotated[str, typer.Option(help="who sent it, as recorded")] = "cli",
) -> None:
    """Send a job a signal, as ``POST /v1/jobs/{id}/signals/{name}`` does: the steps waiting
    for it run, and one that waits later finds it."""
    from service.engine.signals import send_signal
    from service.platform.clock import utcnow

    body = parse_json_option(payload, "--payload")
    command = job_command(job)
    job_id = command.job_id
    with unit_of_work(command.rt.sessions) as session:
        sent = send_signal(session, job_id, name, body, by=by, visible_to=None, now=utcnow())
        record_signal(session, cli_actor(command.settings, "jobs signal"), job_id, name, by=by)
        resumed = sent.resumed
    command.publish(sent.ready)
    waiting = ", ".join(resumed) if resumed else "kept until a step waits for it"
    console.print(f"job {job_id} signal {name}: received ({waiting})", markup=False)
