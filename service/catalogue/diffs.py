"""Result items of a run and the diff against the previous successful run, both in PostgreSQL.

Items are stored as rows keyed by their key field, so a diff of two runs is a pair of
anti-joins on the primary key, however many items each run has; nothing loads both sides
into Python.
"""

import base64
import uuid
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from sqlalchemy import text
from sqlalchemy.orm import Session

from service.language.specs import ResultSpec
from service.platform.errors import InvalidCursor, NoResultItems
from service.platform.models import JobRow
from service.platform.states import JobStatus


class DiffKind(StrEnum):
    NEW = "new"
    REMOVED = "removed"
    UNCHANGED = "unchanged"


@dataclass(frozen=True)
class DiffCounts:
    new: int
    removed: int
    unchanged: int

    def as_dict(self) -> dict[str, int]:
        return {"new": self.new, "removed": self.removed, "unchanged": self.unchanged}


@dataclass(frozen=True)
class DiffPage:
    items: list[dict[str, Any]]
    next_cursor: str | None


def key_problem(items: Any, spec: ResultSpec) -> dict[str, Any] | None:
    """Why these items cannot be stored as result rows, as a job error; ``None`` if they can.

    Every item must be an object with a non-null key field. Duplicate keys are allowed and
    the first item with a key wins, as a search that lists a paper twice still found it once.
    """
    if not isinstance(items, list):
        return {
            "code": "result_not_a_list",
            "message": f"result items of step {spec.step!r} at {spec.items!r} are not a list",
            "details": {"step": spec.step, "items": spec.items},
        }
    for index, item in enumerate(items):
        if not isinstance(item, dict) or item.get(spec.key) is None:
            return {
                "code": "result_key_missing",
                "message": f"result item {index} has no key field {spec.key!r}",
                "details": {"step": spec.step, "key": spec.key, "index": index},
            }
    return None


_STORE_ITEMS = text(
    """
    INSERT INTO result_items (job_id, item_key, item)
    SELECT DISTINCT ON (e.value ->> :key) :job_id, e.value ->> :key, e.value
      FROM step_runs AS k,
           jsonb_array_elements(k.output #> CAST(:path AS text[])) WITH ORDINALITY AS e
     WHERE k.job_id = :job_id AND k.step_id = :step_id AND k.shard = -1
     ORDER BY e.value ->> :key, e.ordinality
    ON CONFLICT DO NOTHING
    """
)

_PREVIOUS = text(
    f"""
    SELECT id FROM jobs
     WHERE owner = :owner AND pipeline = :pipeline AND status = '{JobStatus.SUCCEEDED}'
       AND item_count IS NOT NULL AND id <> :job_id
       AND (created_at, id) < (:created_at, :job_id)
     ORDER BY created_at DESC, id DESC
     LIMIT 1
    """
)

_COUNTS = text(
    """
    SELECT (SELECT count(*) FROM result_items WHERE job_id = :job_id) AS total,
           (SELECT count(*) FROM result_items AS c
             WHERE c.job_id = :job_id
               AND NOT EXISTS (SELECT 1 FROM result_items AS p
                                WHERE p.job_id = :previous AND p.item_key = c.item_key)) AS new,
           (SELECT count(*) FROM result_items AS p
             WHERE p.job_id = :previous
               AND NOT EXISTS (SELECT 1 FROM result_items AS c
                                WHERE c.job_id = :job_id AND c.item_key = p.item_key)) AS removed
    """
)


def store_result_items(session: Session, job: JobRow, spec: ResultSpec) -> DiffCounts:
    """Write the result step's items as rows and count them against the previous run.

    Runs in the transaction that marks the job succeeded, so a succeeded job with a result
    block always has its items and counts, and a failed one has none.
    """
    path = [part for part in spec.items.split(".") if part]
    session.execute(
        _STORE_ITEMS, {"job_id": job.id, "step_id": spec.step, "key": spec.key, "path": path}
    )
    previous = session.execute(
        _PREVIOUS,
        {
            "owner": job.owner,
            "pipeline": job.pipeline,
            "job_id": job.id,
            "created_at": job.created_at,
        },
    ).scalar()
    total, counts = count_against(session, job.id, previous)
    job.previous_job_id = previous
    job.item_count, job.new_count, job.removed_count = total, counts.new, counts.removed
    return counts


def _require_items(job: JobRow) -> None:
    if job.status != JobStatus.SUCCEEDED or job.item_count is None:
        raise NoResultItems(
            f"job {job.id} has no stored result items to compare",
            {"job_id": str(job.id), "status": job.status},
        )


def count_against(
    session: Session, job_id: uuid.UUID, previous: uuid.UUID | None
) -> tuple[int, DiffCounts]:
    """The number of items of a run, and its diff counts against ``previous``, in one query."""
    row = session.execute(_COUNTS, {"job_id": job_id, "previous": previous}).one()
    return row.total, DiffCounts(new=row.new, removed=row.removed, unchanged=row.total - row.new)


def diff_counts(session: Session, job: JobRow) -> DiffCounts:
    """Counts against the run this job was compared with when it succeeded.

    They were stored then; they are counted again only when that run has since been deleted
    (pruned), so that they agree with the pages, which now treat every item as new.
    """
    _require_items(job)
    assert job.item_count is not None and job.new_count is not None
    if job.previous_job_id is None and job.new_count != job.item_count:
        return count_against(session, job.id, None)[1]
    removed = job.removed_count or 0
    return DiffCounts(job.new_count, removed, job.item_count - job.new_count)


_PAGES = {
    DiffKind.NEW: """
        SELECT c.item_key, c.item FROM result_items AS c
         WHERE c.job_id = :job_id AND (CAST(:after AS text) IS NULL OR c.item_key > :after)
           AND NOT EXISTS (SELECT 1 FROM result_items AS p
                            WHERE p.job_id = :previous AND p.item_key = c.item_key)
         ORDER BY c.item_key LIMIT :limit""",
    DiffKind.REMOVED: """
        SELECT p.item_key, p.item FROM result_items AS p
         WHERE p.job_id = :previous AND (CAST(:after AS text) IS NULL OR p.item_key > :after)
           AND NOT EXISTS (SELECT 1 FROM result_items AS c
                            WHERE c.job_id = :job_id AND c.item_key = p.item_key)
         ORDER BY p.item_key LIMIT :limit""",
    DiffKind.UNCHANGED: """
        SELECT c.item_key, c.item FROM result_items AS c
          JOIN result_items AS p ON p.job_id = :previous AND p.item_key = c.item_key
         WHERE c.job_id = :job_id AND (CAST(:after AS text) IS NULL OR c.item_key > :after)
         ORDER BY c.item_key LIMIT :limit""",
}


def _encode(item_key: str) -> str:
    """Prefixed, so that even the empty key makes a non-empty cursor."""
    return base64.urlsafe_b64encode(b"k:" + item_key.encode()).decode().rstrip("=")


def _decode(cursor: str) -> str:
    padded = cursor + "=" * (-len(cursor) % 4)
    try:
        raw = base64.b64decode(padded, altchars=b"-_", validate=True).decode()
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidCursor("cursor is not one this API returned", {"cursor": cursor}) from exc
    if not raw.startswith("k:") or "\x00" in raw:
        raise InvalidCursor("cursor is not one this API returned", {"cursor": cursor})
    return raw[2:]


def diff_page(
    session: Session, job: JobRow, kind: DiffKind, *, limit: int, cursor: str | None = None
) -> DiffPage:
    """One page of new, removed or unchanged items, keyset-paged on the item key.

    Removed items are the previous run's; the others are this run's.
    """
    _require_items(job)
    rows = session.execute(
        text(_PAGES[kind]),
        {
            "job_id": job.id,
            "previous": job.previous_job_id,
            "after": _decode(cursor) if cursor else None,
            "limit": limit + 1,
        },
    ).all()
    next_cursor = _encode(rows[limit - 1].item_key) if len(rows) > limit else None
    return DiffPage(items=[row.item for row in rows[:limit]], next_cursor=next_cursor)
