"""An action's inputs as JSON Schema, read from its signature and type hints.

The step context (the first parameter) is not an input. A parameter without a hint accepts
any value; a hint pydantic cannot describe (a class of the operator's own) is shown as any
value too, rather than leaving the action out of the catalogue; ``**inputs`` lets any other
input through. Positional-only parameters cannot be given by a step, so they are not inputs.
Each input is a field under a name of its own, its parameter's name its alias, so an input
called ``json`` or ``model_config`` does not meet pydantic's own attributes.
"""

import inspect
import json
import typing
import warnings
from typing import Any

from pydantic import ConfigDict, Field, PydanticUserError, TypeAdapter, create_model
from pydantic.errors import PydanticSchemaGenerationError
from pydantic.json_schema import PydanticJsonSchemaWarning

from service.actions.registry import ActionFn

_KEYWORD = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
_UNDESCRIBED = (PydanticSchemaGenerationError, PydanticUserError, TypeError, ValueError)
OPEN: dict[str, Any] = {"type": "object", "additionalProperties": True}
"""The schema of an action whose signature cannot be read (a builtin, a C function)."""


def input_schema(name: str, fn: ActionFn) -> dict[str, Any]:
    try:
        params = list(inspect.signature(fn).parameters.values())[1:]
    except (TypeError, ValueError):
        return dict(OPEN)
    hints = _hints(fn)
    fields: dict[str, Any] = {}
    open_ended = False
    for index, param in enumerate(params):
        if param.kind is inspect.Parameter.VAR_KEYWORD:
            open_ended = True
        elif param.kind in _KEYWORD:
            hint = _describable(hints.get(param.name, Any))
            default = ... if param.default is inspect.Parameter.empty else param.default
            fields[f"input_{index}"] = (hint, Field(default, alias=param.name))
    config = ConfigDict(arbitrary_types_allowed=True, extra="allow" if open_ended else "forbid")
    model = create_model(name, __config__=config, **fields)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PydanticJsonSchemaWarning)
        return _untitled(model.model_json_schema())


INPUT_COLUMNS = ("input", "type", "required", "default")


def input_rows(schema: dict[str, Any]) -> list[dict[str, str]]:
    """An input schema as a person reads it, one row per input (``INPUT_COLUMNS``): its type
    in short, ``yes`` when a step must give it, its default as JSON; a last row ``**`` when
    the action takes inputs it does not name."""
    required = set(schema.get("required", []))
    rows = [
        {
            "input": name,
            "type": type_text(prop),
            "required": "yes" if name in required else "",
            "default": json.dumps(prop["default"]) if "default" in prop else "",
        }
        for name, prop in schema.get("properties", {}).items()
    ]
    if schema.get("additionalProperties") not in (False, None):
        rows.append({"input": "**", "type": "any", "required": "", "default": ""})
    return rows


def type_text(prop: dict[str, Any]) -> str:
    if "anyOf" in prop:
        return " | ".join(type_text(option) for option in prop["anyOf"])
    kind = prop.get("type")
    if kind == "array" and "items" in prop:
        return f"array of {type_text(prop['items'])}"
    return str(kind) if kind else "any"


def _hints(fn: ActionFn) -> dict[str, Any]:
    """Type hints with string annotations resolved; where one names what its module cannot
    resolve, none (every input is then shown as any value)."""
    try:
        return typing.get_type_hints(fn)
    except Exception:
        return {}


def _describable(hint: Any) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PydanticJsonSchemaWarning)
        try:
            TypeAdapter(hint).json_schema()
        except _UNDESCRIBED:
            return Any
    return hint


def _untitled(schema: dict[str, Any]) -> dict[str, Any]:
    """Without pydantic's per-property titles (the parameter's name, capitalised), which say
    nothing the key does not."""
    for prop in schema.get("properties", {}).values():
        prop.pop("title", None)
    return schema
