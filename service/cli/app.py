"""The command's typer apps, its console, and what every command shares: settings, refusals
and the ``--json`` output of listings.

Exit codes: 0 when the command did what it was asked, 1 when what it followed failed (a job, a
leader check), 2 for a refusal with an error code or a bad option (typer's usage error).
"""

import json
import os
from typing import TYPE_CHECKING, Annotated, Any

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.markup import escape

from service.platform.audit import Actor
from service.platform.errors import FlowbeatError, PayloadInvalid
from service.platform.settings import Settings, get_settings

if TYPE_CHECKING:
    from celery import Celery

cli = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    help=(
        "flowbeat job pipelines. Commands act as --owner, else FLOWBEAT_CLI_OWNER, else the "
        "owner of the key FLOWBEAT_API_KEY, else 'dev' (the owner of the key flowbeat dev "
        "prints) in the embedded default and 'default' with FLOWBEAT_DATABASE_URL and "
        "FLOWBEAT_BROKER_URL set."
    ),
)
keys_cli = typer.Typer(no_args_is_help=True, help="API keys")
jobs_cli = typer.Typer(no_args_is_help=True, help="Jobs")
pipelines_cli = typer.Typer(no_args_is_help=True, help="Saved pipelines")
schedules_cli = typer.Typer(no_args_is_help=True, help="Schedules")
alerts_cli = typer.Typer(no_args_is_help=True, help="Alert rules and their deliveries")
cli.add_typer(keys_cli, name="keys")
cli.add_typer(jobs_cli, name="jobs")
cli.add_typer(pipelines_cli, name="pipelines")
cli.add_typer(schedules_cli, name="schedules")
cli.add_typer(alerts_cli, name="alerts")
console = Console()
console.soft_wrap = not console.is_terminal
"""Without a terminal a line is printed whole, never broken at the 80 columns rich assumes
for a pipe, so a grep of a message finds it; ``service.cli.tables`` does the same for tables."""

JsonOption = Annotated[
    bool, typer.Option("--json", help="one JSON document on stdout, with stable keys, for scripts")
]

OwnerOption = Annotated[
    str | None,
    typer.Option(
        help="whose; default: FLOWBEAT_CLI_OWNER, or FLOWBEAT_API_KEY's owner "
        "('dev' embedded, else 'default')"
    ),
]
DEV_OWNER = "dev"
DEFAULT_OWNER = "default"

FINAL = {"succeeded", "failed", "cancelled"}
EXIT_REFUSED = 2
"""A refusal with an error code (bad input, an unknown job, a bad setting), as for a bad option."""


def main() -> None:
    """A refusal, or a setting the command cannot start with, is an answer, not a bug: it prints
    its code and message, never a traceback."""
    try:
        cli()
    except FlowbeatError as exc:
        print_refusal(exc)
        raise SystemExit(EXIT_REFUSED) from None
    except ValidationError as exc:
        if exc.title != Settings.__name__:
            raise
        for error in exc.errors(include_url=False):
            field = "_".join(str(part) for part in error["loc"]).upper()
            message = error["msg"].removeprefix("Value error, ")
            console.print(
                f"[red]settings_invalid[/red]: FLOWBEAT_{field}: {escape(message)}",
                highlight=False,
            )
        raise SystemExit(EXIT_REFUSED) from None


def print_refusal(exc: FlowbeatError) -> None:
    """One line for the refusal, unwrapped, so a script or a grep sees its code and position
    together; messages quote what the user gave (file names, profile text,
    ``flowbeat[embedded]``), which rich would otherwise read as markup and drop. The message
    already states the first problem, so only the further ones get a line of their own."""
    console.print(f"[red]{exc.code}[/red]: {escape(exc.message)}", highlight=False, soft_wrap=True)
    for problem in exc.details.get("errors", [])[1:]:
        console.print(f"  - {problem_line(problem)}", highlight=False, markup=False, soft_wrap=True)


def problem_line(problem: dict[str, Any]) -> str:
    """A further problem of a refusal as its step and field, then its message."""
    where = [f"{key} {problem[key]!r}" for key in ("step", "field", "param") if problem.get(key)]
    return f"{' '.join(where)}: {problem['message']}" if where else str(problem["message"])


def parse_json_option(raw: str | None, option: str) -> Any:
    """The JSON an option carries, or ``payload_invalid`` with the line and column, the one
    line any parse error of the command prints, rather than a traceback or a usage box."""
    if raw is None:
        return None
    try:
        return json.loads(raw)
    except json.JSONDecodeError as exc:
        raise PayloadInvalid(
            f"{option}: invalid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}",
            {"line": exc.lineno, "column": exc.colno},
        ) from None


def load_settings() -> Settings:
    """Settings from the environment; with neither server set, the embedded default, its
    schema brought up to date, so any command works on a data directory made a moment ago."""
    settings = get_settings()
    if settings.embedded():
        from service.platform.embedded import start_embedded

        servers = start_embedded(settings.data_dir)
        os.environ["FLOWBEAT_DATABASE_URL"] = servers.database_url
        os.environ["FLOWBEAT_BROKER_URL"] = servers.broker_url
        get_settings.cache_clear()
        embedded = get_settings()
        migrate_schema(embedded)
        owner = _key_owner(embedded) or DEV_OWNER
        return embedded.model_copy(update={"cli_owner": embedded.cli_owner or owner})
    if settings.cli_owner is None and settings.api_key is not None:
        return settings.model_copy(update={"cli_owner": _key_owner(settings)})
    return settings


def _key_owner(settings: Settings) -> str | None:
    """The owner of ``FLOWBEAT_API_KEY``, the same check the API makes of it, so the command
    and a client of that key act on the same pipelines and schedules."""
    if settings.api_key is None:
        return None
    from service.platform.auth import authenticate
    from service.platform.db import sessions_of, unit_of_work

    with unit_of_work(sessions_of(settings)) as session:
        return authenticate(session, settings.api_key.get_secret_value()).owner


def acting_owner(settings: Settings, given: str | None) -> str:
    """``--owner`` when given, else the owner ``load_settings`` resolved for this mode."""
    return given or settings.cli_owner or DEFAULT_OWNER


def cli_actor(settings: Settings, command: str, owner: str | None = None) -> Actor:
    """The audit trail's actor of a command: the OS user, acting as ``--owner`` or the
    command's default owner."""
    return Actor.of_cli(command, acting_owner(settings, owner))


def celery_app(settings: Settings) -> "Celery":
    """A Celery app on the broker of ``settings``, which must come from ``load_settings``: the
    embedded default's broker is known only once its servers run, so an app built earlier,
    from the environment, has no broker (and ``create_celery`` refuses to build it)."""
    from tasks.app import create_celery

    return create_celery(settings)


def migrate_schema(settings: Settings) -> None:
    from service.platform.migrate import upgrade

    upgrade(settings.require_database_url())


def emit_json(document: Any) -> None:
    """Plain ``print``, not the console: rich would wrap long lines and colour the text."""
    typer.echo(json.dumps(document, default=str, sort_keys=True))
