"""A step's ``verify`` rules, checked on the output of each attempt before it counts as success.

An action that returns is done, not necessarily right: a search that quietly found nothing, or
an answer missing a field, would otherwise be checkpointed and fed downstream. Checking here,
inside the attempt, lets a failed rule take the retry path of any other failure. For a
for_each step each shard is an attempt, so the rules apply to each item's output, not to the
list the fan-out gathers.

Pure: the runner passes the output, the job's params and, in a job another's success started,
what ``trigger.*`` reads, and gets back what failed, if anything.
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from jsonschema.exceptions import best_match
from jsonschema.validators import validator_for
from referencing import Registry
from referencing.exceptions import Unresolvable

from service.language.conditions import evaluate
from service.language.expressions import ExprContext, walk_path
from service.language.specs import ItemCount, VerifyRule, dotted_path
from service.platform.errors import ExpressionError

NO_FETCH: Registry[Any] = Registry()
"""Schemas resolve ``$ref`` only within themselves: jsonschema's default registry would fetch a
remote ``$ref`` over HTTP from the worker, on a URL a profile chose."""


@dataclass(frozen=True)
class Unverified:
    """The first rule the output failed; ``retry`` is the rule's own say on another attempt."""

    message: str
    details: dict[str, Any]
    retry: bool


@dataclass(frozen=True)
class _Problem:
    reason: str
    path: str | None


def check(
    rules: Sequence[VerifyRule],
    output: Any,
    params: Mapping[str, Any],
    trigger: Mapping[str, Any] | None = None,
) -> Unverified | None:
    """The first failed rule in ``rules`` order, or ``None`` when the output passes them all."""
    if not rules:
        return None
    context = ExprContext(params=params, outputs={}, output=output, trigger=trigger or {})
    for index, rule in enumerate(rules):
        problem = _problem(rule, output, context)
        if problem is not None:
            kind = rule.kind
            message = rule.message or f"verify rule {index} ({kind}) failed: {problem.reason}"
            details = {"rule": kind, "index": index, "path": problem.path, "reason": problem.reason}
            return Unverified(message, details, rule.retry)
    return None


def _problem(rule: VerifyRule, output: Any, context: ExprContext) -> _Problem | None:
    if rule.not_empty is not None:
        return _not_empty(output, rule.not_empty)
    if rule.min_items is not None:
        return _count(output, rule.min_items, at_least=True)
    if rule.max_items is not None:
        return _count(output, rule.max_items, at_least=False)
    if rule.json_schema is not None:
        return _json_schema(output, rule.json_schema)
    try:
        if evaluate(rule.condition, context):
            return None
    except ExpressionError as exc:
        return _Problem(exc.message, None)
    return _Problem(f"{rule.expr} is false", None)


def _where(path: str) -> str:
    return f"output.{path}" if path else "the output"


def _at(output: Any, path: str) -> tuple[Any, _Problem | None]:
    try:
        return walk_path(output, dotted_path(path)), None
    except LookupError as exc:
        return None, _Problem(f"{_where(path)} is missing: {exc}", path)


def _not_empty(output: Any, path: str) -> _Problem | None:
    """Empty is missing, null, "", [] or {}; ``0`` and ``false`` are values, so not empty."""
    value, missing = _at(output, path)
    if missing is not None:
        return missing
    if value is None or (isinstance(value, str | list | tuple | Mapping) and len(value) == 0):
        return _Problem(f"{_where(path)} is empty", path)
    return None


def _count(output: Any, bound: ItemCount, *, at_least: bool) -> _Problem | None:
    value, missing = _at(output, bound.path)
    if missing is not None:
        return missing
    where = _where(bound.path)
    if not isinstance(value, list | tuple):
        kind = "null" if value is None else type(value).__name__
        return _Problem(f"{where} is a {kind}, not a list", bound.path)
    if at_least and len(value) < bound.count:
        return _Problem(f"{where} has {len(value)} items, at least {bound.count}", bound.path)
    if not at_least and len(value) > bound.count:
        return _Problem(f"{where} has {len(value)} items, at most {bound.count}", bound.path)
    return None


def _json_schema(output: Any, schema: dict[str, Any]) -> _Problem | None:
    validator = validator_for(schema)(schema, registry=NO_FETCH)
    try:
        error = best_match(validator.iter_errors(output))
    except Unresolvable as exc:
        return _Problem(f"the schema's $ref does not resolve: {exc}", None)
    if error is None:
        return None
    path = "".join(f"[{seg}]" if isinstance(seg, int) else f".{seg}" for seg in error.absolute_path)
    return _Problem(error.message, path.removeprefix("."))
