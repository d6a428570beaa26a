"""Carrying out a bulk action (``service.engine.bulk``) batch by batch: each batch committed,
then what it made ready sent, for the API's route and the command line alike."""

import uuid
from dataclasses import dataclass

from celery import Celery

from service.engine.bulk import Admission, Batch, next_batch
from service.engine.runtime import Runtime
from service.language.plan import JobPlan, load_plan
from service.platform.audit import Actor
from service.platform.clock import utcnow
from service.platform.db import unit_of_work
from service.platform.settings import Settings
from tasks.dispatch import publish_or_defer, revoke_unstarted


@dataclass(frozen=True)
class BulkRun:
    app: Celery
    rt: Runtime
    settings: Settings

    def run(self, bulk_id: uuid.UUID, actor: Actor) -> None:
        """Batches until the action is done. An owner at its open-jobs cap raises
        ``OpenJobsLimit`` after the batches before it are committed and sent: a retry later
        goes on from there. Should this process die, what it committed stays done, and the
        sweeper sends a committed rerun whose steps were never sent."""
        admission = Admission(
            open_jobs_limit=self.settings.max_open_jobs_per_owner,
            fair_share_ahead=self.settings.fair_share_ahead,
        )
        while True:
            with unit_of_work(self.rt.sessions) as session:
                batch = next_batch(
                    session,
                    bulk_id,
                    actor,
                    size=self.settings.bulk_batch_jobs,
                    now=utcnow(),
                    admission=admission,
                )
            self.send(batch)
            if batch.blocked is not None:
                batch.blocked.details["bulk_id"] = str(bulk_id)
                raise batch.blocked
            if batch.done:
                return

    def send(self, batch: Batch) -> None:
        """A publish the broker refuses leaves its job to the sweeper; a lost revoke leaves a
        running step to stop at its next checkpoint, as a single cancel does."""
        for job_id in batch.compensate:
            publish_or_defer(self.app, self.rt, JobPlan(job_id, compensate=True))
        if batch.reruns:
            with unit_of_work(self.rt.sessions) as session:
                plans = [load_plan(session, job_id) for job_id in batch.reruns]
            for plan in plans:
                if plan is not None:
                    publish_or_defer(self.app, self.rt, plan)
        revoke_unstarted(self.app, batch.revoke)
