"""A job's labels: string keys and values that say whom or what it is for (``tenant: acme``),
given at submission and found again by the list's and the bulk actions' filter.

The limits keep a label a name, not a payload: at most ``LABELS_MAX`` of them, a key of
letters, digits and ``_ . - /`` up to ``LABEL_KEY_MAX_CHARS``, a value of printable text up
to ``LABEL_VALUE_MAX_CHARS``. A key never holds ``:`` or ``=``, so ``tenant:acme`` and
``tenant=acme`` always split at the first one."""

import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

from pydantic_core import PydanticCustomError

from service.language.expressions import CONCURRENCY_ROOTS, ExprContext, parse_refs, resolve
from service.platform.constants import LABEL_KEY_MAX_CHARS, LABEL_VALUE_MAX_CHARS, LABELS_MAX
from service.platform.errors import ExpressionError, JobFilterInvalid, LabelsInvalid

_KEY = re.compile(rf"[A-Za-z0-9][A-Za-z0-9_./-]{{0,{LABEL_KEY_MAX_CHARS - 1}}}")


def check_labels(labels: Mapping[str, Any]) -> dict[str, str]:
    """The labels as stored, or ``LabelsInvalid`` naming the first one that breaks a limit.
    A value must already be a string: ``study: 17`` in YAML is a number, and is refused rather
    than turned into ``"17"`` behind the writer's back."""
    if len(labels) > LABELS_MAX:
        raise LabelsInvalid(
            f"a job has at most {LABELS_MAX} labels, not {len(labels)}", {"max": LABELS_MAX}
        )
    for key, value in labels.items():
        if not isinstance(key, str) or not _KEY.fullmatch(key):
            raise LabelsInvalid(
                f"label key {key!r} must be 1-{LABEL_KEY_MAX_CHARS} letters, digits, _ . - or /,"
                " starting with a letter or digit",
                {"label": str(key)},
            )
        if not isinstance(value, str):
            raise LabelsInvalid(
                f"label {key!r} must be a string, not {type(value).__name__}; quote it",
                {"label": key},
            )
        if len(value) > LABEL_VALUE_MAX_CHARS or not value.isprintable():
            raise LabelsInvalid(
                f"label {key!r} must be printable text of at most {LABEL_VALUE_MAX_CHARS} chars",
                {"label": key},
            )
    return dict(labels)


def parse_labels(pairs: Iterable[str], *, separators: str = ":=") -> dict[str, str]:
    """``["tenant:acme", "study=17"]`` as ``{"tenant": "acme", "study": "17"}``: the form of a
    query's ``label=`` and of the command line's ``--label``."""
    found: dict[str, str] = {}
    for pair in pairs:
        cut = min((i for i in (pair.find(s) for s in separators) if i > 0), default=-1)
        if cut < 0:
            raise JobFilterInvalid(
                f"label {pair!r} is not key:value", {"param": "label", "value": pair}
            )
        found[pair[:cut]] = pair[cut + 1 :]
    return check_labels(found)


def label_templates(value: Any) -> Any:
    """A profile's or a schedule's ``labels``, as their validator: within the limits, and with
    values that read only ``params`` (``tenant: "${{ params.tenant }}"``), which every job of
    theirs has; refused with the error's code."""
    if not isinstance(value, Mapping):
        return value
    try:
        checked = check_labels(value)
        for text in checked.values():
            parse_refs(text, roots=CONCURRENCY_ROOTS)
    except (LabelsInvalid, ExpressionError) as exc:
        raise PydanticCustomError(exc.code, exc.message) from None
    return checked


def job_labels(
    templates: Mapping[str, str], params: Mapping[str, Any], given: Mapping[str, Any]
) -> dict[str, str]:
    """A new job's labels: its profile's, then those its submission gives (a schedule's, a
    request's), which win, each resolved from its params (a value that is not text as JSON:
    ``17``, ``true``)."""
    merged = check_labels({**templates, **given})
    try:
        resolved = resolve(merged, ExprContext(params=dict(params), outputs={}), CONCURRENCY_ROOTS)
    except ExpressionError as exc:
        raise LabelsInvalid(f"a label does not resolve: {exc.message}", exc.details) from None
    labels = {
        key: value if isinstance(value, str) else json.dumps(value)
        for key, value in resolved.items()
    }
    return check_labels(labels)
