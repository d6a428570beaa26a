"""Pipeline profiles: the YAML models, their validation and loading.

Validation runs in two phases. The pydantic schema checks each field on its own; the semantic
phase then checks what spans steps (ids, dependencies, cycles, actions, references). Every
problem of a phase is reported at once in one ``ProfileInvalid`` so a user fixes a file in one
pass; the semantic phase only runs on a schema-valid document, since it needs well-typed steps.
"""

import copy
import hashlib
import json
import logging
import math
import os
import random
import re
import stat
from collections.abc import Callable, Collection, Iterator, Mapping
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any, Literal, NoReturn
from urllib.parse import urlsplit

import yaml
from jsonschema.exceptions import SchemaError
from jsonschema.validators import validator_for
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    SerializerFunctionWrapHandler,
    StringConstraints,
    ValidationError,
    field_validator,
    model_serializer,
    model_validator,
)
from pydantic_core import PydanticCustomError

from service import dag
from service.conditions import Condition, parse_condition
from service.cron import ScheduleSpec, normalize
from service.expressions import Ref, parse_path, parse_refs, whole_ref
from service.platform.constants import SHIPPED_DIR, TRIGGER_ON_NEW_ITEMS, TRIGGER_ON_SUCCEEDED
from service.platform.errors import (
    ExpressionError,
    FlowbeatError,
    ParamsInvalid,
    ProfileInvalid,
    ProfileNotFound,
)
from service.yamlsafe import YamlLimitExceeded, load_yaml

NAME_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,63}$"
STEP_ID_PATTERN = r"^[a-z][a-z0-9_]{0,63}$"
MAX_PROFILE_BYTES = 256 * 1024
MAX_DOCUMENT_NODES = 100_000
log = logging.getLogger(__name__)
SCHEMA_PATH = SHIPPED_DIR / "profile.schema.json"
PROFILE_SUFFIXES = (".yaml", ".yml")

ParamType = Literal["string", "integer", "number", "boolean", "array", "object"]
ErrorEntry = dict[str, Any]

VERIFY_ROOTS = frozenset({"output", "params", "trigger"})
"""A verify ``expr`` checks the step's own output, so it names ``output`` (and params, and in a
job another's success started, ``trigger``), never another step."""
WHEN_ROOTS = frozenset({"params", "steps", "approval", "trigger"})
UNTIL_ROOTS = frozenset({"params", "steps", "loop", "trigger"})
RULE_KINDS = ("not_empty", "min_items", "max_items", "json_schema", "expr")
MAX_VERIFY_RULES = 50
_OWN_ERROR_CODES = frozenset({"bad_reference", "condition_invalid", "json_schema_invalid"})


def json_type_ok(kind: ParamType, value: Any) -> bool:
    """JSON-schema typing: a bool is not a number, an integer is a number."""
    if kind == "string":
        return isinstance(value, str)
    if kind == "boolean":
        return isinstance(value, bool)
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    if kind == "array":
        return isinstance(value, list)
    return isinstance(value, dict)


class ParamSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: ParamType = "string"
    required: bool = False
    default: Any = None
    description: str = ""

    @model_validator(mode="after")
    def _default_matches_type(self) -> "ParamSpec":
        if self.default is not None and not json_type_ok(self.type, self.default):
            raise ValueError(f"default {self.default!r} is not of type {self.type}")
        return self


class RetryPolicy(BaseModel):
    model_config = ConfigDict(extra="forbid")

    attempts: int = Field(default=1, ge=1, le=20)
    backoff_s: float = Field(default=1.0, ge=0)
    backoff_max_s: float = Field(default=60.0, ge=0)
    jitter: float = Field(default=0.1, ge=0, le=1)
    non_retryable: list[str] = Field(default_factory=list)

    def delay_s(self, attempt: int, rand: Callable[[], float] = random.random) -> float:
        """Seconds to wait after failed ``attempt`` (1-based); jitter spreads retries of many
        shards that failed together so they do not hit the same dependency in lockstep."""
        exponent = min(max(attempt - 1, 0), 64)
        base = min(self.backoff_s * math.pow(2, exponent), self.backoff_max_s)
        factor = 1 + self.jitter * (2 * rand() - 1)
        return max(0.0, base * factor)


class ForEach(BaseModel):
    model_config = ConfigDict(extra="forbid")

    items: str
    max_parallel: int = Field(default=10, ge=1, le=1000)

    @field_validator("items")
    @classmethod
    def _items_is_whole_ref(cls, value: str) -> str:
        try:
            ref = whole_ref(value)
        except ExpressionError as exc:
            raise PydanticCustomError("bad_reference", exc.message) from None
        if ref is None or ref.root == "item":
            raise PydanticCustomError(
                "bad_reference",
                "for_each.items must be one reference to a param or a step output, "
                "e.g. '${{ steps.search.output.ids }}'",
            )
        return value

    @property
    def ref(self) -> Ref:
        ref = whole_ref(self.items)
        assert ref is not None
        return ref


class ApprovalSpec(BaseModel):
    """A person decides before the step runs; ``on_timeout`` says what happens without one."""

    model_config = ConfigDict(extra="forbid")

    required: bool = True
    timeout_s: int = Field(default=86400, ge=1, le=90 * 86400)
    on_timeout: Literal["escalate", "auto_reject", "auto_approve"] = "auto_reject"
    escalate_after_s: int = Field(default=86400, ge=1, le=90 * 86400)
    escalate_to: str | None = Field(
        default=None, description="http(s) URL that receives a signed notice on escalation"
    )

    @field_validator("escalate_to")
    @classmethod
    def _escalate_to_is_a_url(cls, value: str | None) -> str | None:
        """Its address is checked again by the egress policy when the notice is sent."""
        if value is not None:
            parts = urlsplit(value)
            if parts.scheme not in ("http", "https") or not parts.hostname or parts.username:
                raise ValueError("an http(s) URL with a host and no credentials")
        return value


class ItemCount(BaseModel):
    """The list at ``path`` in the output (``""``: the output itself) and a bound on its length."""

    model_config = ConfigDict(extra="forbid")

    path: str = ""
    count: int = Field(ge=0)

    @field_validator("path")
    @classmethod
    def _is_path(cls, value: str) -> str:
        dotted_path(value)
        return value


def _local_refs_only(schema: Any) -> None:
    """A ``$ref`` to anything but the schema itself would be fetched or fail on every run; the
    validator is given no way to fetch, and this says so when the profile is loaded."""
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            for key in ("$ref", "$dynamicRef"):
                target = node.get(key)
                if isinstance(target, str) and not target.startswith("#"):
                    raise PydanticCustomError(
                        "json_schema_invalid",
                        "{key} {target!r}: a schema may only refer within itself ('#...')",
                        {"key": key, "target": target},
                    )
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)


def _one_rule_schema(schema: dict[str, Any]) -> None:
    """In the JSON Schema a rule key is never null and exactly one is present; ``None`` is only
    how the model spells "not this kind"."""
    for kind in RULE_KINDS:
        prop = schema["properties"][kind]
        prop.pop("default", None)
        prop.update(next(option for option in prop.pop("anyOf") if option != {"type": "null"}))
    schema["oneOf"] = [{"required": [kind]} for kind in RULE_KINDS]


def _never_null(value: Any) -> bool:
    return value is None


# One model with optional keys rather than a union of models: a mistake is then reported at
# ``verify[i].<key>``, not under a union member's name, and the stored form holds only the key set.
class VerifyRule(BaseModel):
    """One check of a step's output: exactly one of not_empty, min_items, max_items,
    json_schema or expr; a failed check fails the attempt with ``verification_failed``."""

    model_config = ConfigDict(extra="forbid", json_schema_extra=_one_rule_schema)
    _condition: Condition | None = PrivateAttr(default=None)

    not_empty: str | None = Field(default=None, exclude_if=_never_null)
    min_items: ItemCount | None = Field(default=None, exclude_if=_never_null)
    max_items: ItemCount | None = Field(default=None, exclude_if=_never_null)
    json_schema: dict[str, Any] | None = Field(default=None, exclude_if=_never_null)
    expr: str | None = Field(default=None, exclude_if=_never_null)
    message: str = ""
    retry: bool = True

    @field_validator("not_empty")
    @classmethod
    def _not_empty_is_path(cls, value: str | None) -> str | None:
        if value is not None:
            dotted_path(value)
        return value

    @field_validator("json_schema")
    @classmethod
    def _is_json_schema(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is None:
            return None
        try:
            validator_for(value).check_schema(value)
        except SchemaError as exc:
            raise PydanticCustomError(
                "json_schema_invalid", "not a valid JSON Schema: {reason}", {"reason": exc.message}
            ) from None
        _local_refs_only(value)
        return value

    @field_validator("expr")
    @classmethod
    def _is_condition(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                parse_condition(value, roots=VERIFY_ROOTS)
            except ExpressionError as exc:
                raise PydanticCustomError(exc.code, exc.message) from None
        return value

    @model_validator(mode="after")
    def _one_rule(self) -> "VerifyRule":
        found = [kind for kind in RULE_KINDS if getattr(self, kind) is not None]
        if len(found) != 1:
            raise PydanticCustomError(
                "verify_rule",
                "a verify rule has exactly one of {kinds}; found {found}",
                {"kinds": ", ".join(RULE_KINDS), "found": " and ".join(found) or "none"},
            )
        return self

    @property
    def kind(self) -> str:
        return next(kind for kind in RULE_KINDS if getattr(self, kind) is not None)

    @property
    def condition(self) -> Condition:
        """The parsed ``expr``; only for an ``expr`` rule."""
        if self._condition is None:
            assert self.expr is not None
            self._condition = parse_condition(self.expr, roots=VERIFY_ROOTS)
        return self._condition


class CompensateSpec(BaseModel):
    """What undoes a succeeded step when a later one fails for good (a saga)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, serialize_by_alias=True)

    action: str
    with_: dict[str, Any] = Field(default_factory=dict, alias="with")
    retry: RetryPolicy = Field(default_factory=RetryPolicy)
    timeout_s: int = Field(default=300, ge=1, le=86400)


class StepSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, serialize_by_alias=True)
    _condition: Condition | None = PrivateAttr(default=None)

    id: str = Field(pattern=STEP_ID_PATTERN)
    action: str
    with_: dict[str, Any] = Field(default_factory=dict, alias="with")
    depends_on: list[str] = Field(default_factory=list)
    retry: RetryPolicy = Field(default_factory=RetryPolicy)
    timeout_s: int = Field(default=300, ge=1, le=86400)
    for_each: ForEach | None = None
    when: str | None = Field(default=None, exclude_if=_never_null)
    needs: Literal["all", "any"] = Field(default="all", exclude_if=lambda needs: needs == "all")
    approval: ApprovalSpec | None = Field(default=None, exclude_if=lambda gate: gate is None)
    compensate: CompensateSpec | None = Field(default=None, exclude_if=lambda undo: undo is None)
    verify: list[VerifyRule] = Field(
        default_factory=list, max_length=MAX_VERIFY_RULES, exclude_if=lambda rules: not rules
    )
    description: str = ""

    @field_validator("when")
    @classmethod
    def _when_is_condition(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                parse_condition(value, roots=WHEN_ROOTS)
            except ExpressionError as exc:
                raise PydanticCustomError(exc.code, exc.message) from None
        return value

    @property
    def condition(self) -> Condition | None:
        """The parsed ``when``: the step runs only if it holds, else it is skipped."""
        if self._condition is None and self.when is not None:
            self._condition = parse_condition(self.when, roots=WHEN_ROOTS)
        return self._condition


def dotted_path(value: str) -> tuple[str | int, ...]:
    """``"a.b[0]"`` as segments; ``""`` is the whole value. Raises ``ValueError``."""
    if not value:
        return ()
    try:
        return parse_path("." + value)
    except ExpressionError:
        raise ValueError(f"not a dotted path: {value!r}") from None


class ResultSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    step: str
    items: str = ""
    key: str

    @field_validator("items")
    @classmethod
    def _items_is_path(cls, value: str) -> str:
        dotted_path(value)
        return value


PipelineNames = list[Annotated[str, StringConstraints(pattern=NAME_PATTERN)]]


class OnSpec(BaseModel):
    """Dependency triggers: a job of this pipeline starts when a job of one of ``succeeded``
    succeeds, or when a job of one of ``new_items`` succeeds with new result items."""

    model_config = ConfigDict(extra="forbid")

    succeeded: PipelineNames = Field(default_factory=list, max_length=20)
    new_items: PipelineNames = Field(default_factory=list, max_length=20)

    @model_validator(mode="after")
    def _one_kind_per_upstream(self) -> "OnSpec":
        if not self.succeeded and not self.new_items:
            raise ValueError("on needs succeeded or new_items")
        both = sorted(set(self.succeeded) & set(self.new_items))
        if both:
            raise ValueError(f"{both[0]!r} is in both succeeded and new_items")
        return self

    @model_serializer(mode="wrap")
    def _without_empty_kinds(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """An empty kind is left out, so a profile saved before ``new_items`` existed keeps its
        stored form and content hash."""
        dumped: dict[str, Any] = handler(self)
        return {kind: names for kind, names in dumped.items() if names}

    def upstream(self) -> dict[str, str]:
        """Upstream pipeline -> the kind of trigger (``succeeded``, ``new_items``)."""
        kinds = {name: TRIGGER_ON_SUCCEEDED for name in self.succeeded}
        return kinds | {name: TRIGGER_ON_NEW_ITEMS for name in self.new_items}


class LoopSpec(BaseModel):
    """Steps run again, round after round, until ``until`` holds after the loop's last step."""

    model_config = ConfigDict(extra="forbid")
    _condition: Condition | None = PrivateAttr(default=None)

    steps: list[str] = Field(min_length=1, max_length=50)
    until: str
    max_rounds: int = Field(default=3, ge=1, le=100)
    on_exhausted: Literal["fail", "continue", "escalate"] = "fail"
    decision_timeout_s: int = Field(
        default=86400,
        ge=1,
        le=90 * 86400,
        description="escalate: how long a person has to let the loop end (else it fails)",
    )

    @field_validator("until")
    @classmethod
    def _until_is_condition(cls, value: str) -> str:
        try:
            parse_condition(value, roots=UNTIL_ROOTS)
        except ExpressionError as exc:
            raise PydanticCustomError(exc.code, exc.message) from None
        return value

    @property
    def condition(self) -> Condition:
        if self._condition is None:
            self._condition = parse_condition(self.until, roots=UNTIL_ROOTS)
        return self._condition


class Profile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    _content_hash: str | None = PrivateAttr(default=None)
    _json: dict[str, Any] | None = PrivateAttr(default=None)

    name: str = Field(pattern=NAME_PATTERN)
    description: str = ""
    tags: list[str] = Field(default_factory=list)
    params: dict[str, ParamSpec] = Field(default_factory=dict)
    steps: list[StepSpec] = Field(min_length=1, max_length=200)
    result: ResultSpec | None = None
    failure_policy: Literal["fail_fast", "best_effort"] = "fail_fast"
    schedule: ScheduleSpec | None = None
    loops: list[LoopSpec] = Field(default_factory=list, exclude_if=lambda loops: not loops)
    on_cancel: Literal["compensate", "leave"] = Field(
        default="compensate", exclude_if=lambda choice: choice == "compensate"
    )
    on: OnSpec | None = Field(default=None, exclude_if=lambda spec: spec is None)

    def step(self, step_id: str) -> StepSpec:
        for step in self.steps:
            if step.id == step_id:
                return step
        raise KeyError(step_id)

    def deps(self) -> dict[str, list[str]]:
        return {step.id: list(step.depends_on) for step in self.steps}

    def layers(self) -> list[list[str]]:
        return dag.topological_layers(self.deps())

    def loop_of(self, step_id: str) -> LoopSpec | None:
        return next((loop for loop in self.loops if step_id in loop.steps), None)

    def loop_last(self, loop: LoopSpec) -> str:
        """The one step of the loop that no other step of it depends on (validated)."""
        inside = set(loop.steps)
        return next(s for s in loop.steps if not any(s in self.step(o).depends_on for o in inside))

    def __eq__(self, other: object) -> bool:
        """Equal by content; the cached hash and JSON form are not part of a profile."""
        if not isinstance(other, Profile):
            return NotImplemented
        return self.to_json() == other.to_json()

    __hash__ = None  # type: ignore[assignment]

    def to_json(self) -> dict[str, Any]:
        """The stored form; computed once, so treat the returned dict as read-only."""
        if self._json is None:
            self._json = self.model_dump(mode="json", by_alias=True)
        return self._json

    def content_hash(self) -> str:
        """Identifies a profile version by meaning: key order and YAML formatting do not count."""
        if self._content_hash is None:
            canonical = json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"))
            self._content_hash = hashlib.sha256(canonical.encode()).hexdigest()
        return self._content_hash


def _error(code: str, message: str, field: str = "", step: str | None = None) -> ErrorEntry:
    return {"step": step, "field": field, "code": code, "message": message}


def _raise_invalid(source: str, errors: list[ErrorEntry], **extra: Any) -> NoReturn:
    first = errors[0]
    where = ""
    if first["step"] is not None:
        relative = re.sub(r"^steps\[\d+\]\.?", "", first["field"])
        where = f" step {first['step']!r}" + (f" field {relative!r}" if relative else "")
    elif first["field"]:
        where = f" field {first['field']!r}"
    message = f"{source}:{where}: {first['message']}" if where else f"{source}: {first['message']}"
    if len(errors) > 1:
        message += f" (and {len(errors) - 1} more)"
    raise ProfileInvalid(message, {"source": source, "errors": errors, **extra})


def _loc_to_field(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _schema_errors(data: Mapping[str, Any], exc: ValidationError) -> list[ErrorEntry]:
    raw_steps = data.get("steps")
    errors = []
    for err in exc.errors():
        loc = tuple(err["loc"])
        step = None
        if len(loc) >= 2 and loc[0] == "steps" and isinstance(loc[1], int):
            raw = raw_steps[loc[1]] if isinstance(raw_steps, list) else None
            step_id = raw.get("id") if isinstance(raw, dict) else None
            step = step_id if isinstance(step_id, str) else None
        code = err["type"] if err["type"] in _OWN_ERROR_CODES else "schema"
        errors.append(_error(code, err["msg"], _loc_to_field(loc), step))
    return errors


def _step_structure_errors(
    profile: Profile, known_actions: Collection[str] | None
) -> list[ErrorEntry]:
    errors = []
    ids = {step.id for step in profile.steps}
    seen: set[str] = set()
    for i, step in enumerate(profile.steps):
        if step.id in seen:
            errors.append(
                _error(
                    "duplicate_step", f"duplicate step id {step.id!r}", f"steps[{i}].id", step.id
                )
            )
        seen.add(step.id)
        undo = step.compensate
        if known_actions is not None and undo is not None and undo.action not in known_actions:
            errors.append(
                _error(
                    "unknown_action",
                    f"unknown action {undo.action!r}",
                    f"steps[{i}].compensate.action",
                    step.id,
                )
            )
        if known_actions is not None and step.action not in known_actions:
            errors.append(
                _error(
                    "unknown_action",
                    f"unknown action {step.action!r}",
                    f"steps[{i}].action",
                    step.id,
                )
            )
        errors.extend(
            _error("unknown_dependency", f"unknown step {dep!r}", f"steps[{i}].depends_on", step.id)
            for dep in step.depends_on
            if dep not in ids
        )
    return errors


def _known_deps(profile: Profile) -> dict[str, list[str]]:
    """Dependencies restricted to existing steps, first definition winning for duplicate ids,
    so cycle and reference checks still run when other errors were already found."""
    deps: dict[str, list[str]] = {}
    ids = {step.id for step in profile.steps}
    for step in profile.steps:
        deps.setdefault(step.id, [d for d in step.depends_on if d in ids])
    return deps


def _loop_errors(profile: Profile, deps: Mapping[str, list[str]]) -> list[ErrorEntry]:
    errors: list[ErrorEntry] = []
    seen: set[str] = set()
    for i, loop in enumerate(profile.loops):
        field = f"loops[{i}].steps"
        unknown = [s for s in loop.steps if s not in deps]
        twice = [s for s in loop.steps if s in seen]
        seen |= set(loop.steps)
        if unknown or twice:
            problem = f"unknown steps {unknown}" if unknown else f"steps in two loops: {twice}"
            errors.append(_error("loop_invalid", problem, field))
            continue
        errors += [_error("loop_invalid", p, field) for p in _loop_shape(profile, deps, loop)]
        errors += _until_errors(profile, deps, loop, i)
    return errors


def _loop_shape(profile: Profile, deps: Mapping[str, list[str]], loop: LoopSpec) -> Iterator[str]:
    """A loop is a piece of the DAG that can run again as a whole: nothing outside it lies
    between two of its steps, one step ends each round, and only that step has dependents
    outside it (they run once the loop is over)."""
    inside = set(loop.steps)
    between = {
        s
        for s in deps
        if s not in inside
        and dag.ancestors(deps, s) & inside
        and any(s in dag.ancestors(deps, t) for t in inside)
    }
    if between:
        yield f"steps {sorted(between)} lie between steps of the loop; add them to it"
    lasts = [s for s in loop.steps if not any(s in deps[o] for o in inside)]
    if len(lasts) != 1:
        yield f"a loop ends with exactly one step, found {sorted(lasts)}"
    leaving = sorted(
        s
        for s in loop.steps
        if s not in lasts and any(s in deps[o] for o in deps if o not in inside)
    )
    if leaving:
        yield f"only the loop's last step may have dependents outside it, not {leaving}"
    gated = sorted(s for s in loop.steps if profile.step(s).approval is not None)
    if gated:
        yield f"approval gates cannot be inside a loop: {gated}"


def _until_errors(
    profile: Profile, deps: Mapping[str, list[str]], loop: LoopSpec, index: int
) -> list[ErrorEntry]:
    inside = set(loop.steps)
    readable = inside | set().union(*(dag.ancestors(deps, s) for s in inside))
    errors = []
    for ref in loop.condition.refs():
        problem = _trigger_problem(ref, profile)
        if ref.root == "params" and ref.name not in profile.params:
            problem = f"{ref} refers to undeclared param {ref.name!r}"
        if ref.root == "steps" and ref.name not in readable:
            problem = f"{ref}: only the loop's steps and their upstream can be read"
        if problem is not None:
            errors.append(_error("bad_reference", problem, f"loops[{index}].until"))
    return errors


def _trigger_errors(profile: Profile) -> list[ErrorEntry]:
    if profile.on is not None and profile.name in profile.on.upstream():
        return [_error("trigger_cycle", "a pipeline cannot start on its own success", "on")]
    return []


def _cycle_errors(profile: Profile, deps: Mapping[str, list[str]]) -> list[ErrorEntry]:
    cycle = dag.find_cycle(deps)
    if cycle is None:
        return []
    index = next(i for i, step in enumerate(profile.steps) if step.id == cycle[0])
    return [
        _error(
            "cycle",
            "dependency cycle: " + " -> ".join(cycle),
            f"steps[{index}].depends_on",
            cycle[0],
        )
    ]


def _ref_problem(
    ref: Ref,
    step: StepSpec,
    params: Collection[str],
    upstream: Collection[str],
    in_with: bool,
    gated: Collection[str] = (),
    loop: Collection[str] = (),
    own_output: bool = False,
) -> str | None:
    if ref.root == "params" and ref.name not in params:
        return f"{ref} refers to undeclared param {ref.name!r}"
    if ref.root == "steps" and ref.name == step.id and own_output:
        return None
    if ref.root == "steps" and ref.name == step.id:
        return f"{ref}: a step cannot reference its own output"
    if ref.root == "steps" and ref.name not in upstream:
        return f"{ref}: step {step.id!r} must depend on {ref.name!r} (directly or transitively)"
    if ref.root == "item" and not (in_with and step.for_each is not None):
        return f"{ref}: 'item' is only defined in the 'with' of a for_each step"
    if ref.root == "approval" and ref.name not in gated:
        return f"{ref}: step {ref.name!r} has no approval gate"
    if ref.root == "approval" and ref.name != step.id and ref.name not in upstream:
        return f"{ref}: step {step.id!r} must depend on {ref.name!r} (directly or transitively)"
    if ref.root == "approval" and not in_with and ref.name == step.id:
        return f"{ref}: a step's own decision is known only once it runs, in its 'with'"
    if ref.root == "loop" and not loop:
        return f"{ref}: 'loop' is only defined for the steps of a loop"
    if ref.root == "loop" and ref.name == "previous" and ref.path[0] not in loop:
        return f"{ref}: {ref.path[0]!r} is not a step of this loop"
    return None


def _trigger_problem(ref: Ref, profile: Profile) -> str | None:
    if ref.root == "trigger" and profile.on is None:
        return (
            "trigger.* is only defined in a pipeline with on: {succeeded: [...]}"
            " or on: {new_items: [...]}"
        )
    return None


def _field_refs(step: StepSpec, index: int) -> Iterator[tuple[str, Any, bool]]:
    for key, value in step.with_.items():
        yield f"steps[{index}].with.{key}", value, True
    if step.compensate is not None:
        for key, value in step.compensate.with_.items():
            yield f"steps[{index}].compensate.with.{key}", value, False
    if step.for_each is not None:
        yield f"steps[{index}].for_each.items", step.for_each.items, False


def _condition_refs(step: StepSpec, index: int) -> Iterator[tuple[str, Ref]]:
    if step.condition is not None:
        for ref in step.condition.refs():
            yield f"steps[{index}].when", ref
    for j, rule in enumerate(step.verify):
        for ref in rule.condition.refs() if rule.expr is not None else ():
            yield f"steps[{index}].verify[{j}].expr", ref


def _reference_errors(profile: Profile, deps: Mapping[str, list[str]]) -> list[ErrorEntry]:
    errors = []
    gated = {step.id for step in profile.steps if step.approval is not None}
    for i, step in enumerate(profile.steps):
        upstream = dag.ancestors(deps, step.id) - {step.id}
        loop = profile.loop_of(step.id)
        loop_steps = set(loop.steps) if loop is not None else set()
        for field, value, in_with in _field_refs(step, i):
            try:
                refs = parse_refs(value)
            except ExpressionError as exc:
                errors.append(_error("bad_reference", exc.message, field, step.id))
                continue
            for ref in refs:
                problem = _trigger_problem(ref, profile) or _ref_problem(
                    ref,
                    step,
                    profile.params,
                    upstream,
                    in_with,
                    gated,
                    loop_steps,
                    own_output=".compensate." in field,
                )
                if problem is not None:
                    errors.append(_error("bad_reference", problem, field, step.id))
        for field, ref in _condition_refs(step, i):
            problem = _trigger_problem(ref, profile) or _ref_problem(
                ref, step, profile.params, upstream, False, gated, loop_steps
            )
            if problem is not None:
                errors.append(_error("bad_reference", problem, field, step.id))
    return errors


def _result_errors(profile: Profile) -> list[ErrorEntry]:
    result = profile.result
    if result is None or any(step.id == result.step for step in profile.steps):
        return []
    return [
        _error(
            "unknown_result_step", f"result refers to unknown step {result.step!r}", "result.step"
        )
    ]


def _schedule_errors(profile: Profile) -> list[ErrorEntry]:
    """A schedule block is checked like a schedule body, except that it may leave required
    params to the operator's PUT (a shipped data job cannot know its URL). Operator limits apply
    only when an operator actually schedules the pipeline, since deployments differ."""
    if profile.schedule is None:
        return []
    try:
        schedule = normalize(profile.schedule)
        resolve_params(profile, schedule.params)
    except ParamsInvalid as exc:
        wrong = [e for e in exc.details.get("errors", []) if e.get("code") != "missing_param"]
        return [_error(exc.code, e["message"], "schedule.params") for e in wrong]
    except FlowbeatError as exc:
        return [_error(exc.code, exc.message, "schedule")]
    return []


def validate_profile(
    data: object, *, source: str, known_actions: Collection[str] | None = None
) -> Profile:
    """Build a ``Profile`` or raise one ``ProfileInvalid`` listing every problem found."""
    if not isinstance(data, dict):
        _raise_invalid(source, [_error("schema", "a profile must be a mapping")])
    if True in data and "on" not in data:
        data = {"on" if key is True else key: value for key, value in data.items()}
    try:
        profile = Profile.model_validate(data)
    except ValidationError as exc:
        _raise_invalid(source, _schema_errors(data, exc))
    deps = _known_deps(profile)
    errors = [
        *_step_structure_errors(profile, known_actions),
        *_cycle_errors(profile, deps),
        *_trigger_errors(profile),
        *_reference_errors(profile, deps),
        *_loop_errors(profile, deps),
        *_result_errors(profile),
        *_schedule_errors(profile),
    ]
    if errors:
        _raise_invalid(source, errors)
    return profile


def _too_many_nodes(data: Any) -> bool:
    """YAML aliases can make a small file expand to a huge or recursive object graph."""
    budget = MAX_DOCUMENT_NODES
    stack = [data]
    while stack:
        budget -= 1
        if budget < 0:
            return True
        node = stack.pop()
        if isinstance(node, dict):
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return False


def load_profile_text(
    text: str, *, source: str, known_actions: Collection[str] | None = None
) -> Profile:
    return validate_profile(
        load_profile_document(text, source=source), source=source, known_actions=known_actions
    )


def load_profile_document(text: str, *, source: str) -> Any:
    """The YAML (or JSON) document of a profile's text, not yet validated: a command that
    submits a file reads it here, so a syntax error is the same ``profile_invalid`` with its
    line and column that saving the file gives."""
    size = len(text.encode("utf-8", errors="replace"))
    if size > MAX_PROFILE_BYTES:
        message = f"profile is {size} bytes, the limit is {MAX_PROFILE_BYTES}"
        _raise_invalid(source, [_error("too_large", message)])
    try:
        data = load_yaml(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        column = mark.column + 1 if mark is not None else None
        code = exc.kind if isinstance(exc, YamlLimitExceeded) else "yaml_syntax"
        where = f" at line {line}, column {column}" if mark is not None else ""
        entry = _error(code, f"invalid YAML{where}: {getattr(exc, 'problem', None) or exc}")
        entry.update(line=line, column=column)
        _raise_invalid(source, [entry], line=line, column=column)
    if _too_many_nodes(data):
        message = f"document expands to more than {MAX_DOCUMENT_NODES} values"
        _raise_invalid(source, [_error("too_large", message)])
    return data


def load_profile_file(path: Path, *, known_actions: Collection[str] | None = None) -> Profile:
    source = str(path)
    if path.stat().st_size > MAX_PROFILE_BYTES:
        message = f"profile is {path.stat().st_size} bytes, the limit is {MAX_PROFILE_BYTES}"
        _raise_invalid(source, [_error("too_large", message)])
    return load_profile_text(
        path.read_text(encoding="utf-8"), source=source, known_actions=known_actions
    )


def _profile_path(profiles_dir: Path, name: str) -> tuple[Path, os.stat_result] | None:
    """The file for ``name`` directly inside ``profiles_dir``, and its stat; a symlink leading
    elsewhere counts as absent so a profile directory cannot be used to read arbitrary files.

    ``name`` holds no separator, so a regular file found by ``lstat`` is inside the directory
    by construction: one system call, where resolving every path costs one per component on
    each job submitted. Only a symlink needs resolving."""
    for suffix in PROFILE_SUFFIXES:
        candidate = profiles_dir / f"{name}{suffix}"
        try:
            found = candidate.lstat()
        except (FileNotFoundError, NotADirectoryError):
            continue
        except OSError as exc:
            log.warning("profile %s cannot be read: %s", candidate, exc)
            continue
        if stat.S_ISREG(found.st_mode):
            return candidate, found
        if not stat.S_ISLNK(found.st_mode):
            continue
        target = candidate.resolve()
        if target.parent == profiles_dir.resolve() and target.is_file():
            return target, target.stat()
    return None


@lru_cache(maxsize=256)
def _load_file_cached(
    path: Path, mtime_ns: int, size: int, known_actions: frozenset[str] | None
) -> Profile:
    """Saved profiles are read on every job; parse each version of a file once."""
    del mtime_ns, size
    return load_profile_file(path, known_actions=known_actions)


def search_dirs(profiles_dir: Path | None) -> list[Path]:
    """The operator's directory first, so a file of theirs takes the place of a shipped profile
    of the same name (and of its data files), then the shipped profiles."""
    if profiles_dir is None or profiles_dir == SHIPPED_DIR:
        return [SHIPPED_DIR]
    return [profiles_dir, SHIPPED_DIR]


def profile_file_exists(profiles_dir: Path | None, name: str) -> bool:
    """Whether ``name`` is a profile file, the operator's or shipped: such names are not saved."""
    return any(_profile_path(directory, name) for directory in search_dirs(profiles_dir))


def find_profile(
    profiles_dir: Path | None, name: str, *, known_actions: Collection[str] | None = None
) -> Profile:
    """``name`` from the operator's ``profiles_dir`` if it holds one, else a shipped profile."""
    if not re.fullmatch(NAME_PATTERN, name):
        _raise_invalid(name, [_error("bad_name", f"invalid profile name {name!r}", "name")])
    found = next((hit for d in search_dirs(profiles_dir) if (hit := _profile_path(d, name))), None)
    if found is None:
        raise ProfileNotFound(f"no profile named {name!r}", {"name": name})
    path, file_stat = found
    actions = frozenset(known_actions) if known_actions is not None else None
    profile = _load_file_cached(path, file_stat.st_mtime_ns, file_stat.st_size, actions)
    if profile.name != name:
        message = f"profile name {profile.name!r} does not match file name {name!r}"
        _raise_invalid(str(path), [_error("name_mismatch", message, "name")])
    if profile.on is not None:
        message = (
            "on: is recorded when a pipeline is saved (flowbeat pipelines save FILE), for its "
            "owner; a profile file serves every owner and cannot carry triggers"
        )
        _raise_invalid(str(path), [_error("on_in_file", message, "on")])
    return profile


def list_profiles(
    profiles_dir: Path | None, *, known_actions: Collection[str] | None = None
) -> list[Profile]:
    """Every profile of ``profiles_dir`` and the shipped ones; an invalid file raises rather
    than silently vanishing, and a directory that can no longer be read (it was checked at start)
    is skipped with a warning rather than failing every listing."""
    stems: set[str] = set()
    for directory in search_dirs(profiles_dir):
        try:
            stems |= {p.stem for p in directory.iterdir() if p.suffix in PROFILE_SUFFIXES}
        except OSError as exc:
            log.warning("profiles in %s cannot be listed: %s", directory, exc)
    profiles = [
        find_profile(profiles_dir, stem, known_actions=known_actions) for stem in sorted(stems)
    ]
    return sorted(profiles, key=lambda profile: profile.name)


def resolve_params(profile: Profile, given: Mapping[str, Any]) -> dict[str, Any]:
    """Check job params against the declaration and fill defaults. ``None`` counts as absent,
    as JSON clients often send null for "not set"."""
    errors: list[ErrorEntry] = [
        {"param": name, "code": "unknown_param", "message": f"unknown param {name!r}"}
        for name in given
        if name not in profile.params
    ]
    resolved: dict[str, Any] = {}
    for name, spec in profile.params.items():
        value = given.get(name)
        if value is None:
            if spec.required:
                errors.append(
                    {
                        "param": name,
                        "code": "missing_param",
                        "message": f"param {name!r} is required",
                    }
                )
            resolved[name] = copy.deepcopy(spec.default)
        elif json_type_ok(spec.type, value):
            resolved[name] = value
        else:
            errors.append(
                {
                    "param": name,
                    "code": "wrong_type",
                    "message": f"param {name!r} must be of type {spec.type}",
                }
            )
    if errors:
        raise ParamsInvalid(f"invalid params: {errors[0]['message']}", {"errors": errors})
    return resolved


def write_json_schema(path: Path = SCHEMA_PATH) -> None:
    schema = Profile.model_json_schema(by_alias=True)
    path.write_text(json.dumps(schema, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    write_json_schema()
