"""A job runs as a canvas on real workers: every step once, in dependency order, recorded."""

import pytest

from tests.e2e.conftest import Client, Proc, wait_for

pytestmark = pytest.mark.usefixtures("shared_worker")


def test_a_dag_with_a_fan_out_runs_every_step_once_and_reports_its_result(client: Client) -> None:
    job_id = client.submit("dag", items=[3, 1, 2])
    view = client.wait_final(job_id)

    assert view.job.status == "succeeded", view.job.error
    assert view.job.result == {
        "items": [{"name": "fan", "value": v} for v in (3, 1, 2)],
        "key": "value",
        "count": 3,
    }
    steps = {s.step_id: s for s in view.steps}
    assert [s.status for s in steps.values()] == ["succeeded"] * 5
    assert steps["fan"].shards == {"total": 3, "succeeded": 3}
    for name, runs in {"start": 1, "left": 1, "right": 1, "fan": 3, "join": 1}.items():
        assert client.count(job_id, name) == runs, name
    assert client.checkpoints(job_id, "fan") == 4


def test_a_fan_out_leaves_no_result_key_in_redis(client: Client) -> None:
    before = set(client.broker.scan_iter("celery-task-meta-*"))

    view = client.wait_final(client.submit("dag", items=[1, 2, 3, 4]))

    assert view.job.status == "succeeded", view.job.error
    assert set(client.broker.scan_iter("celery-task-meta-*")) == before
    assert not list(client.broker.scan_iter("chord-unlock-*"))


def test_an_empty_fan_out_succeeds_with_an_empty_list(client: Client) -> None:
    view = client.wait_final(client.submit("dag", items=[]))

    assert view.job.status == "succeeded"
    assert view.job.result["items"] == []


def test_a_transient_failure_is_retried_until_it_succeeds(client: Client) -> None:
    job_id = client.submit("flaky", succeed_on=3)
    view = client.wait_final(job_id)

    assert view.job.status == "succeeded"
    assert client.steps(job_id)["flaky"].attempts == 3
    assert client.count(job_id, "after") == 1


def test_fail_fast_stops_the_job_when_retries_run_out(client: Client) -> None:
    job_id = client.submit("flaky", succeed_on=9)
    view = client.wait_final(job_id)

    assert view.job.status == "failed"
    assert view.job.error["details"]["step_id"] == "flaky"
    steps = client.steps(job_id)
    assert steps["flaky"].attempts == 3
    assert steps["flaky"].error["message"] == "transient"
    assert steps["after"].status == "cancelled"
    assert client.count(job_id, "after", "started") == 0


def test_best_effort_skips_only_what_depends_on_the_failure(client: Client) -> None:
    job_id = client.submit("policies")
    view = client.wait_final(job_id)

    steps = client.steps(job_id)
    assert steps["bad"].status == "failed" and steps["bad"].attempts == 1
    assert steps["after_bad"].status == "skipped"
    assert steps["after_good"].status == "succeeded"
    assert view.job.status == "succeeded"
    assert view.job.result["count"] == 2


def test_a_step_past_its_timeout_fails_with_a_timeout_error(client: Client) -> None:
    job_id = client.submit("timeout")
    view = client.wait_final(job_id, timeout_s=30)

    assert view.job.status == "failed"
    assert client.steps(job_id)["stuck"].error["code"] == "timeout"
    assert client.count(job_id, "never", "started") == 0


def test_a_fan_out_shard_past_its_timeout_fails_the_job_with_a_timeout_error(
    client: Client,
) -> None:
    """Quick shards share a lane's message; one that overruns is still cut at its timeout."""
    profile = {
        "name": "fan-timeout",
        "params": {"seconds": {"type": "array", "default": [0, 0, 10, 0]}},
        "steps": [
            {
                "id": "each",
                "action": "sleep",
                "timeout_s": 1,
                "for_each": {"items": "${{ params.seconds }}", "max_parallel": 1},
                "with": {"seconds": "${{ item }}"},
            }
        ],
    }
    job_id = client.submit(profile)
    view = client.wait_final(job_id, timeout_s=30)

    assert view.job.status == "failed"
    assert view.job.error is not None and view.job.error["code"] == "timeout"


def test_cancel_stops_a_running_step_and_nothing_after_it_runs(
    client: Client, shared_worker: Proc
) -> None:
    job_id = client.submit("slow", hold_s=60)
    wait_for(lambda: client.count(job_id, "slow", "started"), 30, "the slow step to start")
    client.cancel(job_id)

    view = client.wait_final(job_id)
    assert view.job.status == "cancelled"
    wait_for(lambda: client.steps(job_id)["slow"].status == "cancelled", 10, "step cancelled")
    assert client.count(job_id, "slow") == 0
    assert client.count(job_id, "after", "started") == 0


def test_a_fan_out_beside_another_step_joins_only_after_both(client: Client) -> None:
    job_id = client.submit("nested")
    view = client.wait_final(job_id)

    assert view.job.status == "succeeded", view.job.error
    join = view.job.result["join"]["value"]
    assert [shard["value"] for shard in join] == [1, 2, 3, 4]
    for name, runs in {"start": 1, "fan": 4, "beside": 1, "join": 1}.items():
        assert client.count(job_id, name) == runs, name


def test_a_job_whose_first_message_was_pushed_without_celery_runs_on_a_worker(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tasks.messages import direct_broker

    def refuse(*_: object) -> None:
        raise AssertionError("the first message went through Celery's publish")

    monkeypatch.setattr("tasks.dispatch.send_plan", refuse)
    assert direct_broker(client.app) is not None

    job_id = client.submit("flaky", succeed_on=1)
    view = client.wait_final(job_id)

    assert view.job.status == "succeeded", view.job.error
    assert client.count(job_id, "after") == 1
