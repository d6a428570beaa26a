"""The action catalogue: every action a profile's step may name in this deployment, with what
a person or an LLM client writing the profile needs to use it without reading the source.

It lists the registry (the built-ins, ``FLOWBEAT_ACTION_MODULES`` and the ``flowbeat.actions``
entry points, as the process loaded them) and the engine's own two, ``wait`` and
``pipeline.run``, which no module registers but every step may name.
"""

import functools
import inspect
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any, Literal

from service.actions.registry import ActionRegistry, Registration
from service.actions.signature import input_schema
from service.language.actionnames import closest_actions, did_you_mean
from service.platform.constants import PIPELINE_RUN_ACTION, WAIT_ACTION, WAIT_MAX_S
from service.platform.errors import ActionNotFound

BUILTIN_PACKAGE = "service.actions"

Source = Literal["builtin", "module", "engine"]


@dataclass(frozen=True)
class ActionInfo:
    """``source``: ``builtin`` (shipped with flowbeat), ``module`` (the deployment's own,
    ``module`` naming where) or ``engine`` (run by the engine itself, not a callable)."""

    name: str
    summary: str
    doc: str
    source: Source
    module: str | None
    input_schema: dict[str, Any]
    cache: bool
    retry: bool


_ENGINE = (
    ActionInfo(
        name=WAIT_ACTION,
        summary="Wait, durably, for a number of seconds or until a time, holding no worker.",
        doc=(
            "Wait, durably, for a number of seconds or until a time, holding no worker.\n\n"
            "Exactly one of seconds and until; the step sleeps in the database and the beat "
            "wakes it, so a restart of every process loses no wait."
        ),
        source="engine",
        module=None,
        input_schema={
            "type": "object",
            "title": WAIT_ACTION,
            "properties": {
                "seconds": {"type": "number", "minimum": 0, "maximum": WAIT_MAX_S},
                "until": {"type": "string", "format": "date-time"},
            },
            "oneOf": [{"required": ["seconds"]}, {"required": ["until"]}],
            "additionalProperties": False,
        },
        cache=False,
        retry=False,
    ),
    ActionInfo(
        name=PIPELINE_RUN_ACTION,
        summary="Start a saved or shipped pipeline as a child job and, by default, wait for it.",
        doc=(
            "Start a saved or shipped pipeline as a child job and, by default, wait for it.\n\n"
            "A step that waits reads the child's result as its output; one that does not "
            "reads {job_id}. The step's retry policy starts a new child when one fails."
        ),
        source="engine",
        module=None,
        input_schema={
            "type": "object",
            "title": PIPELINE_RUN_ACTION,
            "properties": {
                "pipeline": {"type": "string", "minLength": 1, "maxLength": 200},
                "params": {"type": "object", "default": {}},
                "wait": {"type": "boolean", "default": True},
            },
            "required": ["pipeline"],
            "additionalProperties": False,
        },
        cache=False,
        retry=True,
    ),
)


def action_catalogue(registry: ActionRegistry) -> list[ActionInfo]:
    """Every action a step may name, by name."""
    listed = [_info(held) for held in registry.registrations()]
    return sorted([*listed, *_ENGINE], key=lambda info: info.name)


def action_info(registry: ActionRegistry, name: str) -> ActionInfo:
    """One action; ``unknown_action`` with the closest names when none is called ``name``."""
    for info in _ENGINE:
        if info.name == name:
            return info
    if name not in registry:
        raise unknown_action(name, registry.names())
    return _info(registry.registration(name))


def unknown_action(name: str, known: Collection[str]) -> ActionNotFound:
    closest = closest_actions(name, known)
    return ActionNotFound(
        f"unknown action {name!r}{did_you_mean(closest)}", {"action": name, "closest": closest}
    )


@functools.cache
def _info(held: Registration) -> ActionInfo:
    """Once per registration: a schema takes pydantic a few milliseconds to build."""
    doc = inspect.getdoc(held.fn) or ""
    module = getattr(held.fn, "__module__", None)
    builtin = module is not None and (
        module == BUILTIN_PACKAGE or module.startswith(BUILTIN_PACKAGE + ".")
    )
    return ActionInfo(
        name=held.name,
        summary=doc.split("\n\n", 1)[0].replace("\n", " "),
        doc=doc,
        source="builtin" if builtin else "module",
        module=module,
        input_schema=input_schema(held.name, held.fn),
        cache=held.cache,
        retry=held.retry,
    )
