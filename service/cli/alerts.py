"""``flowbeat alerts``: an owner's alert rules and what each sent, as the alert routes do."""

from typing import Annotated, Any

import typer
from pydantic import ValidationError
from rich.markup import escape

from service.cli.app import (
    JsonOption,
    OwnerOption,
    acting_owner,
    alerts_cli,
    cli_actor,
    console,
    emit_json,
    load_settings,
)
from service.cli.tables import print_table
from service.platform.audit import Target, record
from service.platform.db import sessions_of, unit_of_work
from service.platform.models import AlertDeliveryRow, AlertRuleRow
from service.platform.settings import AlertRuleBody


def alert_document(row: AlertRuleRow) -> dict[str, Any]:
    """A rule as ``--json`` prints it: the keys of the API's alert."""
    return {
        "id": str(row.id),
        "name": row.name,
        "owner": row.owner,
        "kind": row.kind,
        "threshold": row.threshold,
        "pipeline": row.pipeline,
        "url": row.url,
        "secret": row.secret,
        "format": row.format,
        "dedupe_s": row.dedupe_s,
        "enabled": row.enabled,
        "source": row.source,
        "created_at": row.created_at.isoformat(),
        "updated_at": row.updated_at.isoformat(),
    }


def delivery_document(row: AlertDeliveryRow) -> dict[str, Any]:
    return {
        "id": row.id,
        "delivery_id": row.delivery_id,
        "event_key": row.event_key,
        "subject": row.subject,
        "status": row.status,
        "attempts": row.attempts,
        "suppressed": row.suppressed,
        "last_error": row.last_error,
        "created_at": row.created_at.isoformat(),
        "delivered_at": row.delivered_at.isoformat() if row.delivered_at else None,
        "summary": row.payload.get("summary"),
    }


def _print_rules(documents: list[dict[str, Any]]) -> None:
    rows = [
        [
            doc["name"],
            doc["kind"] if doc["threshold"] is None else f"{doc['kind']} > {doc['threshold']}",
            doc["pipeline"] or "any",
            doc["url"],
            "on" if doc["enabled"] else "off",
            doc["source"],
        ]
        for doc in documents
    ]
    headers = ["name", "kind", "pipeline", "url", "state", "from"]
    print_table(headers, rows, whole={"name", "state"}, keep=["kind"])


@alerts_cli.command("list")
def alerts_list(owner: OwnerOption = None, as_json: JsonOption = False) -> None:
    """The owner's alert rules."""
    from service.alerts.rules import list_rules

    settings = load_settings()
    with unit_of_work(sessions_of(settings)) as session:
        documents = [
            alert_document(row) for row in list_rules(session, acting_owner(settings, owner))
        ]
    if as_json:
        emit_json({"alerts": documents})
    else:
        _print_rules(documents)


@alerts_cli.command("set")
def alerts_set(
    name: str,
    kind: Annotated[
        str,
        typer.Option(
            help="job_failed, deadline_passed, approval_escalated, step_retried, "
            "schedule_silent or queue_age"
        ),
    ],
    url: Annotated[str, typer.Option(help="where the signed webhook is POSTed")],
    threshold: Annotated[
        int | None,
        typer.Option(help="retries (step_retried) or seconds (schedule_silent, queue_age)"),
    ] = None,
    pipeline: Annotated[str | None, typer.Option(help="only this pipeline's events")] = None,
    secret: Annotated[
        str | None, typer.Option(help="the signing secret's name; none: FLOWBEAT_WEBHOOK_SECRET")
    ] = None,
    body_format: Annotated[str, typer.Option("--format", help="flowbeat or slack")] = "flowbeat",
    dedupe: Annotated[
        int, typer.Option("--dedupe-s", help="seconds one subject's later alerts are held back")
    ] = 300,
    disabled: Annotated[bool, typer.Option("--disabled", help="store it switched off")] = False,
    owner: OwnerOption = None,
    as_json: JsonOption = False,
) -> None:
    """Create or replace an alert rule."""
    from service.alerts.rules import put_rule

    try:
        body = AlertRuleBody.model_validate(
            {
                "kind": kind,
                "url": url,
                "threshold": threshold,
                "pipeline": pipeline,
                "secret": secret,
                "format": body_format,
                "dedupe_s": dedupe,
                "enabled": not disabled,
            }
        )
    except ValidationError as exc:
        raise typer.BadParameter(str(exc)) from None
    settings = load_settings()
    acting = acting_owner(settings, owner)
    with unit_of_work(sessions_of(settings)) as session:
        saved = put_rule(session, name, body, owner=acting, settings=settings)
        action = "alert.create" if saved.created else "alert.update"
        record(session, cli_actor(settings, "alerts set", owner), action, Target("alert", name))
        document = alert_document(saved.rule)
    if as_json:
        emit_json({"alert": document})
    else:
        _print_rules([document])


@alerts_cli.command("delete")
def alerts_delete(name: str, owner: OwnerOption = None) -> None:
    """Delete a rule and its deliveries."""
    from service.alerts.rules import delete_rule

    settings = load_settings()
    with unit_of_work(sessions_of(settings)) as session:
        delete_rule(session, name, acting_owner(settings, owner))
        record(
            session,
            cli_actor(settings, "alerts delete", owner),
            "alert.delete",
            Target("alert", name),
        )
    console.print(f"deleted alert {escape(name)}")


@alerts_cli.command("deliveries")
def alerts_deliveries(
    name: str,
    limit: Annotated[int, typer.Option(min=1, max=500)] = 20,
    owner: OwnerOption = None,
    as_json: JsonOption = False,
) -> None:
    """What the rule sent, newest first: status, attempts, and what its window held back."""
    from service.alerts.rules import deliveries_of, get_rule

    settings = load_settings()
    with unit_of_work(sessions_of(settings)) as session:
        rule = get_rule(session, name, acting_owner(settings, owner))
        documents = [delivery_document(row) for row in deliveries_of(session, rule, limit=limit)]
    if as_json:
        emit_json({"deliveries": documents})
        return
    rows = [
        [
            doc["delivery_id"],
            doc["created_at"][:19],
            doc["status"],
            str(doc["attempts"]),
            str(doc["suppressed"]),
            doc["summary"] or doc["subject"],
        ]
        for doc in documents
    ]
    headers = ["delivery", "queued (UTC)", "status", "attempts", "held back", "what"]
    print_table(headers, rows, whole={"delivery", "status"}, keep=["attempts"])
