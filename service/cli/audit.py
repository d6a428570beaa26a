"""``flowbeat audit``: the audit trail, newest first, with the API's filters (``GET
/v1/audit``); the command reads the database directly, as an operator on the host may."""

from datetime import UTC, datetime
from typing import Annotated, Any

import typer

from service.cli.app import JsonOption, cli, console, emit_json, load_settings
from service.cli.tables import print_table
from service.platform.constants import AUDIT_LIST_DEFAULT_LIMIT, AUDIT_LIST_MAX_LIMIT
from service.platform.db import make_engine, make_session_factory, unit_of_work
from service.platform.models import AuditEventRow


def event_document(row: AuditEventRow) -> dict[str, Any]:
    return {
        "id": row.id,
        "at": row.at.astimezone(UTC).isoformat(),
        "channel": row.channel,
        "source": row.source,
        "actor": row.actor,
        "owner": row.owner,
        "action": row.action,
        "target_kind": row.target_kind,
        "target_id": row.target_id,
        "detail": row.detail,
    }


def _since(value: str | None) -> datetime | None:
    """An ISO 8601 time; one without a zone is read as UTC, the zone every time here is in."""
    if value is None:
        return None
    try:
        moment = datetime.fromisoformat(value)
    except ValueError as exc:
        raise typer.BadParameter(f"not an ISO 8601 time: {value}", param_hint="--since") from exc
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


@cli.command("audit")
def audit(
    target: Annotated[
        str | None, typer.Option(help="kind:id (job:<id>, pipeline:<name>), kind: or an id")
    ] = None,
    actor: Annotated[str | None, typer.Option(help="a key prefix, an OS user or an owner")] = None,
    action: Annotated[
        str | None, typer.Option(help="job.cancel, or job for every job action")
    ] = None,
    since: Annotated[str | None, typer.Option(help="ISO 8601; UTC when it has no zone")] = None,
    limit: Annotated[int, typer.Option(min=1, max=AUDIT_LIST_MAX_LIMIT)] = AUDIT_LIST_DEFAULT_LIMIT,
    cursor: Annotated[str | None, typer.Option(help="next_cursor of the page before")] = None,
    as_json: JsonOption = False,
) -> None:
    """Who changed what, through which channel (api, cli, mcp, ui), newest first."""
    from service.platform.audit import AuditQuery, list_events

    query = AuditQuery(target, actor, action, _since(since), limit, cursor)
    settings = load_settings()
    sessions = make_session_factory(make_engine(settings.require_database_url()))
    with unit_of_work(sessions) as session:
        rows, next_cursor = list_events(session, query)
        documents = [event_document(row) for row in rows]
    if as_json:
        emit_json({"events": documents, "next_cursor": next_cursor})
        return
    _print(documents)
    if next_cursor is not None:
        console.print(f"more: --cursor {next_cursor}", markup=False)


def _print(documents: list[dict[str, Any]]) -> None:
    cells = [
        [
            datetime.fromisoformat(doc["at"]).strftime("%m-%d %H:%M:%S"),
            doc["channel"],
            f"{doc['actor']} as {doc['owner']}",
            doc["action"],
            f"{doc['target_kind']}:{doc['target_id']}",
        ]
        for doc in documents
    ]
    headers = ["time (UTC)", "via", "actor", "action", "target"]
    print_table(headers, cells, whole={"action"}, keep=["time (UTC)", "target", "actor"])
