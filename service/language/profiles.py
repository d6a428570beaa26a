"""The profile model: a pipeline with its params, steps, loops, result, failure policy,
schedule and dependency triggers, its canonical JSON and content hash, and the JSON Schema
written from it (``python -m service.language.profiles``).

The parts it is made of are in ``specs``, the checks across steps in ``checks``, reading from
text and files in ``loading``, job params in ``params``.
"""

import hashlib
import json
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    SerializerFunctionWrapHandler,
    StringConstraints,
    field_validator,
    model_serializer,
    model_validator,
)
from pydantic_core import PydanticCustomError

from service.language import dag
from service.language.conditions import Condition, parse_condition
from service.language.cron import ScheduleSpec
from service.language.labels import label_templates
from service.language.specs import (
    NAME_PATTERN,
    UNTIL_ROOTS,
    ConcurrencySpec,
    DedupeSpec,
    ParamSpec,
    ResultSpec,
    StepSpec,
    memo,
)
from service.platform.constants import (
    DEFAULT_QUEUE,
    MAX_JOB_TIMEOUT_S,
    MAX_PRIORITY,
    QUEUE_PATTERN,
    SHIPPED_DIR,
    TRIGGER_ON_NEW_ITEMS,
    TRIGGER_ON_SUCCEEDED,
)
from service.platform.errors import ExpressionError

SCHEMA_PATH = SHIPPED_DIR / "profile.schema.json"

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
        return memo(self, "_condition", lambda: parse_condition(self.until, roots=UNTIL_ROOTS))


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
    queue: str = Field(
        default=DEFAULT_QUEUE, pattern=QUEUE_PATTERN, exclude_if=lambda q: q == DEFAULT_QUEUE
    )
    """The queue of every step that names none."""
    priority: int = Field(default=0, ge=0, le=MAX_PRIORITY, exclude_if=lambda p: p == 0)
    concurrency: ConcurrencySpec | None = Field(default=None, exclude_if=lambda c: c is None)
    """A job's priority when its submission gives none: higher runs first within a queue."""
    dedupe: DedupeSpec | None = Field(default=None, exclude_if=lambda d: d is None)
    """Left out of the stored form when unset, as ``concurrency`` is, so hashes stay."""
    labels: dict[str, str] = Field(
        default_factory=dict,
        exclude_if=lambda labels: not labels,
        description="labels of every job of the pipeline; a value may read params "
        '(tenant: "${{ params.tenant }}"); a submission\'s own labels win',
    )
    timeout_s: int | None = Field(
        default=None,
        ge=1,
        le=MAX_JOB_TIMEOUT_S,
        exclude_if=lambda t: t is None,
        description="the job's deadline, in seconds from its submission: a job still open "
        "then is failed as job_timeout",
    )
    """Enforced by the elected beat replica (``engine.deadlines``). Left out of the stored form
    when unset, so the hashes of the profiles saved before it stay what they were."""

    _labels_within_limits = field_validator("labels", mode="before")(label_templates)

    def step(self, step_id: str) -> StepSpec:
        for step in self.steps:
            if step.id == step_id:
                return step
        raise KeyError(step_id)

    def queue_of(self, step_id: str) -> str:
        return self.step(step_id).queue or self.queue

    def entry_queue(self) -> str:
        """The queue of its first step with nothing upstream, where a new job first waits."""
        return self.queue_of(next(step.id for step in self.steps if not step.depends_on))

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
        return memo(self, "_json", lambda: self.model_dump(mode="json", by_alias=True))

    def content_hash(self) -> str:
        """Identifies a profile version by meaning: key order and YAML formatting do not count."""
        return memo(self, "_content_hash", self._hash)

    def _hash(self) -> str:
        canonical = json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()


def write_json_schema(path: Path = SCHEMA_PATH) -> None:
    schema = Profile.model_json_schema(by_alias=True)
    path.write_text(json.dumps(schema, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    write_json_schema()
