"""The parts of a profile: declared params, steps with their retries, fan-out, approvals,
compensations and verify rules, and the result; each checked on its own by pydantic."""

import math
import random
from collections.abc import Callable
from typing import Annotated, Any, Literal, TypeVar
from urllib.parse import urlsplit

from jsonschema.exceptions import SchemaError
from jsonschema.validators import validator_for
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from service.language.actionschemas import engine_actions_schema
from service.language.conditions import Condition, parse_condition
from service.language.expressions import (
    CONCURRENCY_ROOTS,
    Ref,
    parse_path,
    parse_refs,
    whole_ref,
)
from service.platform.constants import CACHE_TTL_MAX_S, DEDUPE_WINDOW_MAX_S, QUEUE_PATTERN
from service.platform.errors import (
    ExpressionError,
)

NAME_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,63}$"
STEP_ID_PATTERN = r"^[a-z][a-z0-9_]{0,63}$"


ParamType = Literal["string", "integer", "number", "boolean", "array", "object"]
ErrorEntry = dict[str, Any]

VERIFY_ROOTS = frozenset({"output", "params", "trigger"})
"""A verify ``expr`` checks the step's own output, so it names ``output`` (and params, and in a
job another's success started, ``trigger``), never another step."""
WHEN_ROOTS = frozenset({"params", "steps", "approval", "trigger", "schedule", "signals"})
UNTIL_ROOTS = frozenset({"params", "steps", "loop", "trigger"})
RULE_KINDS = ("not_empty", "min_items", "max_items", "json_schema", "expr")
MAX_VERIFY_RULES = 50

_T = TypeVar("_T")


def memo(model: BaseModel, name: str, compute: Callable[[], _T]) -> _T:
    """A private attribute of ``model`` computed once, read from pydantic's private dict.

    pydantic reads a private attribute through ``BaseModel.__getattr__``, whose test for a
    descriptor raises and catches inside pydantic: about 2 µs a read. A worker reads the
    profile's hash (the key of its step facts) and a step's parsed ``when`` many times a
    step, so each read goes to the dict that ``__getattr__`` would read."""
    private = model.__pydantic_private__
    assert private is not None
    value: _T | None = private[name]
    if value is None:
        value = private[name] = compute()
    return value


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
        expr = self.expr
        assert expr is not None
        return memo(self, "_condition", lambda: parse_condition(expr, roots=VERIFY_ROOTS))


class CompensateSpec(BaseModel):
    """What undoes a succeeded step when a later one fails for good (a saga)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, serialize_by_alias=True)

    action: str
    with_: dict[str, Any] = Field(default_factory=dict, alias="with")
    retry: RetryPolicy = Field(default_factory=RetryPolicy)
    timeout_s: int = Field(default=300, ge=1, le=86400)


class CacheSpec(BaseModel):
    """On a step: before its action runs, its resolved inputs (secrets by name), the action's
    name and version form a key; a succeeded step of the same owner with that key, no older
    than ``ttl_s``, gives its output instead, unless the job was submitted with ``refresh``."""

    model_config = ConfigDict(extra="forbid")

    ttl_s: int = Field(
        ge=1,
        le=CACHE_TTL_MAX_S,
        description="how long a step's output may be reused by a step with the same key",
    )


def _reads_params_only(value: str) -> str:
    """A key shared across jobs is resolved before any step runs: it may read ``params`` only."""
    try:
        parse_refs(value, roots=CONCURRENCY_ROOTS)
    except ExpressionError as exc:
        raise PydanticCustomError(exc.code, exc.message) from None
    return value


ParamsKey = Annotated[str, AfterValidator(_reads_params_only)]
"""The key of a concurrency limit, a rate limit or a dedupe window."""


class ConcurrencySpec(BaseModel):
    """On a profile: at most ``limit`` of its jobs with the same ``key`` open at once; on a
    step: at most ``limit`` steps with the same ``key`` running at once, across every job.
    The others wait, first come first served, holding no worker and no message."""

    model_config = ConfigDict(extra="forbid")

    key: ParamsKey = Field(min_length=1, max_length=200)
    limit: int = Field(ge=1, le=10_000)


class RateLimitSpec(BaseModel):
    """On a step: at most ``limit`` units of ``key`` started in any window of ``per_s``
    seconds, counted across every worker, job and owner that names the key; each attempt of
    the step takes ``units``. A step that finds no room waits ``awaiting_rate``, holding no
    worker and no message, until the window has room (``service.engine.rates``)."""

    model_config = ConfigDict(extra="forbid")

    key: ParamsKey = Field(
        min_length=1,
        max_length=200,
        description='what the limit is shared under; may read params ("${{ params.tenant }}-lims")',
    )
    limit: int = Field(ge=1, le=100_000, description="units let through in any window")
    per_s: Literal[1, 60, 3600] = Field(
        default=1, description="the window in seconds: 1 (a second), 60 (a minute), 3600"
    )
    units: int = Field(default=1, ge=1, description="units one attempt of the step takes")

    @model_validator(mode="after")
    def _units_fit(self) -> "RateLimitSpec":
        if self.units > self.limit:
            raise PydanticCustomError(
                "rate_units_over_limit",
                "units ({units}) must not exceed limit ({limit}): the step could never start",
                {"units": self.units, "limit": self.limit},
            )
        return self


class DedupeSpec(BaseModel):
    """On a profile: a job whose ``key`` resolves to the value of an open job of the same owner
    and pipeline, or of one that ended less than ``window_s`` ago, is not stored; the
    submission gets that job back (``return``) or is refused ``duplicate_job`` naming it
    (``reject``), so a burst of the same request reaches its source once."""

    model_config = ConfigDict(extra="forbid")

    key: ParamsKey = Field(
        min_length=1,
        max_length=200,
        description='what makes two jobs the same, read from params ("${{ params.query }}")',
    )
    window_s: int = Field(
        default=0,
        ge=0,
        le=DEDUPE_WINDOW_MAX_S,
        description="how long after a job ends it still answers for its key (0: while open)",
    )
    on_duplicate: Literal["return", "reject"] = Field(
        default="return",
        description="return: the submission gets the job (200, deduplicated: true); "
        "reject: 409 duplicate_job naming it",
    )


class WaitForSpec(BaseModel):
    """The step runs once a machine sends the job this signal
    (``POST /v1/jobs/{id}/signals/{name}``); until then it waits holding no worker. A signal
    sent before the step waits is kept for it. ``on_timeout`` says what happens when none
    arrives within ``timeout_s`` of the step starting to wait: ``fail`` fails the step for good
    (``signal_timeout``), ``continue`` runs it with ``signals.<name>`` reading ``null``."""

    model_config = ConfigDict(extra="forbid")

    signal: str = Field(pattern=STEP_ID_PATTERN)
    timeout_s: int = Field(default=86400, ge=1, le=90 * 86400)
    on_timeout: Literal["fail", "continue"] = "fail"


class StepSpec(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        populate_by_name=True,
        serialize_by_alias=True,
        json_schema_extra=engine_actions_schema,
    )
    _condition: Condition | None = PrivateAttr(default=None)

    id: str = Field(pattern=STEP_ID_PATTERN)
    action: str
    with_: dict[str, Any] = Field(
        default_factory=dict,
        alias="with",
        description="the action's inputs; strings may hold ${{ params.x }}, "
        "${{ steps.ID.output[.path] }}, ${{ item }}, ${{ secrets.NAME }} (an operator's secret, "
        "revealed only to the action and masked in its logs, output and errors; never in a "
        "URL's scheme or host) and the other references of the profiles guide",
    )
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
    queue: str | None = Field(default=None, pattern=QUEUE_PATTERN, exclude_if=_never_null)
    concurrency: ConcurrencySpec | None = Field(default=None, exclude_if=_never_null)
    """The worker pool that runs this step (``flowbeat worker --queues``); else the profile's."""
    description: str = ""
    wait_for: WaitForSpec | None = Field(default=None, exclude_if=_never_null)
    cache: CacheSpec | None = Field(default=None, exclude_if=_never_null)
    rate_limit: RateLimitSpec | None = Field(default=None, exclude_if=_never_null)

    @field_validator("when")
    @classmethod
    def _when_is_condition(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                parse_condition(value, roots=WHEN_ROOTS)
            except ExpressionError as exc:
                raise PydanticCustomError(exc.code, exc.message) from None
        return value

    @model_validator(mode="after")
    def _one_slot_per_step(self) -> "StepSpec":
        if self.concurrency is not None and self.for_each is not None:
            raise PydanticCustomError(
                "concurrency_with_for_each",
                "a for_each step has no concurrency of its own; bound its items with "
                "for_each.max_parallel",
            )
        if self.rate_limit is not None and self.for_each is not None:
            raise PydanticCustomError(
                "rate_limit_with_for_each",
                "a for_each step takes no rate limit of its own; put rate_limit on a step "
                "that runs once per call to the source",
            )
        return self

    @property
    def condition(self) -> Condition | None:
        """The parsed ``when``: the step runs only if it holds, else it is skipped."""
        when = self.when
        if when is None:
            return None
        return memo(self, "_condition", lambda: parse_condition(when, roots=WHEN_ROOTS))


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
