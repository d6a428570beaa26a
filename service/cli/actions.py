"""``flowbeat actions``: the action catalogue, as ``GET /v1/actions`` lists it, read from the
modules this process would load (``FLOWBEAT_ACTION_MODULES`` and the ``flowbeat.actions``
entry points), so it needs no database and no broker."""

import dataclasses
from typing import Annotated

import typer

from service.actions import REGISTRY, load_plugins
from service.actions.catalogue import ActionInfo, action_catalogue, action_info
from service.actions.signature import INPUT_COLUMNS, input_rows
from service.cli.app import JsonOption, cli, console, emit_json
from service.cli.tables import print_table
from service.platform.settings import get_settings


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


@cli.command("actions")
def actions(
    name: Annotated[
        str | None, typer.Argument(help="one action: its docstring and its inputs")
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Every action a step's ``action:`` may name, with whether its output may be cached and
    a failed attempt retried; with a NAME, that action's docstring and inputs."""
    load_plugins(REGISTRY, get_settings().action_modules)
    if name is not None:
        _show(action_info(REGISTRY, name), as_json)
        return
    infos = action_catalogue(REGISTRY)
    if as_json:
        emit_json({"actions": [dataclasses.asdict(info) for info in infos]})
        return
    rows = [
        [info.name, info.source, _yes(info.cache), _yes(info.retry), info.summary] for info in infos
    ]
    headers = ["action", "source", "cache", "retry", "summary"]
    print_table(headers, rows, whole={"action"}, keep=["source", "cache", "retry"])


def _show(info: ActionInfo, as_json: bool) -> None:
    if as_json:
        emit_json({"action": dataclasses.asdict(info)})
        return
    where = f"{info.source} ({info.module})" if info.module else info.source
    console.print(f"{info.name}: {where}", markup=False, highlight=False)
    console.print(f"cache: {_yes(info.cache)}, retry: {_yes(info.retry)}", highlight=False)
    if info.doc:
        console.print(f"\n{info.doc}\n", markup=False, highlight=False)
    rows = [[row[column] for column in INPUT_COLUMNS] for row in input_rows(info.input_schema)]
    print_table(INPUT_COLUMNS, rows, whole={"input"}, keep=["required", "default"])
