"""What a ``pipeline.run`` step calls: ``pipeline`` (a saved or shipped name), ``params`` and
``wait`` (``true`` by default).

The same rules hold when a profile is saved (a value written out, ``problems``) and when the
step is claimed (a value a reference resolved to, ``child_call``), so a literal that would fail
at run time is refused at save, where the file, step and field can be named. A step that waits
for its child reads the child's result as its output; one that does not reads
``{job_id}``.
"""

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from service.language.expressions import parse_refs
from service.language.profiles import Profile
from service.language.specs import StepSpec
from service.platform.constants import PIPELINE_RUN_ACTION
from service.platform.errors import ChildInvalid

RUN_INPUTS = ("pipeline", "params", "wait")
NAME_MAX = 200


@dataclass(frozen=True)
class ChildCall:
    pipeline: str
    params: dict[str, Any]
    wait: bool


def child_call(inputs: Mapping[str, Any]) -> ChildCall:
    """The call a step's resolved inputs make; raises ``ChildInvalid`` naming the field."""
    pipeline, params, wait = (inputs.get(name) for name in RUN_INPUTS)
    if not isinstance(pipeline, str) or not 0 < len(pipeline) <= NAME_MAX:
        raise ChildInvalid(
            f"pipeline must name a saved or shipped pipeline, got {_shown(pipeline)}",
            {"field": "pipeline"},
        )
    if params is not None and not isinstance(params, dict):
        raise ChildInvalid(f"params must be an object, got {_shown(params)}", {"field": "params"})
    if wait is not None and not isinstance(wait, bool):
        raise ChildInvalid(f"wait must be true or false, got {_shown(wait)}", {"field": "wait"})
    return ChildCall(pipeline, dict(params or {}), True if wait is None else wait)


def problems(step: StepSpec) -> Iterator[tuple[str, str]]:
    """(field, message) for each way a ``pipeline.run`` step is malformed, fields relative to
    the step; a value that is a reference is checked when it resolves."""
    for name in sorted(set(step.with_) - set(RUN_INPUTS)):
        yield f"with.{name}", f"pipeline.run takes pipeline, params and wait, not {name!r}"
    literal = {k: v for k, v in step.with_.items() if k in RUN_INPUTS and not parse_refs(v)}
    if "pipeline" not in step.with_:
        literal["pipeline"] = None
    try:
        child_call({"pipeline": "-", **literal})
    except ChildInvalid as exc:
        yield f"with.{exc.details['field']}", exc.message
    kept = {"for_each": step.for_each, "approval": step.approval, "verify": step.verify or None}
    for name, value in kept.items():
        if value is not None:
            yield name, f"a pipeline.run step cannot have {name}"


def called_pipelines(profile: Profile) -> frozenset[str]:
    """The pipelines a profile's ``pipeline.run`` steps name literally: what the cycle check
    at save follows (a name that a reference makes is held by the depth cap instead)."""
    return frozenset(
        name
        for step in profile.steps
        if step.action == PIPELINE_RUN_ACTION
        and isinstance(name := step.with_.get("pipeline"), str)
        and not parse_refs(name)
    )


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
