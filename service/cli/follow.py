"""``flowbeat run``: submit a job and follow it to its end, and what ``jobs`` shares with it
(a job's steps and outcome on screen, following with a worker of its own)."""

import os
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
import yaml
from rich.markup import escape

from service.cli.app import (
    FINAL,
    OwnerOption,
    acting_owner,
    celery_app,
    cli,
    cli_actor,
    console,
    load_settings,
    migrate_schema,
    print_refusal,
)
from service.cli.processes import (
    Stop,
    adopt_orphans,
    flowbeat_argv,
    processes,
    stoppable,
    worker_argv,
)
from service.language.yamlsafe import load_yaml
from service.platform.constants import PIPELINE_RUN_ACTION, WAIT_ACTION
from service.platform.db import sessions_of, unit_of_work
from service.platform.errors import FlowbeatError, ParamsInvalid
from service.platform.settings import Settings, get_settings

if TYPE_CHECKING:
    from service.platform.models import JobRow


def parse_params(pairs: list[str]) -> dict[str, Any]:
    """``-p key=value`` pairs, each value read as YAML; one that does not parse is
    ``params_invalid`` naming the param and the position, on one line as any parse error."""
    params: dict[str, Any] = {}
    for pair in pairs:
        name, sep, raw = pair.partition("=")
        if not sep or not name:
            raise typer.BadParameter(f"expected key=value, got {pair!r}")
        try:
            params[name] = load_yaml(raw) if raw else ""
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
            problem = getattr(exc, "problem", None) or exc
            message = f"param {name!r}: invalid YAML{where}: {problem}"
            entry = {"param": name, "code": "yaml_syntax", "message": message}
            raise ParamsInvalid(f"invalid params: {message}", {"errors": [entry]}) from None
    return params


def pipeline_ref(target: str) -> str | dict[str, Any]:
    from service.language.loading import load_profile_document

    path = Path(target)
    if path.suffix in {".yaml", ".yml", ".json"} or path.exists():
        if not path.is_file():
            raise typer.BadParameter(f"no such file: {target}")
        document = load_profile_document(path.read_text(encoding="utf-8"), source=target)
        if not isinstance(document, dict):
            raise typer.BadParameter(f"{target} is not a YAML mapping")
        return document
    return target


@cli.command()
def run(
    target: Annotated[
        str, typer.Argument(help="a saved pipeline, a profile file by name, or a YAML file")
    ],
    param: Annotated[list[str], typer.Option("-p", "--param", help="key=value")] = [],  # noqa: B006
    wait: Annotated[bool, typer.Option(help="follow the job until it ends")] = True,
    local_worker: Annotated[
        bool | None,
        typer.Option(
            help="start a worker for this run, and a beat when it has a wait step "
            "(default: embedded only)"
        ),
    ] = None,
    timeout_s: float = 600.0,
    owner: OwnerOption = None,
    priority: Annotated[
        int | None, typer.Option(min=0, max=9, help="0-9, higher first; default: the profile's")
    ] = None,
    label: Annotated[
        list[str], typer.Option("--label", metavar="KEY=VALUE", help="a label of the job")
    ] = [],  # noqa: B006
    refresh: Annotated[
        bool, typer.Option(help="run every step again, taking nothing from the step cache")
    ] = False,
) -> None:
    """Run a pipeline once and follow its steps; exits non-zero when the job fails. When the
    pipeline's dedupe key matches an open or recent job, it follows that job instead."""
    from service.language.labels import parse_labels

    embedded = get_settings().embedded()
    adopt_orphans()
    settings = load_settings()
    migrate_schema(settings)
    job_id = submit(
        settings,
        pipeline_ref(target),
        parse_params(param),
        acting_owner(settings, owner),
        priority,
        parse_labels(label),
        refresh=refresh,
    )
    if wait:
        worker = local_worker or (local_worker is None and embedded)
        follow_to_the_end(settings, job_id, worker, timeout_s)


INTERRUPTED = 130


def follow_to_the_end(
    settings: Settings, job_id: uuid.UUID, local_worker: bool, timeout_s: float = 600.0
) -> None:
    """Follow a job, with a worker (and for a wait, a beat) of our own when asked; exits 0
    when it succeeded.

    Interrupted (Ctrl-C or SIGTERM), it stops what it started and says what becomes of the job,
    which lives in the database and goes on without this command.
    """
    commands = _local_processes(settings, job_id) if local_worker else []
    if commands:
        console.print(f"worker log: {settings.data_dir / 'worker.log'}", markup=False)
    try:
        with stoppable(), processes(commands, settings.data_dir / "worker.log"):
            status = follow_job(settings, job_id, timeout_s)
    except (KeyboardInterrupt, Stop):
        _print_left_behind(settings, job_id, local_worker)
        raise typer.Exit(code=INTERRUPTED) from None
    raise typer.Exit(code=0 if status == "succeeded" else 1)


def _print_left_behind(settings: Settings, job_id: uuid.UUID, stopped_worker: bool) -> None:
    status = view_job(settings, job_id).job.status
    if status in FINAL:
        console.print(f"stopped following job {job_id}: it is {status}")
        return
    goes_on = (
        "it waits for a worker (flowbeat dev, flowbeat worker or another flowbeat run)"
        if stopped_worker
        else "the workers go on with it"
    )
    console.print(f"[yellow]job {job_id} is still {status}[/yellow]: {goes_on}.")
    console.print(f"  flowbeat jobs show {job_id}    flowbeat jobs cancel {job_id}")


def submit(
    settings: Settings,
    pipeline: str | dict[str, Any],
    params: dict[str, Any],
    owner: str,
    priority: int | None = None,
    labels: dict[str, str] | None = None,
    *,
    refresh: bool = False,
) -> uuid.UUID:
    from service.engine.runtime import Runtime
    from service.engine.submission import JobRequest, Outcome, submit_job
    from service.platform.secrets import secrets_of
    from tasks.dispatch import send_new_job

    rt = Runtime.start(settings)
    try:
        with unit_of_work(rt.sessions) as session:
            job, outcome = submit_job(
                session,
                JobRequest(
                    pipeline=pipeline,
                    params=params,
                    trigger="cli",
                    priority=priority,
                    labels=labels or {},
                    refresh=refresh,
                ),
                owner=owner,
                profiles_dir=settings.profiles_dir,
                known_actions=rt.registry.names(),
                secrets=secrets_of(settings),
                audit=cli_actor(settings, "run", owner),
            )
    except FlowbeatError as exc:
        print_refusal(exc)
        raise typer.Exit(code=2) from exc
    if outcome is Outcome.DEDUPLICATED:
        print_duplicate(job)
        return job.id
    console.print(f"job [bold]{job.id}[/bold] queued")
    if not send_new_job(celery_app(settings), rt, job):
        console.print(f"job {job.id} waits for a slot of its concurrency key", markup=False)
    return job.id


def print_duplicate(job: "JobRow") -> None:
    """Says that no job was started, and which job answers instead."""
    state = f"ended {job.status}" if job.finished_at is not None else f"is {job.status}"
    console.print(
        f"deduplicated: job [bold]{job.id}[/bold] has the same dedupe key "
        f"{escape(repr(job.dedupe_key))} and {state}; no new job was started",
        highlight=False,
    )


def print_changes(view: Any, seen: dict[str, str], *, errors: bool = False) -> None:
    for step in view.steps:
        if seen.get(step.step_id) != step.status:
            seen[step.step_id] = step.status
            shards = step.shards or {}
            done = shards.get("succeeded", 0) + shards.get("cached", 0)
            items = f" ({done}/{shards['total']} items)" if shards else ""
            rounds = f" (round {step.round})" if step.rounds else ""
            wakes = f" until {step.wake_at.isoformat()}" if step.status == "sleeping" else ""
            source = step.cached_from
            came = f" from job {source['job_id']} step {source['step_id']}" if source else ""
            line = f"  {step.step_id:<24} {step.status}{items}{rounds}{wakes}{came}"
            console.print(line, highlight=False, markup=False)
            if errors and step.error:
                error = step.error
                problem = f"    {error.get('code')}: {error.get('message')}"
                console.print(problem, highlight=False, markup=False)


def print_outcome(view: Any) -> None:
    colour = {"succeeded": "green", "failed": "red"}.get(view.job.status, "yellow")
    console.print(f"job {view.job.id}: [{colour}]{view.job.status}[/{colour}]")
    if view.job.error:
        console.print(f"  {view.job.error.get('message')}", markup=False)
    if view.compensation:
        console.print(f"  compensation {view.compensation['status']}:")
        for undo in view.compensation["steps"]:
            console.print(f"    {undo['step_id']:<22} {undo['status']}", markup=False)
    if view.job.result is not None:
        console.print_json(data=view.job.result)


def _local_processes(settings: Settings, job_id: uuid.UUID) -> list[list[str]]:
    """The processes one run starts: a worker that consumes every queue the job's steps name,
    as well as the ones it was told, since nobody else may be there to take a step of a named
    pool; and, for a job with a wait or a pipeline.run step, a beat replica, the one process
    that wakes a wait and starts a child (where another replica leads, this one stands by)."""
    from service.language.snapshots import job_profile

    profile = job_profile(view_job(settings, job_id).job)
    named = {profile.queue_of(step.id) for step in profile.steps}
    os.environ["FLOWBEAT_WORKER_QUEUES"] = ",".join(sorted({*settings.worker_queues, *named}))
    commands = [worker_argv(2, "prefork")]
    if any(step.action in (WAIT_ACTION, PIPELINE_RUN_ACTION) for step in profile.steps):
        commands.append(flowbeat_argv("beat"))
    return commands


def view_job(settings: Settings, job_id: uuid.UUID) -> Any:
    from service.engine.jobs import get_job, job_view

    sessions = sessions_of(settings)
    with unit_of_work(sessions) as session:
        return job_view(session, get_job(session, job_id))


def follow_job(settings: Settings, job_id: uuid.UUID, timeout_s: float) -> str:
    from service.engine.watch import follow

    status = follow(settings, job_id, timeout_s, console)
    if status == "timeout":
        console.print(f"[red]gave up waiting after {timeout_s:.0f}s[/red]")
    else:
        print_outcome(view_job(settings, job_id))
    return status
