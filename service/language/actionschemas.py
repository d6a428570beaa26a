"""The JSON Schema of the ``with`` of the engine's own actions (``wait``, ``pipeline.run``),
added to a step's schema so that an editor flags a malformed one as it is typed."""

from typing import Any

from service.platform.constants import PIPELINE_RUN_ACTION, WAIT_ACTION, WAIT_MAX_S

_REFERENCE = {"type": "string", "pattern": r"\$\{\{"}


def engine_actions_schema(schema: dict[str, Any]) -> None:
    """In the JSON Schema, the ``with`` of the engine's own actions, so that an editor flags a
    malformed ``wait`` or ``pipeline.run`` as it is typed; the profile checks
    (``service.language.waits``, ``service.language.subpipes``) say the rest when it is loaded."""
    schema["allOf"] = [_wait_rule(), _run_rule()]


def _wait_rule() -> dict[str, Any]:
    """A ``wait`` step takes exactly one of ``with.seconds`` and ``with.until``."""
    return {
        "if": {"properties": {"action": {"const": WAIT_ACTION}}, "required": ["action"]},
        "then": {
            "required": ["with"],
            "properties": {
                "with": {
                    "type": "object",
                    "additionalProperties": False,
                    "minProperties": 1,
                    "maxProperties": 1,
                    "properties": {
                        "seconds": {
                            "anyOf": [
                                {"type": "number", "minimum": 0, "maximum": WAIT_MAX_S},
                                _REFERENCE,
                            ]
                        },
                        "until": {"type": "string"},
                    },
                }
            },
        },
    }


def _run_rule() -> dict[str, Any]:
    """A ``pipeline.run`` step names the pipeline it starts, and may give it params and say
    whether to wait for it (a reference may stand for any of them)."""
    return {
        "if": {"properties": {"action": {"const": PIPELINE_RUN_ACTION}}, "required": ["action"]},
        "then": {
            "required": ["with"],
            "properties": {
                "with": {
                    "type": "object",
                    "additionalProperties": False,
                    "required": ["pipeline"],
                    "properties": {
                        "pipeline": {"type": "string", "minLength": 1, "maxLength": 200},
                        "params": {"anyOf": [{"type": "object"}, _REFERENCE]},
                        "wait": {"anyOf": [{"type": "boolean"}, _REFERENCE]},
                    },
                }
            },
        },
    }
