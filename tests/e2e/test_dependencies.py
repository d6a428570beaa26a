"""A dependency trigger end to end: a worker succeeds the upstream job, the elected beat starts
the downstream one, a worker runs it with the upstream result."""

import uuid

import pytest
from sqlalchemy import select

from service.catalogue.saving import save_pipeline
from service.engine.submission import JobRequest, submit_job
from service.language.plan import initial_plan
from service.language.snapshots import job_profile
from service.platform.db import unit_of_work
from service.platform.models import JobRow
from tasks.dispatch import publish_new_job
from tests.e2e.conftest import Client, Cluster, wait_for
from tests.service.triggers.test_dependencies import DOWN, UP


@pytest.mark.timeout(120)
def test_an_upstream_success_starts_one_downstream_job_that_reads_its_result(
    client: Client, cluster: Cluster
) -> None:
    owner = f"dep-{uuid.uuid4().hex[:8]}"
    rt = client.rt
    with unit_of_work(rt.sessions) as session:
        for text in (UP, DOWN):
            save_pipeline(
                session,
                owner=owner,
                name=None,
                body=text,
                settings=rt.settings,
                known_actions=rt.registry.names(),
            )
        upstream, _ = submit_job(
            session,
            JobRequest(pipeline="up", params={}),
            owner=owner,
            profiles_dir=rt.settings.profiles_dir,
            known_actions=rt.registry.names(),
        )
    cluster.worker()
    cluster.beat(beat_lock_ttl_s="1.5")
    publish_new_job(
        client.app, rt, initial_plan(job_profile(upstream), upstream.id, upstream.priority)
    )

    def downstream() -> list[JobRow]:
        with unit_of_work(rt.sessions) as session:
            return list(
                session.scalars(
                    select(JobRow).where(JobRow.owner == owner, JobRow.pipeline == "down")
                )
            )

    wait_for(lambda: any(j.status == "succeeded" for j in downstream()), 60, "the downstream job")
    [job] = downstream()
    assert (job.trigger, job.parent_job_id) == ("dependency", upstream.id)
    assert job.result == {"b": {"from": str(upstream.id), "got": [1, 2]}}
