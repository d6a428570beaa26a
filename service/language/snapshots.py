"""Job profile snapshots, parsed once per process, and facts about their steps.

A job runs the profile it was submitted with (stored on the job row); every worker needs it on
every step, so each content hash is parsed once per process.
"""

from typing import Any, NamedTuple

from service.language.expressions import parse_refs
from service.language.profiles import Profile
from service.platform.constants import PIPELINE_RUN_ACTION, WAIT_ACTION
from service.platform.models import JobRow

_PROFILE_CACHE: dict[str, Profile] = {}
_PROFILE_CACHE_SIZE = 256


def known_profile(profile_hash: str) -> Profile | None:
    """The snapshot of this content hash if this process has parsed it: the caller reads the
    stored profile only when it has not."""
    return _PROFILE_CACHE.get(profile_hash)


def parsed_profile(profile_hash: str, data: dict[str, Any]) -> Profile:
    if len(_PROFILE_CACHE) >= _PROFILE_CACHE_SIZE:
        _PROFILE_CACHE.clear()
    profile = _PROFILE_CACHE[profile_hash] = Profile.model_validate(data)
    return profile


def job_profile(job: JobRow) -> Profile:
    return known_profile(job.profile_hash) or parsed_profile(job.profile_hash, job.profile)


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
    """Its inputs, its ``when`` or its verify rules read ``trigger.job_id`` or
    ``trigger.result``."""
    reads_schedule: bool
    """Its inputs or its ``when`` read ``schedule.fire_time`` or
    ``schedule.previous_fire_time``."""
    reads_signals: frozenset[str]
    """Signals its inputs or its ``when`` read (``signals.<name>``), loaded only for it."""
    plain: bool
    """It starts from a one-statement claim with no transaction (``steps.ready_claim``): no
    fan-out, gate, wait, signal wait or ``when``, its inputs read no decision, loop, trigger,
    schedule or signal, and its verify rules no trigger."""
    follows: str | None
    """The child its worker may claim in its checkpoint and run next, without a message
    (``steps.Follow``): the first one of its queue whose only upstream it is and that needs no
    transaction to start."""
    secrets: frozenset[str]
    """Secrets its ``with`` names: revealed when its action is called, and masked after."""

    @property
    def sink(self) -> bool:
        return not self.children

    @property
    def shard_reads_in_transaction(self) -> bool:
        """A shard's inputs read a decision, a loop, a signal or the schedule, which only a
        transaction reads (``inputs.ready_shard``)."""
        return bool(self.decisions or self.reads_loop or self.reads_signals or self.reads_schedule)


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
        verify_refs = [ref for rule in spec.verify if rule.expr for ref in rule.condition.refs()]
        children = tuple(other.id for other in profile.steps if step_id in other.depends_on)
        decided = frozenset(ref.name for ref in refs if ref.root == "approval" and ref.name)
        reads_loop = any(ref.root == "loop" for ref in refs)
        reads_trigger = any(ref.root == "trigger" for ref in [*refs, *verify_refs])
        reads_schedule = any(ref.root == "schedule" for ref in refs)
        reads_signals = frozenset(ref.name for ref in refs if ref.root == "signals" and ref.name)
        gated = (
            spec.for_each is not None
            or spec.approval is not None
            or spec.when is not None
            or spec.concurrency is not None
            or spec.action in (WAIT_ACTION, PIPELINE_RUN_ACTION)
            or spec.wait_for is not None
        )
        facts = _FACTS[cache_key] = StepFacts(
            frozenset(ref.name for ref in refs if ref.root == "steps" and ref.name),
            children,
            decided,
            reads_loop,
            (loop := profile.loop_of(step_id)) is not None and profile.loop_last(loop) == step_id,
            reads_trigger,
            reads_schedule,
            reads_signals,
            not (
                gated or decided or reads_loop or reads_trigger or reads_schedule or reads_signals
            ),
            next((c for c in children if _may_follow(profile, step_id, c)), None),
            frozenset(ref.name for ref in refs if ref.root == "secrets" and ref.name),
        )
    return facts


def _may_follow(profile: Profile, step_id: str, child: str) -> bool:
    """A child of another queue is sent there: this worker may not be one of its pool."""
    return (
        profile.step(child).depends_on == [step_id]
        and profile.queue_of(child) == profile.queue_of(step_id)
        and step_facts(profile, child).plain
    )


def profile_secrets(profile: Profile) -> frozenset[str]:
    """Every secret a profile names, for the check at save and submit; a profile that names
    none is answered from the facts of its steps, parsed once per process."""
    return frozenset().union(*(step_facts(profile, step.id).secrets for step in profile.steps))


def referenced_steps(value: Any) -> set[str]:
    return {ref.name for ref in parse_refs(value) if ref.root == "steps" and ref.name}
