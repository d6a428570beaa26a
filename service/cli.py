"""The ``flowbeat`` command.

This module is the composition root: it is the one place in ``service/`` that starts the API,
the Celery worker and beat, and it does so through subprocesses or imports inside the command
that needs them, so the rest of ``service/`` stays free of FastAPI and Celery.
"""

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml
from rich.console import Console
from rich.table import Table

from service.db import make_engine, make_session_factory, unit_of_work
from service.errors import FlowbeatError
from service.settings import Settings, get_settings

cli = typer.Typer(no_args_is_help=True, add_completion=False, help="flowbeat job pipelines")
keys_cli = typer.Typer(no_args_is_help=True, help="API keys")
jobs_cli = typer.Typer(no_args_is_help=True, help="Jobs")
cli.add_typer(keys_cli, name="keys")
cli.add_typer(jobs_cli, name="jobs")
pipelines_cli = typer.Typer(no_args_is_help=True, help="Saved pipelines")
cli.add_typer(pipelines_cli, name="pipelines")
console = Console()

FINAL = {"succeeded", "failed", "cancelled"}


def main() -> None:
    cli()


def _settings() -> Settings:
    """Settings from the environment; with no servers configured, the embedded default."""
    settings = get_settings()
    if settings.database_url and settings.broker_url:
        return settings
    from service.embedded import start_embedded

    servers = start_embedded(settings.data_dir)
    os.environ["FLOWBEAT_DATABASE_URL"] = servers.database_url
    os.environ["FLOWBEAT_BROKER_URL"] = servers.broker_url
    get_settings.cache_clear()
    return get_settings()


def _migrate(settings: Settings) -> None:
    from service.migrate import upgrade

    upgrade(settings.require_database_url())


@cli.command()
def migrate() -> None:
    """Bring the database schema up to date (Alembic)."""
    _migrate(_settings())
    console.print("[green]database is up to date[/green]")


@cli.command()
def api(host: str = "127.0.0.1", port: int = 8000) -> None:
    """Serve the REST API."""
    _settings()
    import uvicorn

    uvicorn.run("api.app:app_from_env", factory=True, host=host, port=port)


def _worker_argv(concurrency: int | None, pool: str) -> list[str]:
    argv = [sys.executable, "-m", "celery", "-A", "tasks.app", "worker", "--loglevel=INFO"]
    argv += [f"--pool={pool}", "-E"]
    if concurrency:
        argv.append(f"--concurrency={concurrency}")
    return argv


@cli.command()
def worker(
    concurrency: Annotated[int | None, typer.Option(help="processes")] = None,
    pool: str = "prefork",
) -> None:
    """Run a Celery worker for pipeline steps."""
    _settings()
    os.execv(sys.executable, _worker_argv(concurrency, pool))


@cli.command()
def beat(
    check: Annotated[
        bool, typer.Option("--check", help="print the leader lock; exit 1 if nobody holds it")
    ] = False,
) -> None:
    """Run celery beat with the schedule scheduler (one leader among replicas), or check it."""
    settings = _settings()
    if check:
        raise typer.Exit(code=_beat_check(settings))
    schedule = settings.data_dir / "celerybeat-schedule"
    schedule.parent.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "celery", "-A", "tasks.app", "beat", f"--schedule={schedule}"]
    argv += ["-S", "scheduler.beat:FlowbeatScheduler", "--loglevel=INFO"]
    os.execv(sys.executable, argv)


def _beat_check(settings: Settings) -> int:
    import redis

    from scheduler.lock import inspect
    from service.constants import BEAT_LOCK_KEY

    client = redis.Redis.from_url(settings.require_broker_url(), socket_timeout=5)
    try:
        state = inspect(client, BEAT_LOCK_KEY)
    except redis.RedisError as exc:
        console.print(f"[red]broker unreachable[/red]: {exc}")
        return 1
    finally:
        client.close()
    if state.holder is None:
        console.print(f"[red]no leader[/red]: {BEAT_LOCK_KEY} is not held")
        return 1
    console.print(f"leader {state.holder}, lock expires in {state.ttl_ms / 1000:.1f}s")
    console.print(f"lock TTL {settings.beat_lock_ttl_s:.0f}s, renewed every tick by its holder")
    return 0


@contextmanager
def _processes(
    commands: list[list[str]], log: Path | None = None
) -> Iterator[list[subprocess.Popen[bytes]]]:
    """Child processes for the duration of a command; with ``log``, their output goes there."""
    if log:
        log.parent.mkdir(parents=True, exist_ok=True)
    sink = log.open("ab") if log else None
    procs = [
        subprocess.Popen(command, env=os.environ.copy(), stdout=sink, stderr=sink)
        for command in commands
    ]
    try:
        yield procs
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
        if sink:
            sink.close()


def _flowbeat(*args: str) -> list[str]:
    return [sys.executable, "-m", "service.cli", *args]


@cli.command()
def dev(host: str = "127.0.0.1", port: int = 8000) -> None:
    """Everything on one machine: database, broker, API, a worker and beat."""
    settings = _settings()
    _migrate(settings)
    key = _ensure_dev_key(settings)
    if key:
        console.print(f"admin API key (shown once): [bold]{key}[/bold]")
    console.print(f"API on http://{host}:{port}  (Ctrl-C stops everything)")
    commands = [
        _flowbeat("api", "--host", host, "--port", str(port)),
        _worker_argv(None, "prefork"),
        _flowbeat("beat"),
    ]
    with _processes(commands) as procs:
        try:
            while all(proc.poll() is None for proc in procs):
                time.sleep(0.5)
        except KeyboardInterrupt:
            console.print("stopping")


def _ensure_dev_key(settings: Settings) -> str | None:
    from sqlalchemy import select

    from service.auth import create_api_key
    from service.models import ApiKeyRow

    sessions = make_session_factory(make_engine(settings.require_database_url()))
    with unit_of_work(sessions) as session:
        if session.scalars(select(ApiKeyRow.id).where(ApiKeyRow.owner == "dev")).first():
            return None
        key, _ = create_api_key(session, owner="dev", scopes=["admin"])
        return key


def _parse_params(pairs: list[str]) -> dict[str, Any]:
    params: dict[str, Any] = {}
    for pair in pairs:
        name, sep, raw = pair.partition("=")
        if not sep or not name:
            raise typer.BadParameter(f"expected key=value, got {pair!r}")
        params[name] = yaml.safe_load(raw) if raw else ""
    return params


def _pipeline_ref(target: str) -> str | dict[str, Any]:
    path = Path(target)
    if path.suffix in {".yaml", ".yml", ".json"} or path.exists():
        if not path.is_file():
            raise typer.BadParameter(f"no such file: {target}")
        document = yaml.safe_load(path.read_text())
        if not isinstance(document, dict):
            raise typer.BadParameter(f"{target} is not a YAML mapping")
        return document
    return target


@cli.command()
def run(
    target: Annotated[
        str, typer.Argument(help="a saved pipeline, a profile in profiles/, or a YAML file")
    ],
    param: Annotated[list[str], typer.Option("-p", "--param", help="key=value")] = [],  # noqa: B006
    wait: Annotated[bool, typer.Option(help="follow the job until it ends")] = True,
    local_worker: Annotated[
        bool | None, typer.Option(help="start a worker for this run (default: embedded only)")
    ] = None,
    timeout_s: float = 600.0,
    owner: Annotated[str, typer.Option(help="whose saved pipelines a name can resolve to")] = (
        "default"
    ),
) -> None:
    """Run a pipeline once and follow its steps; exits non-zero when the job fails."""
    embedded = not (get_settings().database_url and get_settings().broker_url)
    settings = _settings()
    _migrate(settings)
    job_id = _submit(settings, _pipeline_ref(target), _parse_params(param), owner)
    console.print(f"job [bold]{job_id}[/bold] queued")
    if not wait:
        return
    commands = (
        [_worker_argv(2, "prefork")]
        if (local_worker or (local_worker is None and embedded))
        else []
    )
    if commands:
        console.print(f"worker log: {settings.data_dir / 'worker.log'}")
    with _processes(commands, settings.data_dir / "worker.log"):
        status = _follow(settings, job_id, timeout_s)
    raise typer.Exit(code=0 if status == "succeeded" else 1)


def _submit(
    settings: Settings, pipeline: str | dict[str, Any], params: dict[str, Any], owner: str
) -> uuid.UUID:
    from service.jobs import JobRequest, submit_job
    from service.plan import initial_plan
    from service.runtime import Runtime
    from service.snapshots import job_profile
    from tasks.app import app
    from tasks.dispatch import publish_new_job

    rt = Runtime.start(settings)
    try:
        with unit_of_work(rt.sessions) as session:
            job, _ = submit_job(
                session,
                JobRequest(pipeline=pipeline, params=params, trigger="cli"),
                owner=owner,
                profiles_dir=settings.profiles_dir,
                known_actions=rt.registry.names(),
            )
    except FlowbeatError as exc:
        console.print(f"[red]{exc.code}[/red]: {exc.message}")
        for problem in exc.details.get("errors", []):
            console.print(f"  - {problem}")
        raise typer.Exit(code=2) from exc
    publish_new_job(app, rt, initial_plan(job_profile(job), job.id))
    return job.id


def _print_changes(view: Any, seen: dict[str, str]) -> None:
    for step in view.steps:
        if seen.get(step.step_id) != step.status:
            seen[step.step_id] = step.status
            shards = step.shards or {}
            items = f" ({shards.get('succeeded', 0)}/{shards['total']} items)" if shards else ""
            console.print(f"  {step.step_id:<24} {step.status}{items}")


def _print_outcome(view: Any) -> None:
    colour = {"succeeded": "green", "failed": "red"}.get(view.job.status, "yellow")
    console.print(f"job {view.job.id}: [{colour}]{view.job.status}[/{colour}]")
    if view.job.error:
        console.print(f"  {view.job.error.get('message')}")
    if view.job.result is not None:
        console.print_json(data=view.job.result)


def _view(settings: Settings, job_id: uuid.UUID) -> Any:
    from service.jobs import get_job, job_view

    sessions = make_session_factory(make_engine(settings.require_database_url()))
    with unit_of_work(sessions) as session:
        return job_view(session, get_job(session, job_id))


def _follow(settings: Settings, job_id: uuid.UUID, timeout_s: float) -> str:
    seen: dict[str, str] = {}
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        view = _view(settings, job_id)
        _print_changes(view, seen)
        if view.job.status in FINAL:
            _print_outcome(view)
            return str(view.job.status)
        time.sleep(0.3)
    console.print(f"[red]gave up waiting after {timeout_s:.0f}s[/red]")
    return "timeout"


@keys_cli.command("create")
def keys_create(
    scopes: Annotated[str, typer.Option(help="comma-separated: read,write,admin")] = "read",
    owner: Annotated[str, typer.Option(help="who the key acts for")] = "default",
) -> None:
    """Create an API key; it is printed once and stored hashed."""
    from service.auth import create_api_key

    settings = _settings()
    sessions = make_session_factory(make_engine(settings.require_database_url()))
    wanted = [scope.strip() for scope in scopes.split(",") if scope.strip()]
    try:
        with unit_of_work(sessions) as session:
            key, _ = create_api_key(session, owner=owner, scopes=wanted)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc
    typer.echo(key)


@jobs_cli.command("list")
def jobs_list(pipeline: str | None = None, status: str | None = None, limit: int = 20) -> None:
    """The newest jobs."""
    from service.jobs import list_jobs

    settings = _settings()
    sessions = make_session_factory(make_engine(settings.require_database_url()))
    with unit_of_work(sessions) as session:
        rows, _ = list_jobs(
            session,
            owner=None,
            pipeline=pipeline,
            statuses=[status] if status else [],
            limit=limit,
        )
    table = Table("id", "pipeline", "status", "trigger", "created")
    for job in rows:
        table.add_row(
            str(job.id), job.pipeline, job.status, job.trigger, job.created_at.isoformat()
        )
    console.print(table)


@jobs_cli.command("show")
def jobs_show(job_id: uuid.UUID) -> None:
    """One job with its steps."""
    view = _view(_settings(), job_id)
    _print_changes(view, {})
    if view.job.status in FINAL:
        _print_outcome(view)
    else:
        console.print(f"job {job_id}: {view.job.status}")


OwnerOption = Annotated[str, typer.Option(help="whose pipelines")]


@contextmanager
def _pipeline_session(settings: Settings) -> Iterator[Any]:
    """One unit of work; a refused request prints its code and exits 2, like ``run``."""
    from service.runtime import Runtime

    rt = Runtime.start(settings)
    try:
        with unit_of_work(rt.sessions) as session:
            yield session, rt
    except FlowbeatError as exc:
        console.print(f"[red]{exc.code}[/red]: {exc.message}")
        for problem in exc.details.get("errors", []):
            console.print(f"  - {problem}")
        raise typer.Exit(code=2) from exc
    finally:
        rt.sessions.kw["bind"].dispose()


def _print_saved(outcome: Any) -> None:
    view = outcome.view
    verb = "saved as a new version" if outcome.created_version else "unchanged"
    console.print(f"{view.name} v{view.version} ({view.content_hash[:12]}): {verb}")


@pipelines_cli.command("save")
def pipelines_save(
    file: Annotated[Path, typer.Argument(help="a YAML or JSON profile", exists=True)],
    name: Annotated[str | None, typer.Option(help="must match the profile's name")] = None,
    owner: OwnerOption = "default",
) -> None:
    """Save a profile file as a pipeline; an unchanged file makes no new version."""
    from service.pipelines import save_pipeline

    settings = _settings()
    with _pipeline_session(settings) as (session, rt):
        outcome = save_pipeline(
            session,
            owner=owner,
            name=name,
            body=file.read_text(encoding="utf-8"),
            profiles_dir=settings.profiles_dir,
            known_actions=rt.registry.names(),
        )
    _print_saved(outcome)


@pipelines_cli.command("list")
def pipelines_list(tag: str | None = None, owner: OwnerOption = "default") -> None:
    """Own, shared and shipped pipelines with their run counts."""
    from service.pipelines import list_pipelines

    settings = _settings()
    with _pipeline_session(settings) as (session, _):
        views = list_pipelines(session, viewer=owner, profiles_dir=settings.profiles_dir, tag=tag)
    table = Table("name", "owner", "version", "tags", "runs", "read-only")
    for view in views:
        version = "-" if view.version is None else str(view.version)
        table.add_row(
            view.name,
            view.owner,
            version,
            ",".join(view.tags),
            str(view.run_count),
            "yes" if view.read_only else "",
        )
    console.print(table)


@pipelines_cli.command("show")
def pipelines_show(name: str, version: int | None = None, owner: OwnerOption = "default") -> None:
    """A pipeline's profile as YAML, its current version unless ``--version`` is given."""
    from service.pipelines import get_pipeline

    settings = _settings()
    with _pipeline_session(settings) as (session, _):
        view = get_pipeline(
            session, name, viewer=owner, profiles_dir=settings.profiles_dir, version=version
        )
    console.print(f"# {view.name} v{view.version or '-'} by {view.owner} ({view.content_hash})")
    typer.echo(yaml.safe_dump(view.profile.to_json(), sort_keys=False))


@pipelines_cli.command("delete")
def pipelines_delete(
    name: str,
    purge_history: Annotated[bool, typer.Option(help="delete its jobs too")] = False,
    owner: OwnerOption = "default",
) -> None:
    """Delete a pipeline with its versions and schedule; its jobs only with --purge-history."""
    from service.pipelines import delete_pipeline

    settings = _settings()
    with _pipeline_session(settings) as (session, _):
        purged = delete_pipeline(
            session,
            name,
            viewer=owner,
            profiles_dir=settings.profiles_dir,
            purge_history=purge_history,
        )
    console.print(f"deleted {name} ({purged} jobs purged)")


@pipelines_cli.command("import")
def pipelines_import(
    url: Annotated[str | None, typer.Option(help="an https URL on the allow-list")] = None,
    path: Annotated[str | None, typer.Option(help="a file in FLOWBEAT_IMPORT_DIR")] = None,
    name: Annotated[str | None, typer.Option(help="must match the profile's name")] = None,
    owner: OwnerOption = "default",
) -> None:
    """Import a profile under the same rules as the API's import."""
    from service.imports import UrlPolicy, fetch_url, read_import_file
    from service.pipelines import save_pipeline

    if (url is None) == (path is None):
        raise typer.BadParameter("give exactly one of --url and --path")
    settings = _settings()
    with _pipeline_session(settings) as (session, rt):
        if url is not None:
            text = fetch_url(url, UrlPolicy.from_settings(settings))
        else:
            assert path is not None
            text = read_import_file(path, settings.import_dir, settings.import_max_bytes)
        outcome = save_pipeline(
            session,
            owner=owner,
            name=name,
            body=text,
            profiles_dir=settings.profiles_dir,
            known_actions=rt.registry.names(),
        )
    _print_saved(outcome)


if __name__ == "__main__":
    main()
