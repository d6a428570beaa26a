"""Dedupe windows: a profile's ``dedupe`` key, resolved from a new job's params, names the jobs
it would repeat; while one of the owner's jobs of the pipeline with that key is open, or ended
less than ``window_s`` ago, a new one is not stored and its submission is answered with that
job (``return``) or refused ``duplicate_job`` naming it (``reject``).

PostgreSQL decides (migration 0044): ``flowbeat_dedupe_twin`` takes an advisory lock on
(owner, pipeline, key) and looks with a snapshot taken after it, and the statement that asks it
stores the job only when it finds none, holding the lock until it commits. Two API processes
racing with one key therefore store one job, and the other finds it. A submission asks once
more before its other checks (``find_twin``), so a duplicate is answered even at the owner's
open-jobs limit, as a replayed idempotency key is: it starts nothing.
"""

import hashlib
import json
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import text
from sqlalchemy.orm import Session

from service.language.expressions import CONCURRENCY_ROOTS, ExprContext, resolve
from service.language.profiles import Profile
from service.language.specs import DedupeSpec
from service.platform.constants import DEDUPE_KEY_MAX_CHARS
from service.platform.errors import DuplicateJob
from service.platform.models import JobRow

DEDUPE_TWIN = "flowbeat_dedupe_twin"
"""Migration 0044's function: under the key's advisory lock, and with a snapshot taken after
it, the key's open job, else its job that ended since the given time, else null."""
_TWIN = text(f"SELECT {DEDUPE_TWIN}(:owner, :pipeline, :key, :since)")


@dataclass(frozen=True)
class Dedupe:
    """A new job's check: its owner, pipeline and key, and from when an ended job counts."""

    owner: str
    pipeline: str
    key: str
    since: datetime
    spec: DedupeSpec


def dedupe_key(profile: Profile, params: dict[str, Any]) -> str | None:
    """The profile's dedupe key for these params: text as it resolves, any other value as its
    canonical JSON, and a value too long for the key's index as its SHA-256."""
    spec = profile.dedupe
    if spec is None:
        return None
    value = resolve(spec.key, ExprContext(params=params, outputs={}), CONCURRENCY_ROOTS)
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
    if len(text) <= DEDUPE_KEY_MAX_CHARS:
        return text
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def dedupe_of(profile: Profile, job: dict[str, Any]) -> Dedupe | None:
    """The check a new job's values (``submission.job_values``) call for, if any."""
    spec = profile.dedupe
    if spec is None or job["dedupe_key"] is None:
        return None
    since = job["created_at"] - timedelta(seconds=spec.window_s)
    return Dedupe(job["owner"], job["pipeline"], job["dedupe_key"], since, spec)


def find_twin(session: Session, dedupe: Dedupe) -> uuid.UUID | None:
    """The job a new one would duplicate, asked of ``DEDUPE_TWIN``; with none, the statement
    that stores the new job asks again, holding the lock until it commits."""
    values = {
        "owner": dedupe.owner,
        "pipeline": dedupe.pipeline,
        "key": dedupe.key,
        "since": dedupe.since,
    }
    twin: uuid.UUID | None = session.scalar(_TWIN, values)
    return twin


def duplicate_of(session: Session, twin_id: uuid.UUID, dedupe: Dedupe) -> JobRow:
    """The job that answers a duplicate submission, or ``DuplicateJob`` naming it when the
    profile says ``reject``."""
    twin = session.get(JobRow, twin_id)
    if twin is None:
        raise DuplicateJob(
            f"job {twin_id} has the same dedupe key {dedupe.key!r}", {"job_id": str(twin_id)}
        )
    if dedupe.spec.on_duplicate == "return":
        return twin
    state = (
        f"ended {twin.status} at {twin.finished_at.isoformat()}, within the window of "
        f"{dedupe.spec.window_s} s"
        if twin.finished_at is not None
        else f"is {twin.status}"
    )
    raise DuplicateJob(
        f"job {twin.id} of {twin.pipeline} has the same dedupe key {dedupe.key!r} and {state}",
        {
            "job_id": str(twin.id),
            "pipeline": twin.pipeline,
            "dedupe_key": dedupe.key,
            "status": twin.status,
            "finished_at": None if twin.finished_at is None else twin.finished_at.isoformat(),
            "window_s": dedupe.spec.window_s,
        },
    )
