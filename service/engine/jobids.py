"""Job ids as people type them: a whole id, or a unique prefix of at least 8 hex digits, as
the dashboard shows them (``1f0c9a2b``), found among the jobs of an owner or of everyone.

A prefix is a range of ids (the prefix padded with ``0`` and with ``f``), so the lookup walks
the primary key's index, not the table. A prefix that begins no job but a pruned job's id
names that job, so the command then says it expired, as it does for the whole id.
"""

import re
import uuid

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.platform.errors import JobIdAmbiguous, JobIdInvalid, JobNotFound
from service.platform.models import JobRow, PrunedJobRow

MIN_PREFIX = 8
SHOWN = 5
"""How many of the jobs an ambiguous prefix begins the refusal names."""
_HEX = re.compile(r"[0-9a-f]+")


def resolve_job_id(session: Session, given: str, *, owner: str | None) -> uuid.UUID:
    """The id ``given`` names: a whole id as it is (the caller reports a job it cannot find),
    else the one job of ``owner`` (``None``: of anyone) whose id begins with it."""
    digits = given.strip().lower().replace("-", "")
    if len(digits) < MIN_PREFIX or len(digits) > 32 or not _HEX.fullmatch(digits):
        raise JobIdInvalid(
            f"{given!r} is not a job id: give the whole id or at least its first "
            f"{MIN_PREFIX} hex digits",
            {"job_id": given},
        )
    if len(digits) == 32:
        return uuid.UUID(digits)
    low, high = uuid.UUID(digits.ljust(32, "0")), uuid.UUID(digits.ljust(32, "f"))
    for id_column, owner_column in (
        (JobRow.id, JobRow.owner),
        (PrunedJobRow.job_id, PrunedJobRow.owner),
    ):
        query = select(id_column).where(id_column.between(low, high)).order_by(id_column)
        if owner is not None:
            query = query.where(owner_column == owner)
        found = list(session.scalars(query.limit(SHOWN + 1)))
        if len(found) > 1:
            shown = [str(job_id) for job_id in found[:SHOWN]]
            more = " and more" if len(found) > SHOWN else ""
            raise JobIdAmbiguous(
                f"{given!r} begins more than one job id ({', '.join(shown)}{more}): "
                "give more of the id",
                {"job_id": given, "matches": shown},
            )
        if found:
            return found[0]
    raise JobNotFound(f"no job id begins with {given!r}", {"job_id": given})
