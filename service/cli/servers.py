"""The long-running processes: migrate, api, worker, beat, and dev which runs them together.

They start the API, the Celery worker and beat through subprocesses or imports inside the
command, so the rest of ``service/`` stays free of FastAPI and Celery.
"""

import os
import re
import signal
import sys
from types import FrameType
from typing import Annotated

import typer
from rich.markup import escape

from service.cli.app import (
    acting_owner,
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
    await_first_exit,
    flowbeat_argv,
    processes,
    stoppable,
    worker_argv,
)
from service.platform.constants import QUEUE_PATTERN
from service.platform.db import sessions_of, unit_of_work
from service.platform.errors import MetricsTokenRequired
from service.platform.metrics import MULTIPROC_ENV, fresh_multiproc_dir, serve_refusal
from service.platform.settings import Settings, get_settings


@cli.command()
def migrate() -> None:
    """Bring the database schema up to date (Alembic)."""
    migrate_schema(load_settings())
    console.print("[green]database is up to date[/green]")


@cli.command()
def api(host: str = "127.0.0.1", port: int = 8000) -> None:
    """Serve the REST API."""
    settings = load_settings()
    import uvicorn

    signal.signal(signal.SIGTERM, _exit_on_signal)
    uvicorn.run(
        "api.app:app_from_env",
        factory=True,
        host=host,
        port=port,
        log_config=None,
        proxy_headers=True,
        forwarded_allow_ips=settings.forwarded_allow_ips,
        timeout_graceful_shutdown=settings.api_shutdown_grace_s,
    )


def _exit_on_signal(signum: int, frame: FrameType | None) -> None:
    """uvicorn raises the SIGTERM it caught again once it has shut down, to die of it. Exiting
    instead (with the status a shell gives that death) lets the API's log writer thread write
    uvicorn's last lines first (``logs.configure(background=True)``)."""
    raise SystemExit(128 + signum)


@cli.command()
def worker(
    concurrency: Annotated[int | None, typer.Option(help="processes")] = None,
    pool: str = "prefork",
    queues: Annotated[
        str | None,
        typer.Option(help="the queues to consume, comma-separated (default: default)"),
    ] = None,
) -> None:
    """Run a Celery worker for pipeline steps."""
    if queues is not None:
        os.environ["FLOWBEAT_WORKER_QUEUES"] = ",".join(_queue_names(queues))
    settings = load_settings()
    _check_secrets(settings)
    if pool != "prefork":
        typer.echo(
            f"warning: the {pool} pool does not hold steps to their timeout_s; only prefork "
            "does (see the operations guide, The worker's pool)",
            err=True,
        )
    if settings.worker_metrics_port:
        _check_exporter(settings)
        files = settings.data_dir / f"worker-metrics-{settings.worker_metrics_port}"
        os.environ[MULTIPROC_ENV] = str(fresh_multiproc_dir(files.resolve()))
    os.execv(sys.executable, worker_argv(concurrency, pool))


def _queue_names(queues: str) -> list[str]:
    names = [name.strip() for name in queues.split(",") if name.strip()]
    bad = [name for name in names if not re.fullmatch(QUEUE_PATTERN, name)]
    if bad or not names:
        raise typer.BadParameter(
            f"not a queue name: {', '.join(bad) or repr(queues)} (lowercase letters, digits, "
            "_ and -, at most 40)",
            param_hint="--queues",
        )
    return names


def _check_exporter(settings: Settings) -> None:
    token = settings.metrics_token.get_secret_value() if settings.metrics_token else None
    refusal = serve_refusal(settings.metrics_host, token)
    if refusal is not None:
        print_refusal(MetricsTokenRequired(refusal, {"host": settings.metrics_host}))
        raise typer.Exit(code=2)


@cli.command()
def beat(
    check: Annotated[
        bool, typer.Option("--check", help="print the leader lock; exit 1 if nobody holds it")
    ] = False,
) -> None:
    """Run celery beat with the schedule scheduler (one leader among replicas), or check it."""
    settings = load_settings()
    if check:
        raise typer.Exit(code=_beat_check(settings))
    if settings.beat_metrics_port:
        _check_exporter(settings)
    schedule = settings.data_dir / "celerybeat-schedule"
    schedule.parent.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "celery", "-A", "tasks.app", "beat", f"--schedule={schedule}"]
    argv += ["-S", "scheduler.beat:FlowbeatScheduler", "--loglevel=INFO"]
    os.execv(sys.executable, argv)


def _beat_check(settings: Settings) -> int:
    import redis

    from scheduler.lock import inspect
    from service.platform.brokers import redis_client
    from service.platform.constants import BEAT_LOCK_KEY

    client = redis_client(settings.broker(), socket_timeout=5)
    try:
        state = inspect(client, BEAT_LOCK_KEY)
    except redis.RedisError as exc:
        console.print(f"[red]broker unreachable[/red]: {escape(str(exc))}")
        return 1
    finally:
        client.close()
    if state.holder is None:
        console.print(f"[red]no leader[/red]: {BEAT_LOCK_KEY} is not held")
        return 1
    console.print(f"leader {state.holder}, lock expires in {state.ttl_ms / 1000:.1f}s")
    console.print(f"lock TTL {settings.beat_lock_ttl_s:.0f}s, renewed every tick by its holder")
    return 0


@cli.command()
def dev(host: str = "127.0.0.1", port: int = 8000) -> None:
    """Everything on one machine: database, broker, API, a worker and beat.

    Their logs go to a file, so the admin key printed at the first start stays on screen.
    """
    adopt_orphans()
    settings = load_settings()
    migrate_schema(settings)
    _check_actions(settings)
    key = _ensure_dev_key(settings)
    log = settings.data_dir / "dev.log"
    commands = {
        "api": flowbeat_argv("api", "--host", host, "--port", str(port)),
        "worker": worker_argv(None, "prefork"),
        "beat": flowbeat_argv("beat"),
    }
    with stoppable(), processes(list(commands.values()), log) as procs:
        if key:
            console.print(f"admin API key (shown once): [bold]{key}[/bold]")
        else:
            console.print(
                "admin API key: printed at the first start "
                "(flowbeat keys create --scopes read,write,admin makes another)"
            )
        console.print(f"API on http://{host}:{port}, logs in {log}")
        console.print("Ctrl-C stops the API, worker and beat; flowbeat stop stops the servers")
        try:
            exited = await_first_exit(procs)
            name = list(commands)[procs.index(exited)]
            console.print(f"[red]the {name} exited ({exited.returncode})[/red]; see {log}")
        except (KeyboardInterrupt, Stop):
            console.print("stopping")


def _check_actions(settings: Settings) -> None:
    """Refuse to start processes that would each die importing an action module."""
    from service.actions import REGISTRY, load_plugins

    load_plugins(REGISTRY, settings.action_modules)
    _check_secrets(settings)


def _check_secrets(settings: Settings) -> None:
    """Refuse to start a worker whose pool processes would each fail to build the secrets
    source the settings name (they build it on their first step, after the fork)."""
    from service.platform.secrets import SecretSourceInvalid, secrets_of

    try:
        secrets_of(settings)
    except SecretSourceInvalid as exc:
        console.print(f"secret_source_invalid: {exc}", highlight=False, markup=False)
        raise typer.Exit(code=2) from None


def _ensure_dev_key(settings: Settings) -> str | None:
    from sqlalchemy import select

    from service.platform.audit import record_key
    from service.platform.auth import create_api_key
    from service.platform.models import ApiKeyRow

    sessions = sessions_of(settings)
    with unit_of_work(sessions) as session:
        owner = acting_owner(settings, None)
        if session.scalars(select(ApiKeyRow.id).where(ApiKeyRow.owner == owner)).first():
            return None
        key, row = create_api_key(session, owner=owner, scopes=["admin"])
        record_key(session, cli_actor(settings, "dev"), "key.create", row.prefix, owner=owner)
        return key


@cli.command()
def stop() -> None:
    """Stop the embedded PostgreSQL and Redis of FLOWBEAT_DATA_DIR (``make clean`` runs it)."""
    from service.platform.embedded import stop_embedded

    data_dir = get_settings().data_dir
    stop_embedded(data_dir)
    console.print(f"embedded servers of {data_dir} stopped")
