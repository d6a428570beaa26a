"""Where a profile may name a secret (``${{ secrets.NAME }}``): in a step's ``with``, outside
a wait step, and never in the scheme or host of a URL.

A host is looked up in DNS before the egress policy can refuse the connection, so a secret
built into one (``https://${{ secrets.X }}.example.com``) would leave in the lookup. Inputs
named ``url`` or ``*_url``, at any depth of ``with``, must reach the end of the host in literal
text (``/``, ``?`` or ``#`` after ``://``) before their first secret; a secret in the path,
the query or a header goes only to a host the profile spells out or the egress policy allows.
"""

import re
from collections.abc import Iterator
from typing import Any

from service.language.expressions import Ref, parse_refs, split_refs
from service.language.profiles import Profile
from service.language.specs import ErrorEntry
from service.platform.constants import PIPELINE_RUN_ACTION, WAIT_ACTION
from service.platform.errors import ExpressionError

_URL_KEY = re.compile(r"url|.+_url")


def secret_in_host(text: str) -> Ref | None:
    """The first secret that could land in the URL's scheme or authority, if one could."""
    before = ""
    for part in split_refs(text):
        if not isinstance(part, Ref):
            before += part
        elif part.root != "secrets":
            before += "\0"
        else:
            scheme_end = before.find("://")
            closed = scheme_end >= 0 and any(c in before[scheme_end + 3 :] for c in "/?#")
            return None if closed else part
    return None


def _urls(value: Any, field: str) -> Iterator[tuple[str, str]]:
    if isinstance(value, dict):
        for key, item in value.items():
            if isinstance(item, str) and _URL_KEY.fullmatch(str(key)):
                yield f"{field}.{key}", item
            else:
                yield from _urls(item, f"{field}.{key}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _urls(item, f"{field}[{i}]")


def secret_errors(profile: Profile) -> list[ErrorEntry]:
    """Secrets in URL hosts and in wait steps; ``checks`` refuses them outside a ``with``."""
    errors: list[ErrorEntry] = []
    for i, step in enumerate(profile.steps):
        for field, text in _urls(step.with_, f"steps[{i}].with"):
            try:
                ref = secret_in_host(text)
            except ExpressionError:
                continue
            if ref is not None:
                message = (
                    f"{ref} may not be part of a URL's scheme or host, where a name lookup "
                    "would send it out; put it in the path, the query or a header"
                )
                errors.append(_entry("secret_in_url_host", message, field, step.id))
        engine_own = {WAIT_ACTION: "a wait step", PIPELINE_RUN_ACTION: "a pipeline.run step"}
        if step.action in engine_own and any(r.root == "secrets" for r in _refs(step.with_)):
            message = f"{engine_own[step.action]} reads no secret: no action runs to reveal it"
            errors.append(_entry("bad_reference", message, f"steps[{i}].with", step.id))
    return errors


def _refs(value: Any) -> list[Ref]:
    try:
        return parse_refs(value)
    except ExpressionError:
        return []


def _entry(code: str, message: str, field: str, step: str) -> ErrorEntry:
    return {"step": step, "field": field, "code": code, "message": message}
