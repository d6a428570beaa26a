"""Sagas on a real worker: what succeeded is undone, latest first, once, whatever fails."""

import uuid
from typing import Any

import pytest

from service.engine.filters import JobFilter
from service.engine.jobs import list_jobs
from service.platform.db import unit_of_work
from tests.e2e.conftest import Client, wait_for

pytestmark = pytest.mark.usefixtures("shared_worker")


def saga(
    *,
    fail_last: bool = True,
    undo_fails: str = "",
    undo_hangs: str = "",
    hold_s: float = 0.0,
    **profile: Any,
) -> dict[str, Any]:
    """extract -> transform -> load, each undone by drill.undo; load fails when told to, and
    the undo named by ``undo_hangs`` holds on past its one-second timeout."""
    steps: list[dict[str, Any]] = []
    for index, name in enumerate(["extract", "transform"]):
        steps.append(
            {
                "id": name,
                "action": "drill.count",
                "depends_on": ["extract"] if index else [],
                "with": {"name": name},
                "compensate": {
                    "action": "drill.undo",
                    "with": {
                        "name": f"undo-{name}",
                        "fail": name == undo_fails,
                        "hold_s": 10 if name == undo_hangs else hold_s,
                    },
                    "retry": {"attempts": 1},
                    "timeout_s": 1 if name == undo_hangs else 300,
                },
            }
        )
    load = {"message": "load failed", "retryable": False} if fail_last else {"seconds": 5}
    steps.append(
        {
            "id": "load",
            "action": "fail" if fail_last else "sleep",
            "depends_on": ["transform"],
            "with": load,
        }
    )
    return {"name": "etl", "steps": steps, **profile}


def _order(client: Client, job_id: uuid.UUID) -> list[str]:
    raw = client.counters.lrange(f"drill:{job_id}:undo-order", 0, -1)
    return [value.decode() if isinstance(value, bytes) else value for value in raw]


def _compensated(client: Client, job_id: uuid.UUID) -> Any:
    return wait_for(
        lambda: (c := client.view(job_id).compensation) and c["status"] != "running" and c,
        30,
        "the compensations to finish",
    )


def test_a_step_failing_for_good_undoes_the_others_latest_first_once(client: Client) -> None:
    job_id = client.submit(saga())
    assert client.wait_final(job_id).job.status == "failed"
    compensation = _compensated(client, job_id)

    assert compensation["status"] == "completed"
    assert [(s["step_id"], s["status"]) for s in compensation["steps"]] == [
        ("transform", "compensated"),
        ("extract", "compensated"),
    ]
    assert _order(client, job_id) == ["undo-transform", "undo-extract"]
    key = client.counters.get(f"drill:{job_id}:undo-extract:key")
    assert key == f"{job_id}:extract:compensate".encode()


def test_a_compensation_failing_for_good_flags_the_job_and_the_others_still_run(
    client: Client,
) -> None:
    job_id = client.submit(saga(undo_fails="transform"))
    compensation = _compensated(client, job_id)

    assert compensation["status"] == "failed"
    assert [s["status"] for s in compensation["steps"]] == ["compensation_failed", "compensated"]
    assert _order(client, job_id) == ["undo-transform", "undo-extract"]
    with unit_of_work(client.rt.sessions) as session:
        flagged, _ = list_jobs(
            session, owner=None, limit=200, match=JobFilter(compensation_failed=True)
        )
    assert job_id in [job.id for job in flagged]


def test_a_compensation_past_its_timeout_is_stopped_failed_for_good_and_the_others_still_run(
    client: Client,
) -> None:
    job_id = client.submit(saga(undo_hangs="transform"))
    compensation = _compensated(client, job_id)

    transform, extract = compensation["steps"]
    assert compensation["status"] == "failed"
    assert (transform["status"], transform["error"]["code"]) == ("compensation_failed", "timeout")
    assert extract["status"] == "compensated"
    assert client.count(job_id, "undo-transform", "started") == 1
    assert client.count(job_id, "undo-transform") == 0


@pytest.mark.parametrize(("on_cancel", "undone"), [("compensate", True), ("leave", False)])
def test_cancelling_a_job_compensates_unless_told_to_leave_it(
    client: Client, on_cancel: str, undone: bool
) -> None:
    job_id = client.submit(saga(fail_last=False, on_cancel=on_cancel))
    wait_for(lambda: client.steps(job_id)["load"].status == "running", 30, "the load to start")

    client.cancel(job_id)

    if undone:
        assert _compensated(client, job_id)["status"] == "completed"
        assert _order(client, job_id) == ["undo-transform", "undo-extract"]
    else:
        assert client.view(job_id).compensation is None
        assert _order(client, job_id) == []
