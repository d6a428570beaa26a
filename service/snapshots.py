"""Job profile snapshots, parsed once per process, and facts about their steps.

A job runs the profile it was submitted with (stored on the job row); every worker needs it on
every step, so each content hash is parsed once per process.
"""

from collections.abc import Callable
from typing import Any

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


_FACTS: dict[tuple[str, str], tuple[frozenset[str], bool]] = {}


def step_facts(profile: Profile, step_id: str) -> tuple[frozenset[str], bool]:
    """Steps a step's inputs reference, and whether it is a sink (nothing depends on it)."""
    cache_key = (profile.content_hash(), step_id)
    facts = _FACTS.get(cache_key)
    if facts is None:
        if len(_FACTS) >= _PROFILE_CACHE_SIZE * 16:
            _FACTS.clear()
        referenced = frozenset(referenced_steps(profile.step(step_id).with_))
        sink = not any(step_id in other.depends_on for other in profile.steps)
        facts = _FACTS[cache_key] = (referenced, sink)
    return facts


def referenced_steps(value: Any) -> set[str]:
    return {ref.name for ref in parse_refs(value) if ref.root == "steps" and ref.name}
