"""What a job waits for before any of it is sent: a slot of its concurrency key, or its turn.

Concurrency keys: at most ``limit`` open jobs of one pipeline share a key's value at once.

A job over its key's limit is stored queued and ``waiting_for`` a slot, and nothing of it is
sent, so it holds neither a worker nor a message; a job that waits is never claimed (the claim
statement skips jobs that wait, whoever sent their message). The statement that stores a keyed
job decides which: it is stored let in when its key has a slot free and no job of the key waits
ahead of it (``admitted``), the usual case, so it is written once and wakes nobody. A waiting
job is let in, the highest priority first and the oldest of those first (migration 0037), by
whoever finds a slot free: the beat leader when a keyed job ends or a waiting one is stored
(PostgreSQL wakes it through the schedules channel, see migration 0025), and the sweeper at
every pass. Each of them counts and lets in under a transaction-scoped advisory lock on the key,
held until its transaction commits, so two API processes or a beat and a sweeper never both
take the last slot. A slot is held while the job is open: a worker killed under it does not
end the job, which the sweeper sends again, so no slot leaks.

Fair share (``FLOWBEAT_FAIR_SHARE_AHEAD``): jobs submitted through the API wait their turn
while that many jobs of their queue (their first step's) are sent and not started; the beat
leader lets them in owner by owner as workers take the ones ahead, so each broker queue stays
short and no owner's backlog sits in it ahead of everyone else's, and a queue no worker takes
from holds back only its own jobs. An owner's turn goes to its most urgent waiting job, so
fair share costs no owner its priorities; a priority never takes another owner's turn, since
each owner sets its own jobs' priorities (docs/architecture/adr/0007).
"""

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import text
from sqlalchemy.orm import Session

from service.language.expressions import CONCURRENCY_ROOTS, ExprContext, resolve
from service.language.profiles import Profile
from service.platform.states import JobStatus

WAITING_FOR_SLOT = "concurrency"
WAITING_FOR_TURN = "turn"

_LET_IN = text("SELECT * FROM flowbeat_let_in(:key, :limit, :sent_at)")
"""One statement in a function of migration 0037: it takes the key's advisory lock, then
counts and lets in with a snapshot taken after the lock, so it is safe in autocommit too."""
SLOT_ROOM = "flowbeat_slot_room"
"""Migration 0036's function: under the key's advisory lock, and with a snapshot taken after
it, how many slots of the key are free to a new job: none while a job of the key waits."""
_TAKE_TURNS = text("SELECT * FROM flowbeat_take_turns(:ahead, :only, :sent_at)")
"""Migration 0037's function: under one advisory lock, as many jobs of each queue as ``ahead``
leaves room for beside those sent and not started, owner by owner, each owner's most urgent
first; among owners whose turn is the same, the most urgent first."""
_ANY_TURN = text(
    f"""SELECT 1 FROM jobs
         WHERE status = '{JobStatus.QUEUED}' AND waiting_for = '{WAITING_FOR_TURN}' LIMIT 1"""
)
_WAITING_KEYS = text(
    f"""
    SELECT DISTINCT ON (concurrency_key) concurrency_key, concurrency_limit FROM jobs
     WHERE waiting_for = '{WAITING_FOR_SLOT}' AND status = '{JobStatus.QUEUED}'
     ORDER BY concurrency_key, created_at DESC
    """
)


def job_key(profile: Profile, owner: str, params: dict[str, Any]) -> str | None:
    """The key a job of ``profile`` holds a slot under: its resolved value, scoped to the
    owner's pipeline so that two pipelines (or owners) with the same value do not share."""
    spec = profile.concurrency
    if spec is None:
        return None
    value = resolve(spec.key, ExprContext(params=params, outputs={}), CONCURRENCY_ROOTS)
    return f"{owner}/{profile.name}/{value}"


def let_in(session: Session, key: str, limit: int, *, sent_at: datetime) -> list[uuid.UUID]:
    """Let in the jobs waiting on ``key``, by priority then age, while slots are free,
    recorded as sent at ``sent_at``; their ids, to send once the caller has committed. The
    limit is the newest waiting job's: a pipeline saved with a new limit applies it from its
    next job on."""
    rows = session.execute(_LET_IN, {"key": key, "limit": limit, "sent_at": sent_at})
    return [row[0] for row in rows]


def take_turns(
    session: Session, ahead: int, *, sent_at: datetime | None, only: uuid.UUID | None = None
) -> list[uuid.UUID]:
    """Fair share: let in jobs waiting their turn while fewer than ``ahead`` jobs are sent and
    not started, round-robin by owner, so one owner's burst delays another's job by a turn,
    not by the burst, and an owner's urgent job passes that owner's own backlog. With ``only``,
    that job if its turn has come; the ids, to send."""
    rows = session.execute(_TAKE_TURNS, {"ahead": ahead, "only": only, "sent_at": sent_at})
    return [row[0] for row in rows]


def waiting_turns(session: Session) -> bool:
    return session.execute(_ANY_TURN).first() is not None


def slot_values(profile: Profile, owner: str, params: dict[str, Any]) -> dict[str, Any]:
    """A new job's columns for its key: one with a key asks for a slot, and the statement
    that stores it stores it let in or waiting and unsent (``admitted``)."""
    key = job_key(profile, owner, params)
    if key is None or profile.concurrency is None:
        return {"concurrency_key": None, "concurrency_limit": None, "waiting_for": None}
    return {
        "concurrency_key": key,
        "concurrency_limit": profile.concurrency.limit,
        "waiting_for": WAITING_FOR_SLOT,
    }


def admitted(let: str, waiting_for: str, dispatched_at: str) -> dict[str, str]:
    """The SQL of a new job's ``waiting_for`` and ``dispatched_at`` as stored, from those it
    asked for and ``let``, whether a slot of its key is its (NULL: it has no key): one let in
    no longer waits, one left waiting is not sent."""
    return {
        "waiting_for": f"CASE WHEN {let} THEN NULL ELSE {waiting_for} END",
        "dispatched_at": f"CASE WHEN {let} IS false THEN NULL ELSE {dispatched_at} END",
    }


def let_in_all(session: Session, now: datetime) -> list[uuid.UUID]:
    """``let_in`` for every key that has a job waiting, to be sent at once."""
    keys = list(session.execute(_WAITING_KEYS))
    return [job for key, limit in keys for job in let_in(session, key, limit, sent_at=now)]
