"""Pipelines submitted in process, among them a for_each step over ``params.items``, for the
tests of the runner and of shards."""

import uuid
from typing import Any

from service.engine.runtime import Runtime
from service.engine.submission import JobRequest, submit_job
from service.platform.db import unit_of_work


def fan_profile(uses: str = "${{ item }}", items_type: str = "array") -> dict[str, Any]:
    return {
        "name": "fan",
        "params": {"items": {"type": items_type}},
        "steps": [
            {
                "id": "each",
                "action": "noop",
                "for_each": {"items": "${{ params.items }}", "max_parallel": 2},
                "with": {"item": uses},
            }
        ],
    }


def submitted(rt: Runtime, profile: dict[str, Any], params: dict[str, Any]) -> uuid.UUID:
    with unit_of_work(rt.sessions) as session:
        job, _ = submit_job(
            session,
            JobRequest(pipeline=profile, params=params),
            owner=f"o-{uuid.uuid4().hex[:8]}",
            profiles_dir=rt.settings.profiles_dir,
            known_actions=rt.registry.names(),
        )
    return job.id
