"""Signals: a machine tells a running job that what a step waits for happened. The signal
commits before the step it sends on is published; with the broker away it is kept, and the
sweeper sends the step."""

from fastapi import APIRouter

from api.deps import CeleryDep, RuntimeDep, SessionDep, ViaDep, Writer
from api.openapi import errors
from api.routes.jobs import parse_job_id, visible_to
from api.schemas import JobPublic, SignalCreate, SignalEnvelope, SignalPublic
from service.engine.jobs import job_view
from service.engine.signals import send_signal
from service.platform.audit import record_signal
from service.platform.clock import utcnow
from tasks.dispatch import publish_or_defer

router = APIRouter(prefix="/v1", tags=["signals"])


@router.post(
    "/jobs/{job_id}/signals/{name}",
    response_model=SignalEnvelope,
    responses=errors(
        {
            404: "job_not_found, signal_not_awaited",
            409: "signal_already_received, job_conflict",
            410: "job_expired",
            422: "validation_error",
            503: "database_unavailable, broker_unavailable",
        }
    ),
)
def signal(
    job_id: str,
    name: str,
    body: SignalCreate,
    principal: Writer,
    session: SessionDep,
    runtime: RuntimeDep,
    celery_app: CeleryDep,
    via: ViaDep,
) -> SignalEnvelope:
    """Stored once per name: the steps waiting for it (``wait_for``) run, and one that waits
    later finds it; a second signal of the same name is ``409 signal_already_received``."""
    sent = send_signal(
        session,
        parse_job_id(job_id),
        name,
        body.payload,
        by=principal.owner,
        visible_to=visible_to(principal),
        now=utcnow(),
    )
    record_signal(session, via.actor(principal), sent.job.id, name)
    session.commit()
    envelope = SignalEnvelope(
        signal=SignalPublic.of(sent.signal, sent.resumed),
        job=JobPublic.of(job_view(session, sent.job)),
    )
    session.commit()
    publish_or_defer(celery_app, runtime, sent.ready)
    return envelope
