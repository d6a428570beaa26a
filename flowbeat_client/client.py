"""``Client(url, key)``: one ``httpx.Client`` with the bearer key, and a section per resource.

Every method is one request, but ``jobs.wait``, which polls ``GET /v1/jobs/{id}``. An answer
of 400 or above raises ``FlowbeatApiError`` with the envelope's code.
"""

import builtins
import time
from typing import Any, cast

import httpx

from flowbeat_client.errors import FlowbeatApiError, JobWaitTimeout
from flowbeat_client.types import (
    Backfill,
    Diff,
    Job,
    JobPage,
    LogPage,
    Pipeline,
    PipelineDetail,
    Run,
    RunPage,
    Schedule,
    Submitted,
)

FINAL = frozenset({"succeeded", "failed", "cancelled"})
DEFAULT_TIMEOUT_S = 30.0


class _Section:
    def __init__(self, http: httpx.Client) -> None:
        self._http = http

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        answer = self._http.request(method, path, **kwargs)
        if answer.status_code >= 400:
            raise _error(answer)
        return answer.json() if answer.content else None


def _error(answer: httpx.Response) -> FlowbeatApiError:
    try:
        error = answer.json()["error"]
        return FlowbeatApiError(
            answer.status_code, error["code"], error["message"], error.get("details") or {}
        )
    except (ValueError, KeyError, TypeError):
        return FlowbeatApiError(answer.status_code, "http_error", answer.text[:500], {})


def _query(**params: Any) -> dict[str, Any]:
    return {name: value for name, value in params.items() if value is not None}


class Jobs(_Section):
    def create(
        self,
        pipeline: str | dict[str, Any],
        params: dict[str, Any] | None = None,
        *,
        idempotency_key: str | None = None,
        refresh: bool = False,
    ) -> Job:
        """``pipeline``: a saved pipeline's name (or ``owner/name``), or an inline profile;
        ``refresh`` runs every step again, taking nothing from the step cache."""
        return self.submit(pipeline, params, idempotency_key=idempotency_key, refresh=refresh)[
            "job"
        ]

    def submit(
        self,
        pipeline: str | dict[str, Any],
        params: dict[str, Any] | None = None,
        *,
        idempotency_key: str | None = None,
        refresh: bool = False,
    ) -> Submitted:
        """``create``, telling too whether the pipeline's dedupe window gave back a job it
        already had instead of storing a new one."""
        body = _query(
            pipeline=pipeline,
            params=params or {},
            idempotency_key=idempotency_key,
            refresh=refresh or None,
        )
        answer = self._call("POST", "/v1/jobs", json=body)
        return Submitted(job=answer["job"], deduplicated=answer["deduplicated"])

    def get(self, job_id: str) -> Job:
        return cast(Job, self._call("GET", f"/v1/jobs/{job_id}")["job"])

    def list(
        self,
        *,
        pipeline: str | None = None,
        status: str | None = None,
        limit: int | None = None,
        cursor: str | None = None,
        parent: str | None = None,
    ) -> JobPage:
        """``parent``: only the jobs that came from that job (its children, reruns and the
        jobs its success started)."""
        params = _query(pipeline=pipeline, status=status, limit=limit, cursor=cursor, parent=parent)
        return cast(JobPage, self._call("GET", "/v1/jobs", params=params))

    def wait(self, job_id: str, *, timeout_s: float = 600.0, poll_s: float = 0.5) -> Job:
        """The job once it is final; ``JobWaitTimeout`` after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while True:
            job = self.get(job_id)
            if job["status"] in FINAL:
                return job
            if time.monotonic() >= deadline:
                raise JobWaitTimeout(job_id, job["status"], timeout_s)
            time.sleep(poll_s)

    def cancel(self, job_id: str) -> Job:
        return cast(Job, self._call("POST", f"/v1/jobs/{job_id}/cancel")["job"])

    def rerun(
        self,
        job_id: str,
        *,
        from_step: str | None = None,
        params: dict[str, Any] | None = None,
        reuse_upstream: bool = True,
        only_failed_items: bool = False,
    ) -> Job:
        """A new job with ``parent_job_id``; steps before ``from_step`` reuse their outputs."""
        body = {
            "from_step": from_step,
            "params": params or {},
            "reuse_upstream": reuse_upstream,
            "only_failed_items": only_failed_items,
        }
        return cast(Job, self._call("POST", f"/v1/jobs/{job_id}/rerun", json=body)["job"])

    def approve(
        self, job_id: str, step_id: str, *, comment: str | None = None, payload: Any = None
    ) -> Job:
        body = {"comment": comment, "payload": payload}
        path = f"/v1/jobs/{job_id}/steps/{step_id}/approve"
        return cast(Job, self._call("POST", path, json=body)["job"])

    def reject(self, job_id: str, step_id: str, *, comment: str | None = None) -> Job:
        path = f"/v1/jobs/{job_id}/steps/{step_id}/reject"
        return cast(Job, self._call("POST", path, json={"comment": comment})["job"])

    def signal(self, job_id: str, name: str, *, payload: Any = None) -> Job:
        """Send the job the signal ``name``: the steps waiting for it run reading ``payload``;
        one that waits later finds it. Once per name (``signal_already_received``)."""
        path = f"/v1/jobs/{job_id}/signals/{name}"
        return cast(Job, self._call("POST", path, json={"payload": payload})["job"])

    def diff(
        self, job_id: str, *, kind: str = "new", limit: int | None = None, cursor: str | None = None
    ) -> Diff:
        params = _query(kind=kind, limit=limit, cursor=cursor)
        return cast(Diff, self._call("GET", f"/v1/jobs/{job_id}/diff", params=params))

    def logs(
        self,
        job_id: str,
        step_id: str,
        *,
        attempt: int | None = None,
        after: int | None = None,
        limit: int | None = None,
    ) -> LogPage:
        """A page of what the step's attempts logged and printed; ``next_after`` pages on."""
        params = _query(attempt=attempt, after=after, limit=limit)
        path = f"/v1/jobs/{job_id}/steps/{step_id}/logs"
        return cast(LogPage, self._call("GET", path, params=params))


class Pipelines(_Section):
    def list(self, *, tag: str | None = None) -> list[Pipeline]:
        return cast(
            list[Pipeline], self._call("GET", "/v1/pipelines", params=_query(tag=tag))["pipelines"]
        )

    def get(self, name: str) -> PipelineDetail:
        return cast(PipelineDetail, self._call("GET", f"/v1/pipelines/{name}")["pipeline"])

    def put(self, name: str, profile: str | dict[str, Any]) -> PipelineDetail:
        """``profile``: YAML text, or the profile as a mapping; saves a version if it is new."""
        if isinstance(profile, str):
            sent = self._call(
                "PUT",
                f"/v1/pipelines/{name}",
                content=profile.encode(),
                headers={"Content-Type": "application/yaml"},
            )
        else:
            sent = self._call("PUT", f"/v1/pipelines/{name}", json=profile)
        return cast(PipelineDetail, sent["pipeline"])

    def delete(self, name: str, *, purge_history: bool = False) -> int:
        """Returns how many of its jobs were purged (none unless ``purge_history``)."""
        params = {"purge_history": "true"} if purge_history else {}
        purged: int = self._call("DELETE", f"/v1/pipelines/{name}", params=params)["purged_jobs"]
        return purged


def _schedule_path(pipeline: str, schedule: str | None) -> str:
    """A pipeline may have several schedules; ``schedule`` (a name or id) picks one, and
    without it the routes mean the pipeline's only one (``schedule_ambiguous`` when several)."""
    if schedule is None:
        return f"/v1/pipelines/{pipeline}/schedule"
    return f"/v1/pipelines/{pipeline}/schedules/{schedule}"


class Schedules(_Section):
    def list(self, pipeline: str | None = None) -> list[Schedule]:
        """The key owner's schedules, or only ``pipeline``'s."""
        path = "/v1/schedules" if pipeline is None else f"/v1/pipelines/{pipeline}/schedules"
        return cast(list[Schedule], self._call("GET", path)["schedules"])

    def get(self, pipeline: str, schedule: str | None = None) -> Schedule:
        path = _schedule_path(pipeline, schedule)
        return cast(Schedule, self._call("GET", path)["schedule"])

    def put(
        self, pipeline: str, spec: dict[str, Any] | None = None, *, schedule: str | None = None
    ) -> Schedule:
        """``spec`` as in the API (``cron``, ``timezone``, ``params``, ``priority``, …); none:
        the profile's own ``schedule:`` block. A ``schedule`` name the pipeline has no
        schedule of yet creates one."""
        path = _schedule_path(pipeline, schedule)
        return cast(Schedule, self._call("PUT", path, json=spec)["schedule"])

    def add(self, pipeline: str, spec: dict[str, Any] | None = None) -> Schedule:
        """One more schedule of ``pipeline``, beside those it has."""
        path = f"/v1/pipelines/{pipeline}/schedules"
        return cast(Schedule, self._call("POST", path, json=spec)["schedule"])

    def delete(self, pipeline: str, schedule: str | None = None) -> None:
        self._call("DELETE", _schedule_path(pipeline, schedule))

    def backfill(
        self, pipeline: str, schedule: str, *, start: str, end: str, max_active: int = 1
    ) -> Backfill:
        """One job per fire time of the schedule's cron in ``[start, end)`` (ISO 8601 with a
        zone), oldest first, at most ``max_active`` open at once; fires that ran are skipped."""
        body = {"from": start, "to": end, "max_active": max_active}
        path = f"{_schedule_path(pipeline, schedule)}/backfill"
        return cast(Backfill, self._call("POST", path, json=body)["backfill"])

    def backfills(self, pipeline: str, schedule: str | None = None) -> builtins.list[Backfill]:
        """With their progress, newest first: the schedule's, or all the pipeline's."""
        path = (
            f"/v1/pipelines/{pipeline}/backfills"
            if schedule is None
            else f"{_schedule_path(pipeline, schedule)}/backfill"
        )
        return cast(builtins.list[Backfill], self._call("GET", path)["backfills"])

    def cancel_backfill(self, pipeline: str, schedule: str, backfill_id: str) -> Backfill:
        """Start no more of its fires and cancel its open jobs."""
        path = f"{_schedule_path(pipeline, schedule)}/backfill/{backfill_id}/cancel"
        return cast(Backfill, self._call("POST", path)["backfill"])


class Runs(_Section):
    def list(
        self, pipeline: str, *, limit: int | None = None, cursor: str | None = None
    ) -> RunPage:
        params = _query(limit=limit, cursor=cursor)
        return cast(RunPage, self._call("GET", f"/v1/pipelines/{pipeline}/runs", params=params))

    def last(self, pipeline: str) -> Run | None:
        runs = self.list(pipeline, limit=1)["runs"]
        return runs[0] if runs else None


class Client:
    """``Client(url, key).jobs.create(pipeline, params)``; close it, or use it in ``with``."""

    def __init__(
        self,
        url: str,
        key: str,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self._http = httpx.Client(
            base_url=url.rstrip("/"),
            headers={"Authorization": f"Bearer {key}", "User-Agent": "flowbeat-client"},
            timeout=timeout_s,
            transport=transport,
        )
        self.jobs = Jobs(self._http)
        self.pipelines = Pipelines(self._http)
        self.schedules = Schedules(self._http)
        self.runs = Runs(self._http)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *_: object) -> None:
        self.close()
