"""Short job ids: a unique prefix of 8 or more hex digits names one job, among one owner's or
everyone's; none or several are refused with their codes."""

import uuid
from collections.abc import Iterator

import pytest
from sqlalchemy.orm import Session

from service.engine.jobids import resolve_job_id
from service.engine.runtime import Runtime
from service.platform.clock import utcnow
from service.platform.errors import JobIdAmbiguous, JobIdInvalid, JobNotFound
from service.platform.models import PrunedJobRow
from tests.support.arrange import add_job


@pytest.fixture
def session(runtime: Runtime) -> Iterator[Session]:
    """Rows added here are never committed."""
    with runtime.sessions() as open_session:
        yield open_session
        open_session.rollback()


def _job(session: Session, job_id: uuid.UUID, owner: str) -> uuid.UUID:
    return add_job(session, owner, "cancelled", job_id=job_id)


def _ids(prefix: str, count: int) -> list[uuid.UUID]:
    return [uuid.UUID(prefix + uuid.uuid4().hex[len(prefix) :]) for _ in range(count)]


def test_a_unique_prefix_names_its_job(session: Session) -> None:
    [one] = _ids(uuid.uuid4().hex[:8], 1)
    _job(session, one, "alice")
    short = str(one)[:8]

    assert resolve_job_id(session, short, owner=None) == one
    assert resolve_job_id(session, short.upper(), owner="alice") == one
    assert resolve_job_id(session, str(one)[:13], owner=None) == one
    assert resolve_job_id(session, one.hex[:20], owner=None) == one


def test_a_whole_id_is_taken_as_it_is(session: Session) -> None:
    unknown = uuid.uuid4()

    assert resolve_job_id(session, str(unknown), owner=None) == unknown


def test_a_prefix_of_several_jobs_is_refused_naming_them(session: Session) -> None:
    first, second = _ids(uuid.uuid4().hex[:8], 2)
    _job(session, first, "alice")
    _job(session, second, "bob")
    short = first.hex[:8]

    with pytest.raises(JobIdAmbiguous) as refused:
        resolve_job_id(session, short, owner=None)

    assert refused.value.code == "job_id_ambiguous"
    assert sorted(refused.value.details["matches"]) == sorted([str(first), str(second)])
    assert resolve_job_id(session, short, owner="bob") == second


def test_a_prefix_of_no_job_the_owner_sees_is_not_found(session: Session) -> None:
    [theirs] = _ids(uuid.uuid4().hex[:8], 1)
    _job(session, theirs, "alice")

    with pytest.raises(JobNotFound) as refused:
        resolve_job_id(session, theirs.hex[:8], owner="bob")
    assert refused.value.code == "job_not_found"
    with pytest.raises(JobNotFound):
        resolve_job_id(session, uuid.uuid4().hex[:12], owner=None)


def test_a_prefix_of_a_pruned_job_names_it_so_its_expiry_is_reported(session: Session) -> None:
    [gone] = _ids(uuid.uuid4().hex[:8], 1)
    session.add(PrunedJobRow(job_id=gone, owner="alice", pipeline="dag", pruned_at=utcnow()))
    session.flush()

    assert resolve_job_id(session, gone.hex[:8], owner=None) == gone


@pytest.mark.parametrize("given", ["1234567", "1234567g", "", "x" * 40, "0" * 33])
def test_what_is_not_an_id_or_8_hex_digits_is_refused(session: Session, given: str) -> None:
    with pytest.raises(JobIdInvalid) as refused:
        resolve_job_id(session, given, owner=None)
    assert refused.value.code == "job_id_invalid"
