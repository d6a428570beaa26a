"""``flowbeat pipelines``: save, list, show, delete and import saved pipelines, and the diff of
a pipeline's last run against the run before it."""

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
import yaml

from service.cli.app import (
    JsonOption,
    OwnerOption,
    acting_owner,
    cli_actor,
    console,
    emit_json,
    load_settings,
    pipelines_cli,
    print_refusal,
)
from service.cli.tables import print_table
from service.platform.audit import Actor, Target, record, saved_event
from service.platform.db import unit_of_work
from service.platform.errors import FlowbeatError
from service.platform.settings import Settings

if TYPE_CHECKING:
    from service.catalogue.pipelines import PipelineView


@contextmanager
def _pipeline_session(settings: Settings) -> Iterator[Any]:
    """One unit of work; a refused request prints its code and exits 2, like ``run``."""
    from service.engine.runtime import Runtime

    rt = Runtime.start(settings)
    try:
        with unit_of_work(rt.sessions) as session:
            yield session, rt
    except FlowbeatError as exc:
        print_refusal(exc)
        raise typer.Exit(code=2) from exc
    finally:
        rt.sessions.kw["bind"].dispose()


def _print_saved(outcome: Any) -> None:
    view = outcome.view
    verb = "saved as a new version" if outcome.created_version else "unchanged"
    console.print(f"{view.name} v{view.version} ({view.content_hash[:12]}): {verb}", markup=False)


def _record_saved(
    session: Any,
    actor: Actor,
    outcome: Any,
    action: str = "pipeline.save",
    source: str | None = None,
) -> None:
    """Only a new version is a change: saving unchanged content records nothing."""
    if outcome.created_version:
        view = outcome.view
        record(session, actor, action, *saved_event(view.name, view.owner, view.version, source))


@pipelines_cli.command("save")
def pipelines_save(
    file: Annotated[Path, typer.Argument(help="a YAML or JSON profile", exists=True)],
    name: Annotated[str | None, typer.Option(help="must match the profile's name")] = None,
    owner: OwnerOption = None,
) -> None:
    """Save a profile file as a pipeline; an unchanged file makes no new version."""
    from service.catalogue.saving import save_pipeline

    settings = load_settings()
    with _pipeline_session(settings) as (session, rt):
        outcome = save_pipeline(
            session,
            owner=acting_owner(settings, owner),
            name=name,
            body=file.read_text(encoding="utf-8"),
            settings=settings,
            known_actions=rt.registry.names(),
        )
        _record_saved(session, cli_actor(settings, "pipelines save", owner), outcome)
    _print_saved(outcome)


def pipeline_document(view: "PipelineView") -> dict[str, Any]:
    """A pipeline as ``--json`` prints it in a listing; ``show`` adds its profile and text."""
    return {
        "name": view.name,
        "owner": view.owner,
        "description": view.description,
        "tags": view.tags,
        "version": view.version,
        "content_hash": view.content_hash,
        "read_only": view.read_only,
        "run_count": view.run_count,
    }


@pipelines_cli.command("list")
def pipelines_list(
    tag: str | None = None, owner: OwnerOption = None, as_json: JsonOption = False
) -> None:
    """Own, shared and shipped pipelines with their run counts."""
    from service.catalogue.pipelines import list_pipelines

    settings = load_settings()
    with _pipeline_session(settings) as (session, _):
        views = list_pipelines(
            session,
            viewer=acting_owner(settings, owner),
            profiles_dir=settings.profiles_dir,
            tag=tag,
        )
    if as_json:
        emit_json({"pipelines": [pipeline_document(view) for view in views]})
        return
    rows = [
        [
            view.name,
            view.owner,
            "-" if view.version is None else str(view.version),
            ", ".join(view.tags),
            str(view.run_count),
            "yes" if view.read_only else "",
        ]
        for view in views
    ]
    headers = ["name", "owner", "version", "tags", "runs", "read-only"]
    print_table(headers, rows, whole={"name"}, keep=["version", "runs", "read-only"])


@pipelines_cli.command("show")
def pipelines_show(
    name: str, version: int | None = None, owner: OwnerOption = None, as_json: JsonOption = False
) -> None:
    """A pipeline's profile as it was saved (its YAML or JSON text, comments and all), its
    current version unless ``--version`` is given; re-serialised only for a version saved
    before the text was kept, or a profile file shipped with the server. With ``--json``,
    its listing's keys with ``profile`` (as parsed) and ``source`` (the text, or null)."""
    from service.catalogue.pipelines import get_pipeline

    settings = load_settings()
    with _pipeline_session(settings) as (session, _):
        view = get_pipeline(
            session,
            name,
            viewer=acting_owner(settings, owner),
            profiles_dir=settings.profiles_dir,
            version=version,
        )
    if as_json:
        profile = {"profile": view.profile.to_json(), "source": view.source}
        emit_json({"pipeline": {**pipeline_document(view), **profile}})
        return
    header = f"# {view.name} v{view.version or '-'} by {view.owner} ({view.content_hash})"
    console.print(header, markup=False)
    if view.source is not None:
        typer.echo(view.source, nl=not view.source.endswith("\n"))
    else:
        typer.echo(yaml.safe_dump(view.profile.to_json(), sort_keys=False))


@pipelines_cli.command("delete")
def pipelines_delete(
    name: str,
    purge_history: Annotated[bool, typer.Option(help="delete its jobs too")] = False,
    owner: OwnerOption = None,
) -> None:
    """Delete a pipeline with its versions and schedule; its jobs only with --purge-history."""
    from service.catalogue.saving import delete_pipeline

    settings = load_settings()
    with _pipeline_session(settings) as (session, _):
        purged = delete_pipeline(
            session,
            name,
            viewer=acting_owner(settings, owner),
            profiles_dir=settings.profiles_dir,
            purge_history=purge_history,
        )
        detail = {"owner": acting_owner(settings, owner), "purged_jobs": purged}
        actor = cli_actor(settings, "pipelines delete", owner)
        record(session, actor, "pipeline.delete", Target("pipeline", name), detail)
    console.print(f"deleted {name} ({purged} jobs purged)", markup=False)


@pipelines_cli.command("import")
def pipelines_import(
    url: Annotated[str | None, typer.Option(help="an https URL on the allow-list")] = None,
    path: Annotated[str | None, typer.Option(help="a file in FLOWBEAT_IMPORT_DIR")] = None,
    name: Annotated[str | None, typer.Option(help="must match the profile's name")] = None,
    owner: OwnerOption = None,
) -> None:
    """Import a profile under the same rules as the API's import."""
    from service.catalogue.imports import fetch_url, import_policy, read_import_file
    from service.catalogue.saving import save_pipeline

    if (url is None) == (path is None):
        raise typer.BadParameter("give exactly one of --url and --path")
    settings = load_settings()
    with _pipeline_session(settings) as (session, rt):
        if url is not None:
            text = fetch_url(url, import_policy(settings))
        else:
            assert path is not None
            text = read_import_file(path, settings.import_dir, settings.import_max_bytes)
        outcome = save_pipeline(
            session,
            owner=acting_owner(settings, owner),
            name=name,
            body=text,
            settings=settings,
            known_actions=rt.registry.names(),
        )
        actor = cli_actor(settings, "pipelines import", owner)
        _record_saved(session, actor, outcome, "pipeline.import", url or path)
    _print_saved(outcome)


@pipelines_cli.command("diff")
def pipelines_diff(
    name: str,
    kind: Annotated[str, typer.Option(help="new, removed or unchanged items")] = "new",
    limit: Annotated[int, typer.Option(min=1, help="at most this many items")] = 100,
    owner: OwnerOption = None,
    as_json: JsonOption = False,
) -> None:
    """The items of the pipeline's last successful run that the run before it did not have."""
    from service.catalogue.diffs import DiffKind, diff_counts, diff_page
    from service.engine.filters import JobFilter
    from service.engine.jobs import list_jobs
    from service.platform.errors import NoResultItems

    if kind not in set(DiffKind):
        raise typer.BadParameter(f"{kind!r}: one of {', '.join(DiffKind)}", param_hint="--kind")
    settings = load_settings()
    with _pipeline_session(settings) as (session, _):
        runs, _ = list_jobs(
            session,
            owner=acting_owner(settings, owner),
            match=JobFilter(pipeline=name, statuses=("succeeded",)),
            limit=1,
        )
        if not runs:
            raise NoResultItems(f"{name!r} has no successful run of {owner!r}", {"pipeline": name})
        last = runs[0]
        counts = diff_counts(session, last)
        page = diff_page(session, last, DiffKind(kind), limit=limit)
        document = {
            "pipeline": name,
            "job_id": str(last.id),
            "previous_job_id": str(last.previous_job_id) if last.previous_job_id else None,
            "finished_at": last.finished_at.isoformat() if last.finished_at else None,
            "kind": kind,
            "counts": counts.as_dict(),
            "items": page.items,
            "truncated": page.next_cursor is not None,
        }
    if as_json:
        emit_json(document)
        return
    console.print(
        f"{name}: run {document['job_id']} ({document['finished_at']}), against "
        f"{document['previous_job_id'] or 'no earlier run'}: {counts.new} new, "
        f"{counts.removed} removed, {counts.unchanged} unchanged",
        highlight=False,
        markup=False,
    )
    for item in page.items:
        console.print_json(data=item)
    if page.next_cursor is not None:
        console.print(f"(first {limit}; GET /v1/jobs/{document['job_id']}/diff pages through all)")
