"""The ``pipeline.run`` calls between an owner's pipelines: a save that would let a pipeline
start itself through the pipelines it calls is refused (``pipeline_cycle``).

The check follows the names the calls write out, through the owner's saved pipelines (and
those shared with it) and the shipped ones, as a job would resolve them; a name that resolves
to nothing yet is left for the run to refuse, and a name a reference makes is held by the
depth cap at run time (``FLOWBEAT_MAX_PIPELINE_DEPTH``). It runs after
``trigger_edges.record_triggers``, under the owner's advisory lock that it takes, so two saves
that would each close half of a circle take turns.
"""

from collections.abc import Collection
from pathlib import Path

from sqlalchemy.orm import Session

from service.catalogue.resolution import resolve_pipeline
from service.language.profiles import Profile
from service.language.subpipes import called_pipelines
from service.platform.errors import FlowbeatError, PipelineCycle


def check_calls(
    session: Session,
    owner: str,
    profile: Profile,
    *,
    profiles_dir: Path | None,
    known_actions: Collection[str],
) -> None:
    """Refuse ``profile`` if a chain of its calls leads back to its own name."""
    stack = [(name, [profile.name, name]) for name in sorted(called_pipelines(profile))]
    seen: set[str] = set()
    while stack:
        name, path = stack.pop()
        if name == profile.name:
            raise PipelineCycle(
                f"pipeline.run would start {profile.name!r} again: {' -> '.join(path)}",
                {"cycle": path},
            )
        if name in seen:
            continue
        seen.add(name)
        try:
            called = resolve_pipeline(
                session, name, owner=owner, profiles_dir=profiles_dir, known_actions=known_actions
            ).profile
        except FlowbeatError:
            continue
        stack.extend((nxt, [*path, nxt]) for nxt in sorted(called_pipelines(called)))
