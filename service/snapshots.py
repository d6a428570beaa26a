"""Job profile snapshots, parsed once per process, and facts about their steps.

A job runs the profile it was submitted with (stored on the job row); every worker needs it on
every step, so each content hash is parsed once per process.
"""

from collections.abc import Callable
from typing import Any, NamedTuple

from service.expressions import parse_refs
from service.models import JobRow
from service.profiles import Profile

_PROFILE_CACHE: dict[str, Profile] = {}
_PROFILE_CACHE_SIZE = 256


def cached_profile(profile_hash: str, load: Callable[[], dict[str, Any]]) -> Profile:
    """A job's profile snapshot, parsed once per process for each content hash."""
    profile = _PROFILE_CACHE.get(profile_hash)
    if profile is None:
        if len(_PROFILE_CACHE) >= _PROFILE_CACHE_SIZE:
            _PROFILE_CACHE.clear()
        profile = _PROFILE_CACHE[profile_hash] = Profile.model_validate(load())
    return profile


def job_profile(job: JobRow) -> Profile:
    return cached_profile(job.profile_hash, lambda: job.profile)


class StepFacts(NamedTuple):
    referenced: frozenset[str]
    """Steps whose outputs the step's inputs or its ``when`` reference."""
    children: tuple[str, ...]
    """Steps that depend on it, in profile order."""
    decisions: frozenset[str]
    """Gated steps whose decision its inputs or its ``when`` read."""
    reads_loop: bool
    """Its inputs read ``loop.round`` or ``loop.previous``."""
    ends_round: bool
    """It is the last step of a loop: its checkpoint closes a round."""
    reads_trigger: bool
    """Its inputs or its ``when`` read ``trigger.job_id`` or ``trigger.result``."""

    @property
    def sink(self) -> bool:
        return not self.children


_FACTS: dict[tuple[str, str], StepFacts] = {}


def step_facts(profile: Profile, step_id: str) -> StepFacts:
    """What the engine asks of a step on every attempt, derived once per profile and step."""
    cache_key = (profile.content_hash(), step_id)
    facts = _FACTS.get(cache_key)
    if facts is None:
        if len(_FACTS) >= _PROFILE_CACHE_SIZE * 16:
            _FACTS.clear()
        spec = profile.step(step_id)
        refs = parse_refs(spec.with_) + (spec.condition.refs() if spec.condition else [])
        facts = _FACTS[cache_key] = StepFacts(
            frozenset(ref.name for ref in refs if ref.root == "steps" and ref.name),
            tuple(other.id for other in profile.steps if step_id in other.depends_on),
            frozenset(ref.name for ref in refs if ref.root == "approval" and ref.name),
            any(ref.root == "loop" for ref in refs),
            (loop := profile.loop_of(step_id)) is not None and profile.loop_last(loop) == step_id,
            any(ref.root == "trigger" for ref in refs),
        )
    return facts


def referenced_steps(value: Any) -> set[str]:
    return {ref.name for ref in parse_refs(value) if ref.root == "steps" and ref.name}
