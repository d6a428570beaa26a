"""Which jobs: the one filter the job list, its command, the dashboard and the bulk actions
share, so a bulk action acts on exactly the jobs the same filter lists.

A label filter is a containment test (``labels @> {...}``), every label given must match,
answered by the GIN index ``ix_jobs_labels``, which holds labelled jobs only (so the filter
also says ``labels <> '{}'`` in words the planner proves the index's predicate from); an error
code reads ``ix_jobs_error_code``; a time range bounds ``created_at`` (``since`` included,
``until`` excluded)."""

import uuid
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, and_, literal, literal_column, or_
from sqlalchemy.dialects.postgresql import JSONB

from service.engine.compensations import failed_compensation_jobs
from service.engine.family import came_from
from service.platform.errors import JobFilterInvalid
from service.platform.models import NO_LABELS, JobRow


@dataclass(frozen=True)
class JobFilter:
    pipeline: str | None = None
    statuses: tuple[str, ...] = ()
    labels: Mapping[str, str] = field(default_factory=dict)
    error_code: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    compensation_failed: bool = False
    parent: uuid.UUID | None = None

    def __post_init__(self) -> None:
        for name in ("since", "until"):
            moment = getattr(self, name)
            if moment is not None and moment.tzinfo is None:
                raise JobFilterInvalid(f"{name} needs a time zone", {"param": name})

    def is_empty(self) -> bool:
        return self == JobFilter()

    def clauses(self, owner: str | None) -> list[ColumnElement[bool]]:
        """The filter as WHERE clauses; ``owner`` limits it to that owner's jobs."""
        found: list[ColumnElement[bool]] = []
        if owner is not None:
            found.append(JobRow.owner == owner)
        if self.pipeline:
            found.append(JobRow.pipeline == self.pipeline)
        if self.statuses:
            found.append(JobRow.status.in_(self.statuses))
        if self.labels:
            found.append(JobRow.labels.op("@>")(literal(dict(self.labels), JSONB)))
            found.append(JobRow.labels.op("<>")(literal_column(NO_LABELS)))
        if self.error_code:
            found.append(
                and_(JobRow.error.is_not(None), JobRow.error["code"].astext == self.error_code)
            )
        if self.since is not None:
            found.append(JobRow.created_at >= self.since)
        if self.until is not None:
            found.append(JobRow.created_at < self.until)
        if self.compensation_failed:
            found.append(failed_compensation_jobs())
        if self.parent is not None:
            found.append(came_from(self.parent))
        return found

    def to_json(self) -> dict[str, Any]:
        """The filter as a bulk action stores it, without its empty parts."""
        raw = asdict(self)
        raw["statuses"] = list(self.statuses)
        raw["labels"] = dict(self.labels)
        for name in ("since", "until"):
            raw[name] = None if raw[name] is None else raw[name].isoformat()
        raw["parent"] = None if self.parent is None else str(self.parent)
        return {key: value for key, value in raw.items() if value not in (None, [], {}, False)}

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> "JobFilter":
        values = dict(raw)
        values["statuses"] = tuple(values.get("statuses", ()))
        for name in ("since", "until"):
            if values.get(name) is not None:
                values[name] = datetime.fromisoformat(values[name])
        if values.get("parent") is not None:
            values["parent"] = uuid.UUID(values["parent"])
        return cls(**values)

    def narrowed(self, statuses: frozenset[str], until: datetime) -> "JobFilter":
        """The filter a bulk action acts on: only the statuses it can change among those asked
        for, and only jobs created before it started, so the jobs it makes (a rerun's) and
        those submitted while it runs are never in it."""
        kept = tuple(s for s in self.statuses if s in statuses) if self.statuses else ()
        if self.statuses and not kept:
            raise JobFilterInvalid(
                f"this action changes only jobs that are {', '.join(sorted(statuses))}",
                {"param": "status", "allowed": sorted(statuses)},
            )
        return replace(
            self,
            statuses=kept or tuple(sorted(statuses)),
            until=until if self.until is None else min(self.until, until),
        )


EVERY_JOB = JobFilter()


def after(created_at: datetime, job_id: uuid.UUID) -> ColumnElement[bool]:
    """The jobs past (created_at, id) in ascending order: a bulk action's keyset."""
    return or_(
        JobRow.created_at > created_at,
        and_(JobRow.created_at == created_at, JobRow.id > job_id),
    )
