"""The names a mistyped action most likely meant, so a refusal of an unknown action (at save,
or asked of the catalogue) names them rather than sending the writer to the source."""

import difflib
from collections.abc import Collection, Iterable

from service.platform.constants import PIPELINE_RUN_ACTION, WAIT_ACTION

CLOSEST = 3
CLOSE_ENOUGH = 0.6
"""difflib's ratio a name must reach: ``pubmed.serach`` meets ``pubmed.search`` (0.92),
``noop`` is nothing like ``http.request``."""


def closest_actions(name: str, known: Collection[str]) -> list[str]:
    """Best first; the engine's own ``wait`` and ``pipeline.run`` count as known."""
    candidates = sorted({*known, WAIT_ACTION, PIPELINE_RUN_ACTION})
    return difflib.get_close_matches(name, candidates, n=CLOSEST, cutoff=CLOSE_ENOUGH)


def did_you_mean(closest: list[str]) -> str:
    """What a refusal adds to its message: the names, or nothing when none is close."""
    return f"; did you mean {', '.join(repr(n) for n in closest)}?" if closest else ""


class ActionNames(frozenset[str]):
    """The registered actions' names, with those whose registration refuses the step cache
    (``cache=False``), which a step that declares ``cache`` may not name."""

    uncacheable: frozenset[str]

    def __new__(cls, names: Iterable[str], uncacheable: Iterable[str] = ()) -> "ActionNames":
        made = super().__new__(cls, names)
        made.uncacheable = frozenset(uncacheable)
        return made


def action_names(known: Collection[str]) -> ActionNames:
    """``known`` as ``ActionNames``, keeping what it says of the cache when it says it."""
    if isinstance(known, ActionNames):
        return known
    return ActionNames(known)
