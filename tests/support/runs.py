"""Runs of a one-step pipeline whose result items are whatever the test passes, run in process
through the same claim, checkpoint and settle path a worker takes."""

import uuid
from typing import Any

from service.engine.runner import run_step
from service.engine.runtime import Runtime
from service.engine.steps import StepKey
from service.engine.submission import JobRequest, submit_job
from service.platform.db import unit_of_work
from service.platform.models import JobRow


def echo_profile(name: str, key: str = "id") -> dict[str, Any]:
    return {
        "name": name,
        "params": {"items": {"type": "array", "default": []}},
        "steps": [{"id": "found", "action": "noop", "with": {"items": "${{ params.items }}"}}],
        "result": {"step": "found", "items": "items", "key": key},
    }


def run_items(
    rt: Runtime,
    items: list[Any],
    *,
    owner: str,
    pipeline: str,
    diff_mode: bool = False,
    notify_url: str | None = None,
    key: str = "id",
) -> JobRow:
    with unit_of_work(rt.sessions) as session:
        job, _ = submit_job(
            session,
            JobRequest(
                pipeline=echo_profile(pipeline, key),
                params={"items": items},
                diff_mode=diff_mode,
                notify_url=notify_url,
            ),
            owner=owner,
            profiles_dir=rt.settings.profiles_dir,
            known_actions=rt.registry.names(),
        )
    run_step(rt, StepKey(job.id, "found"), task_id=uuid.uuid4().hex)
    with unit_of_work(rt.sessions) as session:
        stored = session.get(JobRow, job.id)
        assert stored is not None
        return stored
