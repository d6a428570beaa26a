"""One trace per job, with OpenTelemetry: on when an OTLP endpoint is configured, and then
only.

``OTEL_EXPORTER_OTLP_ENDPOINT`` (or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``) turns it on for a
process at start, with the rest of the standard ``OTEL_*`` variables as the SDK reads them.
Off, nothing is installed: every helper here returns at its first test of ``_tracer``, no
header is added to a message and no span is made, so the step path pays one attribute read.

A job's trace starts where the job does (the API request, or the beat's fire of a schedule)
and travels in each step's message as a W3C ``traceparent`` header: a worker continues it for
the attempt it runs, and the messages that attempt sends carry the attempt's own span on, so
every step of a chain, a retry and a fan-out's items join the one trace, and an outbound HTTP
call made by an action is a span of the attempt that made it, with the header passed on. The
statements a process sends PostgreSQL are spans too (OpenTelemetry's psycopg instrumentation,
installed with the exporter), under whichever span sent them.
"""

import os
from collections.abc import Mapping, MutableMapping
from contextlib import AbstractContextManager, nullcontext

from opentelemetry import propagate, trace
from opentelemetry.trace import Span, Tracer

TRACEPARENT = "traceparent"
ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")

_tracer: Tracer | None = None
_NOTHING: AbstractContextManager[None] = nullcontext()


def configure(service_name: str, environ: Mapping[str, str] = os.environ) -> bool:
    """Export this process's spans over OTLP (HTTP) when an endpoint is set; whether it does.
    Once per process: the provider is process-wide, and a forked pool process keeps its
    parent's, whose batch processor starts its export thread again in the child."""
    global _tracer
    if _tracer is not None or not any(environ.get(name) for name in ENDPOINT_VARIABLES):
        return _tracer is not None
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.instrumentation.psycopg import PsycopgInstrumentor
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    resource = Resource.create({"service.name": environ.get("OTEL_SERVICE_NAME", service_name)})
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    PsycopgInstrumentor().instrument(tracer_provider=provider)
    _tracer = provider.get_tracer("flowbeat")
    return True


def on() -> bool:
    return _tracer is not None


def span(
    name: str, parent: str | None = None, **attributes: str | int | float | bool
) -> AbstractContextManager[Span | None]:
    """A span of the current trace, or of ``parent`` (a ``traceparent``) when one is given,
    as the current span inside; off, one shared empty context and nothing made."""
    if _tracer is None:
        return _NOTHING
    context = propagate.extract({TRACEPARENT: parent}) if parent else None
    return _tracer.start_as_current_span(name, context=context, attributes=attributes)


def traceparent() -> str | None:
    """The current span as a ``traceparent`` header, for a message that continues it."""
    if _tracer is None:
        return None
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier.get(TRACEPARENT)


def inject(headers: MutableMapping[str, str]) -> None:
    """Pass the current trace on to the server an outbound request goes to."""
    if _tracer is not None:
        propagate.inject(headers)


def trace_id_of(parent: str | None) -> str | None:
    """The trace id in a ``traceparent`` header, for the lines logged about its message
    outside its span (Celery's own, once the task has returned)."""
    if parent is None:
        return None
    parts = parent.split("-")
    return parts[1] if len(parts) == 4 and len(parts[1]) == 32 else None


def trace_id() -> str | None:
    """The current trace's id as log lines and tracing tools write it (32 hex digits)."""
    if _tracer is None:
        return None
    context = trace.get_current_span().get_span_context()
    return format(context.trace_id, "032x") if context.is_valid else None
