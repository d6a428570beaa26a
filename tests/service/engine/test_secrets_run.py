"""A step that names a secret, run in process: the action gets the value, and its checkpoint,
its log, its error and the process's own log show ``***`` in its place."""

import contextlib
import logging
import uuid
from typing import Any

import pytest
from sqlalchemy import select

from service.actions import StepContext, action
from service.engine.inputs import ready_claim
from service.engine.lanes import run_lane
from service.engine.runner import run_step
from service.engine.runtime import Runtime
from service.engine.shards import FannedOut
from service.engine.steplogs import read_lines
from service.engine.steps import StepKey
from service.engine.submission import JobRequest, submit_job
from service.language.expressions import secret_mark
from service.platform.db import unit_of_work
from service.platform.errors import ActionError, RetryLater, SecretNotFound
from service.platform.models import StepRunRow

SEEN: list[dict[str, Any]] = []
VALUE = "tok-9f8e7d6c5b4a"


@action("tests.secret_echo")
def secret_echo(ctx: StepContext, token: str, fail: str = "", other: str = "") -> dict[str, Any]:
    """Says its token every way a step can, then fails with it or returns it."""
    SEEN.append({"token": token, "other": other})
    ctx.log.info("ctx says %s", token)
    logging.getLogger("tests.secret").warning("logger says %s", token)
    print(f"printed {token}")
    if fail == "action":
        raise ActionError(f"refused {token}", {"token": token}, retryable=False)
    if fail == "exception":
        raise RuntimeError(f"broke on {token}")
    return {"token": token, "header": f"Bearer {token}", token: "as a key", "other": other}


def submit(
    rt: Runtime, owner: str, with_: dict[str, Any], params: Any = None, **step: Any
) -> uuid.UUID:
    profile = {
        "name": "secret-run",
        "params": {"p": {"type": "string", "default": ""}, "items": {"type": "array"}},
        "steps": [{"id": "a", "action": "tests.secret_echo", "with": with_, **step}],
    }
    with unit_of_work(rt.sessions) as session:
        job, _ = submit_job(
            session,
            JobRequest(pipeline=profile, params=params or {}),
            owner=owner,
            profiles_dir=rt.settings.profiles_dir,
            known_actions=rt.registry.names(),
        )
    return job.id


def run(rt: Runtime, job_id: uuid.UUID) -> StepRunRow:
    with contextlib.suppress(RetryLater):
        run_step(rt, StepKey(job_id, "a"), task_id=uuid.uuid4().hex)
    with rt.sessions() as session:
        row = session.scalars(
            select(StepRunRow).where(StepRunRow.job_id == job_id, StepRunRow.step_id == "a")
        ).one()
        session.expunge(row)
        return row


def kept(rt: Runtime, job_id: uuid.UUID) -> str:
    """The step's checkpoint, log lines and error as the database holds them."""
    with rt.sessions() as session:
        output = session.scalar(
            select(StepRunRow.output).where(
                StepRunRow.job_id == job_id, StepRunRow.output.is_not(None)
            )
        )
        lines = read_lines(session, job_id, after=0, limit=100)
        error = session.scalar(select(StepRunRow.error).where(StepRunRow.job_id == job_id))
    return repr((output, [line.message for line in lines], error))


@pytest.fixture
def owner(monkeypatch: pytest.MonkeyPatch) -> str:
    name = f"o{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv("FLOWBEAT_SECRET_RUN_TOKEN", "deployment-value")
    monkeypatch.setenv(f"FLOWBEAT_SECRET_{name}__RUN_TOKEN", VALUE)
    return name


def test_the_action_gets_the_owners_value_and_everything_kept_is_masked(
    runtime: Runtime,
    owner: str,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    caplog.set_level(logging.INFO)
    job_id = submit(runtime, owner, {"token": "Bearer ${{ secrets.RUN_TOKEN }}"})
    SEEN.clear()

    assert run(runtime, job_id).status == "succeeded"

    assert [{"token": f"Bearer {VALUE}", "other": ""}] == SEEN
    stored = kept(runtime, job_id)
    assert VALUE not in stored and "Bearer ***" in stored and "'Bearer ***': 'as a key'" in stored
    assert "ctx says Bearer ***" in stored and "printed Bearer ***" in stored
    assert VALUE not in caplog.text and "logger says Bearer ***" in caplog.text
    printed = capsys.readouterr()
    assert VALUE not in printed.out + printed.err and "printed Bearer ***" in printed.out


@pytest.mark.parametrize("fail", ["action", "exception"])
def test_an_error_that_holds_the_value_is_masked(runtime: Runtime, owner: str, fail: str) -> None:
    job_id = submit(runtime, owner, {"token": "${{ secrets.RUN_TOKEN }}", "fail": fail})

    row = run(runtime, job_id)

    assert row.error is not None and "***" in row.error["message"]
    assert VALUE not in kept(runtime, job_id)


def test_a_param_that_looks_like_a_mark_is_not_revealed(runtime: Runtime, owner: str) -> None:
    forged = secret_mark("0" * 32, "RUN_TOKEN")
    with_ = {"token": "${{ secrets.RUN_TOKEN }}", "other": "${{ params.p }}"}
    job_id = submit(runtime, owner, with_, {"p": forged})
    SEEN.clear()

    assert run(runtime, job_id).status == "succeeded"

    assert [{"token": VALUE, "other": forged}] == SEEN


def test_a_secret_gone_since_submission_fails_the_step_for_good(
    runtime: Runtime, owner: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    job_id = submit(runtime, owner, {"token": "${{ secrets.RUN_TOKEN }}"})
    monkeypatch.delenv(f"FLOWBEAT_SECRET_{owner}__RUN_TOKEN")
    monkeypatch.delenv("FLOWBEAT_SECRET_RUN_TOKEN")

    row = run(runtime, job_id)

    assert row.status == "failed"
    assert row.error is not None and row.error["code"] == SecretNotFound.code
    assert row.error["details"] == {"secrets": ["RUN_TOKEN"]}


def test_a_step_without_secrets_claims_as_before(runtime: Runtime, owner: str) -> None:
    """No nonce, no owner lookup: the step path of a step that names no secret is unchanged."""
    from service.engine.claims import fast_claim
    from service.platform.clock import utcnow

    plain = submit(runtime, owner, {"token": "${{ params.p }}"})
    secret = submit(runtime, owner, {"token": "${{ secrets.RUN_TOKEN }}"})
    claims = []
    for job_id in (plain, secret):
        key = StepKey(job_id, "a")
        with runtime.claims.connect() as conn:
            fast = fast_claim(conn, key, task_id="t", lease_s=30, now=utcnow())
        assert fast is not None
        claims.append(ready_claim(key, fast))
    assert claims[0] is not None and claims[0].secret_nonce is None
    assert claims[1] is not None and claims[1].secret_nonce is not None
    assert VALUE not in repr(claims[1])
    for job_id in (plain, secret):
        run(runtime, job_id)


def test_each_item_of_a_fan_out_reveals_and_masks_on_its_own(runtime: Runtime, owner: str) -> None:
    each = {"for_each": {"items": "${{ params.items }}"}}
    with_ = {"token": "${{ secrets.RUN_TOKEN }}", "other": "${{ item }}"}
    job_id = submit(runtime, owner, with_, {"items": ["x", "y"]}, **each)
    key = StepKey(job_id, "a")
    SEEN.clear()

    assert isinstance(run_step(runtime, key, task_id=uuid.uuid4().hex), FannedOut)
    while run_lane(runtime, key, task_id=uuid.uuid4().hex):
        pass

    assert sorted(seen["other"] for seen in SEEN) == ["x", "y"]
    assert {seen["token"] for seen in SEEN} == {VALUE}
    with runtime.sessions() as session:
        outputs = session.scalars(
            select(StepRunRow.output).where(
                StepRunRow.job_id == job_id, StepRunRow.output.is_not(None)
            )
        ).all()
    assert len(outputs) == 2 and VALUE not in repr(outputs) + kept(runtime, job_id)
    assert all(output["token"] == "***" for output in outputs)
