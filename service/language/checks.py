"""What a profile's schema cannot check on its own, since it spans steps: ids, dependencies,
cycles, loops, actions, references, triggers, the result and the schedule.

Validation runs in two phases. The pydantic schema checks each field on its own; this phase then
checks what spans steps. Every problem of a phase is reported at once in one ``ProfileInvalid``
so a user fixes a file in one pass; this phase only runs on a schema-valid document, since it
needs well-typed steps."""

import re
from collections.abc import Collection, Iterator, Mapping
from typing import Any, NoReturn

from pydantic import (
    ValidationError,
)

from service.language import dag
from service.language.actionnames import action_names, closest_actions, did_you_mean
from service.language.cron import normalize
from service.language.expressions import CONCURRENCY_ROOTS, Ref, parse_refs
from service.language.params import resolve_params
from service.language.profiles import LoopSpec, Profile
from service.language.secretrefs import secret_errors
from service.language.specs import ErrorEntry, StepSpec
from service.language.subpipes import problems as run_problems
from service.language.waits import problems as wait_problems
from service.platform.constants import PIPELINE_RUN_ACTION, WAIT_ACTION
from service.platform.errors import (
    ExpressionError,
    FlowbeatError,
    ParamsInvalid,
    ProfileInvalid,
)

_OWN_ERROR_CODES = frozenset({"bad_reference", "condition_invalid", "json_schema_invalid"})


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
                _unknown_action(undo.action, known_actions, f"steps[{i}].compensate.action", step)
            )
        runs_action = step.action not in (WAIT_ACTION, PIPELINE_RUN_ACTION)
        if known_actions is not None and runs_action and step.action not in known_actions:
            errors.append(_unknown_action(step.action, known_actions, f"steps[{i}].action", step))
        errors.extend(
            _error("unknown_dependency", f"unknown step {dep!r}", f"steps[{i}].depends_on", step.id)
            for dep in step.depends_on
            if dep not in ids
        )
    return errors


def _unknown_action(
    name: str, known_actions: Collection[str], field: str, step: StepSpec
) -> ErrorEntry:
    """Named with the closest known names, in the message and as ``closest``, so the writer
    (or an LLM client) fixes the typo without looking the catalogue up."""
    closest = closest_actions(name, known_actions)
    message = f"unknown action {name!r}{did_you_mean(closest)}"
    return {**_error("unknown_action", message, field, step.id), "closest": closest}


def _wait_errors(profile: Profile) -> list[ErrorEntry]:
    """A ``wait`` step is the engine's own: what it waits for, and nothing an action would use;
    so is a ``pipeline.run`` step: what it calls."""
    return [
        _error(code, message, f"steps[{i}].{field}", step.id)
        for i, step in enumerate(profile.steps)
        for code, check in (("wait_invalid", WAIT_ACTION), ("child_invalid", PIPELINE_RUN_ACTION))
        if step.action == check
        for field, message in (wait_problems if check == WAIT_ACTION else run_problems)(step)
    ]


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
    waits = sorted(s for s in loop.steps if profile.step(s).action == WAIT_ACTION)
    if waits:
        yield f"wait steps cannot be inside a loop: {waits}"
    calls = sorted(s for s in loop.steps if profile.step(s).action == PIPELINE_RUN_ACTION)
    if calls:
        yield f"pipeline.run steps cannot be inside a loop: {calls}"
    waiting = sorted(s for s in loop.steps if profile.step(s).wait_for is not None)
    if waiting:
        yield f"signal waits cannot be inside a loop (a signal is sent once): {waiting}"


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


def _dedupe_errors(profile: Profile) -> list[ErrorEntry]:
    """A dedupe key reads declared params only, which every job of the pipeline has."""
    if profile.dedupe is None:
        return []
    return [
        _error("bad_reference", f"{ref} refers to undeclared param {ref.name!r}", "dedupe.key")
        for ref in parse_refs(profile.dedupe.key, roots=CONCURRENCY_ROOTS)
        if ref.name not in profile.params
    ]


def _cache_errors(profile: Profile, known_actions: Collection[str] | None) -> list[ErrorEntry]:
    """A step may declare ``cache`` only where reusing an output is what its action allows:
    not the engine's own actions, not an action registered with ``cache=False`` (its point is
    a side effect, or what it reads changes), not a step of a loop (each round runs again)."""
    uncacheable = set() if known_actions is None else action_names(known_actions).uncacheable
    looped = {step for loop in profile.loops for step in loop.steps}
    errors = []
    for i, step in enumerate(profile.steps):
        if step.cache is None:
            continue
        if step.action in (WAIT_ACTION, PIPELINE_RUN_ACTION) or step.action in uncacheable:
            problem = f"action {step.action!r} refuses the step cache (it has side effects)"
        elif step.id in looped:
            problem = "a step of a loop runs every round; it cannot be cached"
        else:
            continue
        errors.append(_error("cache_refused", problem, f"steps[{i}].cache", step.id))
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
    if ref.root == "secrets" and not in_with:
        return f"{ref}: secrets are read only in a step's 'with'"
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


def _signal_problem(
    ref: Ref, step: StepSpec, profile: Profile, upstream: Collection[str], in_with: bool
) -> str | None:
    """``signals.<name>`` is read where its signal is known: in the ``with`` or ``when`` of the
    step that waits for it, or of a step downstream of one that does."""
    if ref.root != "signals":
        return None
    waiters = {s.id for s in profile.steps if s.wait_for and s.wait_for.signal == ref.name}
    if not waiters:
        return f"{ref}: no step of this pipeline waits for signal {ref.name!r} (wait_for)"
    if not in_with:
        return f"{ref}: signals are read only in a step's 'with' or 'when'"
    if step.id not in waiters and not waiters & set(upstream):
        return (
            f"{ref}: step {step.id!r} must wait for signal {ref.name!r} or depend on a step "
            f"that does ({', '.join(sorted(waiters))})"
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
                problem = (
                    _trigger_problem(ref, profile)
                    or _signal_problem(ref, step, profile, upstream, in_with)
                    or _ref_problem(
                        ref,
                        step,
                        profile.params,
                        upstream,
                        in_with,
                        gated,
                        loop_steps,
                        own_output=".compensate." in field,
                    )
                )
                if problem is not None:
                    errors.append(_error("bad_reference", problem, field, step.id))
        for field, ref in _condition_refs(step, i):
            problem = (
                _trigger_problem(ref, profile)
                or _signal_problem(ref, step, profile, upstream, field.endswith(".when"))
                or _ref_problem(ref, step, profile.params, upstream, False, gated, loop_steps)
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
        *_wait_errors(profile),
        *_cycle_errors(profile, deps),
        *_trigger_errors(profile),
        *_dedupe_errors(profile),
        *_cache_errors(profile, known_actions),
        *_reference_errors(profile, deps),
        *secret_errors(profile),
        *_loop_errors(profile, deps),
        *_result_errors(profile),
        *_schedule_errors(profile),
    ]
    if errors:
        _raise_invalid(source, errors)
    return profile
