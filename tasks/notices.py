"""Sends notices queued by a settling transaction once it has committed, and retries them."""

import logging
import time
import uuid

from sqlalchemy import event
from sqlalchemy.orm import Session

from service.catalogue.notices import send_notice as send
from service.catalogue.notices import take_queued
from service.platform.constants import TASK_SEND_NOTICE
from service.platform.errors import RetryLater
from tasks import runtime
from tasks.app import app
from tasks.base import FlowbeatTask

log = logging.getLogger(__name__)


@app.task(bind=True, base=FlowbeatTask, name=TASK_SEND_NOTICE)
def send_notice(self: FlowbeatTask, job_id: str) -> None:
    rt = runtime.get()
    delay = send(
        rt.sessions,
        rt.settings,
        uuid.UUID(job_id),
        attempt=self.request.retries + 1,
        now_s=time.time(),
    )
    if delay is not None:
        raise RetryLater(delay, "notice not delivered yet")


@event.listens_for(Session, "after_commit")
def _publish_queued(session: Session) -> None:
    """The commit already happened: a broker failure here loses only the webhook, never the
    run or its ``new_items`` event, so it is logged rather than raised."""
    for job_id in take_queued(session):
        try:
            send_notice.delay(str(job_id))
        except Exception:
            log.exception("could not queue the notice of job %s", job_id)


@event.listens_for(Session, "after_rollback")
def _drop_queued(session: Session) -> None:
    take_queued(session)
