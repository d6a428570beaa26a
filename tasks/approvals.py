"""Sends the signed notice of an escalated approval, retrying as diff notices do."""

import time
import uuid

from service.engine.approvals import send_escalation as send
from service.platform.constants import TASK_SEND_ESCALATION
from service.platform.errors import RetryLater
from tasks import runtime
from tasks.app import app
from tasks.base import FlowbeatTask


@app.task(bind=True, base=FlowbeatTask, name=TASK_SEND_ESCALATION)
def send_escalation(self: FlowbeatTask, job_id: str, step_id: str) -> None:
    rt = runtime.get()
    delay = send(
        rt.sessions,
        rt.settings,
        uuid.UUID(job_id),
        step_id,
        attempt=self.request.retries + 1,
        now_s=time.time(),
    )
    if delay is not None:
        raise RetryLater(delay, "escalation notice not delivered yet")
