"""The profiles jobs run, stored once by their content hash in ``job_profiles`` (ADR 22).

A statement that stores jobs also stores the profiles they name that are not there yet
(``keep_profiles``); retention deletes a profile once no job names it (``prune_profiles``).
Both take ``PROFILES_LOCK_ID``: each storing statement shares it from its look for the profile
to its commit, and the pruner holds it alone, so a profile is never deleted between a job
finding it stored and that job's commit. No foreign key from ``jobs``: its check would lock the
profile's row at every job's insert, one row that every job of a pipeline shares.
"""

from datetime import datetime, timedelta
from typing import Any, LiteralString

import psycopg
from sqlalchemy import text
from sqlalchemy.orm import Session

from service.platform.constants import PROFILES_LOCK_ID

UNNAMED_KEPT_S = 86_400.0
"""How long a profile no job names is kept: a job stored meanwhile finds it still there."""


def keep_profiles(rows: str) -> str:
    """The CTE ``kept_profiles`` that stores the (hash, profile) rows the query ``rows`` yields
    unless stored already, which writes nothing."""
    return f"""kept_profiles AS (
        INSERT INTO job_profiles (hash, profile)
        SELECT p.* FROM ({rows}) AS p, (SELECT pg_advisory_xact_lock_shared({PROFILES_LOCK_ID}))
            AS shared
        ON CONFLICT DO NOTHING
    )"""


_PROFILE: LiteralString = "SELECT profile FROM job_profiles WHERE hash = %s"


def stored_profile(conn: psycopg.Connection[Any], profile_hash: str) -> dict[str, Any] | None:
    row = conn.execute(_PROFILE, (profile_hash,)).fetchone()
    return None if row is None else dict(row[0])


_PRUNE = text(
    """
    DELETE FROM job_profiles AS p
     WHERE p.created_at < :cutoff
       AND NOT EXISTS (SELECT 1 FROM jobs
                        WHERE jobs.pipeline = p.profile ->> 'name' AND jobs.profile_hash = p.hash)
    RETURNING p.hash
    """
)


def prune_profiles(session: Session, now: datetime) -> int:
    """Delete the profiles no job has named for a day, under the lock no storing statement
    holds meanwhile. A job's pipeline is its profile's name, so each profile is looked for
    among its pipeline's jobs (``ix_jobs_pipeline_created_at``), not among every job."""
    session.execute(text("SELECT pg_advisory_xact_lock(:id)"), {"id": PROFILES_LOCK_ID})
    cutoff = now - timedelta(seconds=UNNAMED_KEPT_S)
    return len(session.scalars(_PRUNE, {"cutoff": cutoff}).all())
