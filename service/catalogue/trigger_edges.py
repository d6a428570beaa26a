"""The dependency triggers of saved pipelines: recorded on save, refused when they would close a
cycle among the owner's pipelines, forgotten with the pipeline.

The check reads every edge of the owner and then writes one pipeline's; two saves at once, each
adding half of a circle, would both pass it. A transaction-level advisory lock per owner makes
them take turns: the second reads the first's edges once the first has committed.
"""

from collections.abc import Mapping

from sqlalchemy import delete, func, insert, select
from sqlalchemy.orm import Session

from service.language.profiles import Profile
from service.platform.constants import TRIGGERS_LOCK
from service.platform.errors import TriggerCycle
from service.platform.models import PipelineTriggerRow


def _cycle(edges: Mapping[str, set[str]], start: str) -> list[str] | None:
    """A path from ``start`` back to itself along upstream -> downstream edges, if any."""
    stack: list[tuple[str, list[str]]] = [(start, [start])]
    seen: set[str] = set()
    while stack:
        node, path = stack.pop()
        for nxt in edges.get(node, ()):
            if nxt == start:
                return [*path, start]
            if nxt not in seen:
                seen.add(nxt)
                stack.append((nxt, [*path, nxt]))
    return None


def record_triggers(session: Session, owner: str, profile: Profile) -> None:
    """Make ``profile``'s ``on`` the triggers of ``owner``'s pipeline of its name."""
    upstream = profile.on.upstream() if profile.on is not None else {}
    session.execute(
        select(func.pg_advisory_xact_lock(func.hashtextextended(f"{TRIGGERS_LOCK}:{owner}", 0)))
    )
    edges: dict[str, set[str]] = {}
    for up, down in session.execute(
        select(PipelineTriggerRow.upstream, PipelineTriggerRow.downstream).where(
            PipelineTriggerRow.owner == owner, PipelineTriggerRow.downstream != profile.name
        )
    ):
        edges.setdefault(up, set()).add(down)
    for up in upstream:
        edges.setdefault(up, set()).add(profile.name)
    loop = _cycle(edges, profile.name)
    if loop is not None:
        raise TriggerCycle(f"on would close a cycle: {' -> '.join(loop)}", {"cycle": loop})
    forget_triggers(session, owner, profile.name)
    if upstream:
        session.execute(
            insert(PipelineTriggerRow),
            [
                {"owner": owner, "upstream": up, "downstream": profile.name, "kind": kind}
                for up, kind in sorted(upstream.items())
            ],
        )


def forget_triggers(session: Session, owner: str, pipeline: str) -> None:
    session.execute(
        delete(PipelineTriggerRow).where(
            PipelineTriggerRow.owner == owner, PipelineTriggerRow.downstream == pipeline
        )
    )
