"""``flowbeat keys``: create, list and revoke API keys. A revoked key is refused by every API
process once its key cache forgets it (``FLOWBEAT_AUTH_CACHE_S``)."""

from typing import Annotated, Any

import typer

from service.cli.app import (
    JsonOption,
    OwnerOption,
    acting_owner,
    cli_actor,
    console,
    emit_json,
    keys_cli,
    load_settings,
)
from service.cli.tables import print_table
from service.platform.audit import record_key
from service.platform.db import sessions_of, unit_of_work


@keys_cli.command("create")
def keys_create(
    scopes: Annotated[str, typer.Option(help="comma-separated: read,write,admin")] = "read",
    owner: OwnerOption = None,
) -> None:
    """Create an API key; it is printed once and stored hashed."""
    from service.platform.auth import create_api_key

    settings = load_settings()
    sessions = sessions_of(settings)
    wanted = [scope.strip() for scope in scopes.split(",") if scope.strip()]
    try:
        with unit_of_work(sessions) as session:
            key, row = create_api_key(session, owner=acting_owner(settings, owner), scopes=wanted)
            record_key(
                session,
                cli_actor(settings, "keys create", owner),
                "key.create",
                row.prefix,
                owner=row.owner,
                scopes=row.scopes,
            )
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc
    typer.echo(key)


@keys_cli.command("list")
def keys_list(
    owner: Annotated[str | None, typer.Option(help="only this owner's keys")] = None,
    revoked: Annotated[bool, typer.Option(help="include revoked keys")] = False,
    as_json: JsonOption = False,
) -> None:
    """Keys by prefix (the part after ``fb_``), never their secrets."""
    from service.platform.auth import list_api_keys

    settings = load_settings()
    sessions = sessions_of(settings)
    with unit_of_work(sessions) as session:
        rows = list_api_keys(session, owner=owner, include_revoked=revoked)
        documents: list[dict[str, Any]] = [
            {
                "prefix": row.prefix,
                "owner": row.owner,
                "scopes": list(row.scopes),
                "created_at": row.created_at.isoformat(),
                "revoked_at": row.revoked_at.isoformat() if row.revoked_at else None,
            }
            for row in rows
        ]
    if as_json:
        emit_json({"keys": documents})
        return
    cells = [
        [
            doc["prefix"],
            doc["owner"],
            ",".join(doc["scopes"]),
            doc["created_at"][:16],
            (doc["revoked_at"] or "")[:16],
        ]
        for doc in documents
    ]
    headers = ["prefix", "owner", "scopes", "created (UTC)", "revoked"]
    print_table(headers, cells, whole={"prefix"}, keep=["created (UTC)", "revoked", "scopes"])


@keys_cli.command("revoke")
def keys_revoke(
    key: Annotated[str, typer.Argument(help="the key's prefix, as keys list shows it, or the key")],
) -> None:
    """Revoke a key; API processes refuse it once their key cache forgets it."""
    from service.platform.auth import revoke_api_key
    from service.platform.errors import KeyNotFound

    settings = load_settings()
    sessions = sessions_of(settings)
    with unit_of_work(sessions) as session:
        if not revoke_api_key(session, key):
            raise KeyNotFound("no live key with this prefix", {"prefix": key[:12]})
        record_key(session, cli_actor(settings, "keys revoke"), "key.revoke", key)
    console.print(
        f"revoked; refused everywhere within {settings.auth_cache_s:g}s (FLOWBEAT_AUTH_CACHE_S)"
    )
