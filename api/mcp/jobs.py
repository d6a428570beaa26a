"""The MCP tools about jobs: run one, find them by label, follow one, signal it, read its diff
and its logs."""

from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from sqlalchemy.orm import Session

from api.mcp.calls import McpDeps, acting, call, job_id_of, visible_to
from api.routes.jobs import job_statuses
from api.routes.runs import DiffCountsPublic, DiffPublic
from api.schemas import (
    JobCreate,
    JobFilterBody,
    JobPublic,
    LogPage,
    SignalEnvelope,
    SignalPublic,
)
from api.submit import accept_job
from service.catalogue.diffs import DiffKind, diff_counts, diff_page
from service.engine.jobs import get_job, job_view, list_jobs
from service.engine.signals import send_signal
from service.engine.steplogs import step_lines
from service.platform.audit import record_signal
from service.platform.auth import Principal
from service.platform.clock import utcnow
from service.platform.constants import (
    DIFF_PAGE_MAX_LIMIT,
    JOB_LIST_MAX_LIMIT,
    STEP_LOG_PAGE_MAX_ROWS,
)
from service.platform.models import JobRow
from tasks.dispatch import publish_or_defer


def _diff(
    session: Session, principal: Principal, job_id: str, kind: DiffKind, limit: int
) -> dict[str, Any]:
    job = get_job(session, job_id_of(job_id), owner=visible_to(principal))
    page = diff_page(session, job, kind, limit=min(limit, DIFF_PAGE_MAX_LIMIT))
    return DiffPublic(
        job_id=job.id,
        previous_job_id=job.previous_job_id,
        kind=kind,
        counts=DiffCountsPublic(**diff_counts(session, job).as_dict()),
        items=page.items,
        next_cursor=page.next_cursor,
    ).model_dump(mode="json")


def _summary(job: JobRow) -> dict[str, Any]:
    return {
        "id": str(job.id),
        "pipeline": job.pipeline,
        "status": job.status,
        "labels": job.labels,
        "created_at": job.created_at.isoformat(),
        "error": job.error,
    }


def job_tools(server: MCPServer, deps: McpDeps) -> None:
    @server.tool()
    async def run_pipeline(
        pipeline: str,
        ctx: Context,
        params: dict[str, Any] | None = None,
        idempotency_key: str | None = None,
        diff_mode: bool = False,
        priority: int | None = None,
        labels: dict[str, str] | None = None,
        refresh: bool = False,
    ) -> dict[str, Any]:
        """Start a job of a saved pipeline (name or owner/name) or of inline YAML; the same
        ``idempotency_key`` twice gives back the first job. When the pipeline's dedupe key
        matches an open or recent job, that job comes back with ``deduplicated: true``.
        ``priority`` 0-9, higher is taken first within a queue (default: the profile's);
        ``labels`` say whom it is for ({"tenant": "acme"}), for ``find_jobs``. ``refresh``
        runs every step again, taking nothing from the step cache."""
        body = JobCreate(
            pipeline=pipeline,
            params=params or {},
            idempotency_key=idempotency_key,
            diff_mode=diff_mode,
            priority=priority,
            labels=labels or {},
            refresh=refresh,
        )

        def work(session: Session, principal: Principal) -> dict[str, Any]:
            actor = acting(principal, "run_pipeline")
            accepted = accept_job(
                body, principal, session, deps.runtime, deps.settings, deps.celery_app, actor
            )
            return {
                "job": accepted.job.model_dump(mode="json"),
                "deduplicated": accepted.deduplicated,
            }

        return await call(deps, ctx, "write", work)

    @server.tool()
    async def find_jobs(
        ctx: Context,
        labels: dict[str, str] | None = None,
        status: list[str] | None = None,
        pipeline: str | None = None,
        error_code: str | None = None,
        limit: int = 20,
    ) -> dict[str, Any]:
        """The newest jobs with every label given ({"tenant": "acme"}), any of the statuses,
        of the pipeline, failed with the error code: ids, statuses and labels, as
        ``GET /v1/jobs`` filters them."""
        match = JobFilterBody(pipeline=pipeline, labels=labels or {}, error_code=error_code)

        def work(session: Session, principal: Principal) -> dict[str, Any]:
            found, _ = list_jobs(
                session,
                owner=visible_to(principal),
                match=match.match(job_statuses(status or [])),
                limit=max(1, min(limit, JOB_LIST_MAX_LIMIT)),
            )
            return {"jobs": [_summary(job) for job in found]}

        return await call(deps, ctx, "read", work)

    @server.tool(name="get_job")
    async def get_job_tool(job_id: str, ctx: Context) -> dict[str, Any]:
        """A job with each step's status, attempts, error and output, and its result."""

        def work(session: Session, principal: Principal) -> dict[str, Any]:
            job = get_job(session, job_id_of(job_id), owner=visible_to(principal))
            return {"job": JobPublic.of(job_view(session, job)).model_dump(mode="json")}

        return await call(deps, ctx, "read", work)

    @server.tool(name="send_signal")
    async def send_signal_tool(
        job_id: str, name: str, ctx: Context, payload: Any = None
    ) -> dict[str, Any]:
        """Send a running job the signal ``name`` with a JSON ``payload``: the steps waiting
        for it (``wait_for``) run and read it as ``signals.<name>.payload``; one that waits
        later finds it. Once per name."""

        def work(session: Session, principal: Principal) -> dict[str, Any]:
            sent = send_signal(
                session,
                job_id_of(job_id),
                name,
                payload,
                by=principal.owner,
                visible_to=visible_to(principal),
                now=utcnow(),
            )
            record_signal(session, acting(principal, "send_signal"), sent.job.id, name)
            session.commit()
            envelope = SignalEnvelope(
                signal=SignalPublic.of(sent.signal, sent.resumed),
                job=JobPublic.of(job_view(session, sent.job)),
            )
            session.commit()
            publish_or_defer(deps.celery_app, deps.runtime, sent.ready)
            return envelope.model_dump(mode="json")

        return await call(deps, ctx, "write", work)

    @server.tool()
    async def get_diff(
        job_id: str, ctx: Context, kind: DiffKind = DiffKind.NEW, limit: int = 50
    ) -> dict[str, Any]:
        """What a run found against the previous successful run: counts of new, removed and
        unchanged items, and the first ``limit`` items of ``kind``."""
        limit = max(1, limit)
        return await call(
            deps, ctx, "read", lambda session, who: _diff(session, who, job_id, kind, limit)
        )

    @server.tool()
    async def get_logs(
        job_id: str, step_id: str, ctx: Context, attempt: int = 0, after: int = 0, limit: int = 200
    ) -> dict[str, Any]:
        """What a step's attempts logged and printed, oldest first (``attempt`` 0: every
        attempt); pass ``next_after`` back as ``after`` for the lines that follow."""
        limit = min(max(1, limit), STEP_LOG_PAGE_MAX_ROWS)

        def work(session: Session, principal: Principal) -> dict[str, Any]:
            lines = step_lines(
                session,
                job_id_of(job_id),
                step_id,
                owner=visible_to(principal),
                attempt=attempt or None,
                after=after,
                limit=limit,
            )
            return LogPage.of(lines, after, limit).model_dump(mode="json")

        return await call(deps, ctx, "read", work)
