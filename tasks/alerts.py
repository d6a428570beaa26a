"""Sends the alerts the outbox holds due. The beat leader queues this task while any are due;
a lost message costs a pass, never an alert, since the rows in PostgreSQL are what is sent."""

from service.alerts.sending import send_due
from service.platform.constants import TASK_SEND_ALERTS
from tasks import runtime
from tasks.app import app
from tasks.base import FlowbeatTask


@app.task(base=FlowbeatTask, name=TASK_SEND_ALERTS)
def send_alerts() -> int:
    rt = runtime.get()
    return send_due(rt.sessions, rt.settings)
