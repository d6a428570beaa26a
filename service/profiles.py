"""Pipeline profiles: the YAML models, their validation and loading.

Validation runs in two phases. The pydantic schema checks each field on its own; the semantic
phase then checks what spans steps (ids, dependencies, cycles, actions, references). Every
problem of a phase is reported at once in one ``ProfileInvalid`` so a user fixes a file in one
pass; the semantic phase only runs on a schema-valid document, since it needs well-typed steps.
"""

import copy
import hashlib
import json
import math
import os
import random
import re
import stat
from collections.abc import Callable, Collection, Iterator, Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal, NoReturn

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from service import dag
from service.cron import ScheduleSpec, normalize
from service.errors import (
    ExpressionError,
    FlowbeatError,
    ParamsInvalid,
    ProfileInvalid,
    ProfileNotFound,
)
from service.expressions import Ref, parse_path, parse_refs, whole_ref

NAME_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,63}$"
STEP_ID_PATTERN = r"^[a-z][a-z0-9_]{0,63}$"
MAX_PROFILE_BYTES = 256 * 1024
MAX_DOCUMENT_NODES = 100_000
SCHEMA_PATH = Path(__file__).resolve().parent.parent / "profiles" / "profile.schema.json"
PROFILE_SUFFIXES = (".yaml", ".yml")

ParamType = Literal["string", "integer", "number", "boolean", "array", "object"]
ErrorEntry = dict[str, Any]


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


class StepSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, serialize_by_alias=True)

    id: str = Field(pattern=STEP_ID_PATTERN)
    action: str
    with_: dict[str, Any] = Field(default_factory=dict, alias="with")
    depends_on: list[str] = Field(default_factory=list)
    retry: RetryPolicy = Field(default_factory=RetryPolicy)
    timeout_s: int = Field(default=300, ge=1, le=86400)
    for_each: ForEach | None = None
    description: str = ""


class ResultSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    step: str
    items: str = ""
    key: str

    @field_validator("items")
    @classmethod
    def _items_is_path(cls, value: str) -> str:
        if value:
            try:
                parse_path("." + value)
            except ExpressionError:
                raise ValueError(f"not a dotted path: {value!r}") from None
        return value


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

    def step(self, step_id: str) -> StepSpec:
        for step in self.steps:
            if step.id == step_id:
                return step
        raise KeyError(step_id)

    def deps(self) -> dict[str, list[str]]:
        return {step.id: list(step.depends_on) for step in self.steps}

    def layers(self) -> list[list[str]]:
        return dag.topological_layers(self.deps())

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
        code = "bad_reference" if err["type"] == "bad_reference" else "schema"
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
    ref: Ref, step: StepSpec, params: Collection[str], upstream: Collection[str], in_with: bool
) -> str | None:
    if ref.root == "params" and ref.name not in params:
        return f"{ref} refers to undeclared param {ref.name!r}"
    if ref.root == "steps" and ref.name == step.id:
        return f"{ref}: a step cannot reference its own output"
    if ref.root == "steps" and ref.name not in upstream:
        return f"{ref}: step {step.id!r} must depend on {ref.name!r} (directly or transitively)"
    if ref.root == "item" and not (in_with and step.for_each is not None):
        return f"{ref}: 'item' is only defined in the 'with' of a for_each step"
    return None


def _field_refs(step: StepSpec, index: int) -> Iterator[tuple[str, Any, bool]]:
    for key, value in step.with_.items():
        yield f"steps[{index}].with.{key}", value, True
    if step.for_each is not None:
        yield f"steps[{index}].for_each.items", step.for_each.items, False


def _reference_errors(profile: Profile, deps: Mapping[str, list[str]]) -> list[ErrorEntry]:
    errors = []
    for i, step in enumerate(profile.steps):
        upstream = dag.ancestors(deps, step.id) - {step.id}
        for field, value, in_with in _field_refs(step, i):
            try:
                refs = parse_refs(value)
            except ExpressionError as exc:
                errors.append(_error("bad_reference", exc.message, field, step.id))
                continue
            for ref in refs:
                problem = _ref_problem(ref, step, profile.params, upstream, in_with)
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
    try:
        profile = Profile.model_validate(data)
    except ValidationError as exc:
        _raise_invalid(source, _schema_errors(data, exc))
    deps = _known_deps(profile)
    errors = [
        *_step_structure_errors(profile, known_actions),
        *_cycle_errors(profile, deps),
        *_reference_errors(profile, deps),
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
    size = len(text.encode("utf-8", errors="replace"))
    if size > MAX_PROFILE_BYTES:
        message = f"profile is {size} bytes, the limit is {MAX_PROFILE_BYTES}"
        _raise_invalid(source, [_error("too_large", message)])
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        column = mark.column + 1 if mark is not None else None
        entry = _error("yaml_syntax", f"invalid YAML: {getattr(exc, 'problem', None) or exc}")
        entry.update(line=line, column=column)
        _raise_invalid(source, [entry], line=line, column=column)
    if _too_many_nodes(data):
        message = f"document expands to more than {MAX_DOCUMENT_NODES} values"
        _raise_invalid(source, [_error("too_large", message)])
    return validate_profile(data, source=source, known_actions=known_actions)


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


def find_profile(
    profiles_dir: Path, name: str, *, known_actions: Collection[str] | None = None
) -> Profile:
    if not re.fullmatch(NAME_PATTERN, name):
        _raise_invalid(name, [_error("bad_name", f"invalid profile name {name!r}", "name")])
    found = _profile_path(profiles_dir, name)
    if found is None:
        raise ProfileNotFound(f"no profile named {name!r}", {"name": name})
    path, file_stat = found
    actions = frozenset(known_actions) if known_actions is not None else None
    profile = _load_file_cached(path, file_stat.st_mtime_ns, file_stat.st_size, actions)
    if profile.name != name:
        message = f"profile name {profile.name!r} does not match file name {name!r}"
        _raise_invalid(str(path), [_error("name_mismatch", message, "name")])
    return profile


def list_profiles(
    profiles_dir: Path, *, known_actions: Collection[str] | None = None
) -> list[Profile]:
    """Every profile in the directory; an invalid file raises rather than silently vanishing."""
    stems = sorted({p.stem for p in profiles_dir.iterdir() if p.suffix in PROFILE_SUFFIXES})
    profiles = [find_profile(profiles_dir, stem, known_actions=known_actions) for stem in stems]
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
