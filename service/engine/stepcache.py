"""The step cache (ADR 17): a step that declares ``cache`` looks for an output of the same
owner's step whose action ran with the same key within its TTL, and takes it instead of
running; one that ran its action leaves its output as an entry for the next.

The key is the action's name and version with the step's resolved inputs, a secret given by
its name, never its value. A step that declares no cache costs no statement here: the runner
asks ``probe`` first, and it answers ``None`` without touching the database. For one that
declares it, ``probe`` is one statement, and what the cache said (``Probe.write``) rides on
the step's own checkpoint statement (``checkpoints.complete_step``), which writes the entry,
or settles the step ``cached`` with the source's output and names the source: a hit costs
what a run of the step costs, less its action, and keeps the chain in its message.
"""

import hashlib
import json
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from service.engine.runtime import Runtime
from service.engine.steps import CacheWrite, Claimed
from service.language.expressions import reveal


@dataclass(frozen=True)
class Source:
    """The step, of an earlier job, whose output a cached step takes."""

    job_id: uuid.UUID
    step_id: str
    shard: int
    output: Any


@dataclass(frozen=True)
class Probe:
    """What the cache said before the action ran: the step's owner and key, and the entry
    to take, if any."""

    owner: str
    key: str
    source: Source | None

    def write(self) -> CacheWrite:
        """What the step's checkpoint writes to the cache: a use of the source, else an entry."""
        source = self.source
        used = None if source is None else (source.job_id, source.step_id, source.shard)
        return CacheWrite(self.owner, self.key, used)


def cache_key(action: str, version: str, inputs: dict[str, Any], nonce: str | None) -> str:
    """The key of a call: a secret's mark (``expressions.secret_mark``) stands as its name."""
    named = inputs if nonce is None else reveal(inputs, nonce, lambda name: f"secrets.{name}")
    canonical = json.dumps(
        [action, version, named], sort_keys=True, separators=(",", ":"), ensure_ascii=False
    )
    return hashlib.sha256(canonical.encode()).hexdigest()


_LOOKUP = """
    SELECT j.owner, c.job_id, c.step_id, c.shard, k.job_id IS NOT NULL, k.output
      FROM jobs AS j
      LEFT JOIN LATERAL (
          SELECT e.job_id, e.step_id, e.shard
            FROM step_cache AS e
           WHERE e.owner = j.owner AND e.cache_key = %(key)s AND e.source_job_id IS NULL
             AND e.created_at > %(since)s AND NOT j.refresh
           ORDER BY e.created_at DESC
           LIMIT 1) AS c ON true
      LEFT JOIN step_runs AS k
        ON k.job_id = c.job_id AND k.step_id = c.step_id AND k.shard = c.shard
       AND k.output IS NOT NULL
     WHERE j.id = %(job_id)s"""
"""The job's owner, and the owner's newest entry of the key within the TTL with its output,
unless the job was submitted with ``refresh``; in one statement."""


def probe(rt: Runtime, claim: Claimed, now: datetime) -> Probe | None:
    """``None`` for a step that declares no cache, or whose action refuses it, at no cost."""
    spec = claim.profile.step(claim.key.step_id).cache
    if spec is None:
        return None
    registration = rt.registry.registration(claim.action)
    if not registration.cache:
        return None
    key = cache_key(claim.action, registration.cache_version(), claim.inputs, claim.secret_nonce)
    values = {
        "key": key,
        "since": now - timedelta(seconds=spec.ttl_s),
        "job_id": claim.key.job_id,
    }
    with rt.claims.connect() as conn:
        row = conn.execute(_LOOKUP, values).fetchone()
    assert row is not None
    owner, job_id, step_id, shard, found, output = row
    source = Source(job_id, step_id, shard, output) if found else None
    return Probe(str(owner), key, source)
