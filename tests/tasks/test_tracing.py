"""Tracing is off unless an OTLP endpoint is configured, and then costs the step path
nothing: no provider, no span, no header on a message."""

import json
import uuid

from celery import Celery

from service.language.plan import JobPlan, StepPlan
from service.platform import tracing
from tasks.messages import step_message

APP = Celery("tracing-test", broker="memory://", set_as_current=False)
"""Building a message connects to nothing."""


def test_without_an_endpoint_nothing_is_installed() -> None:
    assert tracing.configure("flowbeat-test", environ={}) is tracing.on()
    assert not tracing.on()
    assert tracing.span("step a") is tracing.span("step b"), "one shared empty context"
    with tracing.span("step a") as made:
        assert made is None
    assert tracing.traceparent() is None and tracing.trace_id() is None


def test_a_step_message_carries_no_trace_header_when_off() -> None:

    plan = JobPlan(uuid.uuid4(), [StepPlan("a", 30)])
    message = json.loads(step_message(APP, plan, plan.steps[0]))

    assert tracing.TRACEPARENT not in message["headers"]


def test_a_plan_made_in_another_span_carries_that_trace() -> None:

    parent = f"00-{'ab' * 16}-{'cd' * 8}-01"
    plan = JobPlan(uuid.uuid4(), [StepPlan("a", 30)], trace=parent)
    message = json.loads(step_message(APP, plan, plan.steps[0]))

    assert message["headers"][tracing.TRACEPARENT] == parent


def test_the_trace_id_is_read_from_a_traceparent_header() -> None:
    assert tracing.trace_id_of(f"00-{'ab' * 16}-{'cd' * 8}-01") == "ab" * 16
    assert tracing.trace_id_of("garbage") is None
    assert tracing.trace_id_of(None) is None
