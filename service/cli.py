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
    target: Annotated[str, typer.Argument(help="a profile name in profiles/ or a YAML file")],
    param: Annotated[list[str], typer.Option("-p", "--param", help="key=value")] = [],  # noqa: B006
    wait: Annotated[bool, typer.Option(help="follow the job until it ends")] = True,
    local_worker: Annotated[
        bool | None, typer.Option(help="start a worker for this run (default: embedded only)")
    ] = None,
    timeout_s: float = 600.0,
) -> None:
    """Run a pipeline once and follow its steps; exits non-zero when the job fails."""
    embedded = not (get_settings().database_url and get_settings().broker_url)
    settings = _settings()
    _migrate(settings)
    job_id = _submit(settings, _pipeline_ref(target), _parse_params(param))
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
    settings: Settings, pipeline: str | dict[str, Any], params: dict[str, Any]
) -> uuid.UUID:
    from service.jobs import JobRequest, submit_job
    from service.plan import load_plan
    from service.runtime import Runtime
    from tasks.app import app
    from tasks.dispatch import publish_new_job

    rt = Runtime.start(settings)
    try:
        with unit_of_work(rt.sessions) as session:
            job, _ = submit_job(
                session,
                JobRequest(pipeline=pipeline, params=params, trigger="cli"),
                owner="cli",
                profiles_dir=settings.profiles_dir,
                known_actions=rt.registry.names(),
            )
        with unit_of_work(rt.sessions) as session:
            plan = load_plan(session, job.id)
    except FlowbeatError as exc:
        console.print(f"[red]{exc.code}[/red]: {exc.message}")
        for problem in exc.details.get("errors", []):
            console.print(f"  - {problem}")
        raise typer.Exit(code=2) from exc
    if plan is not None:
        publish_new_job(app, rt, plan)
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


if __name__ == "__main__":
    main()
