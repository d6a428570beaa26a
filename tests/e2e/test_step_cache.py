"""The step cache on real workers: a job run twice with the same params runs its cached
step's action once, the second job's step showing ``cached`` with the job and step it came
from (in its view and in its event log); another param value, another owner, ``refresh`` or
a lapsed TTL run the action again. A fan-out's items are cached one by one. The Python client
reads a step's source and asks for a refresh through a live API process."""

import time
import uuid
from typing import Any

import pytest

from flowbeat_client import Client as ApiClient
from service.engine.events import events_after
from service.platform.auth import create_api_key
from service.platform.db import unit_of_work
from tests.e2e.conftest import Client, Cluster

pytestmark = pytest.mark.usefixtures("shared_worker")


def _profile(ttl_s: int = 3600) -> dict[str, Any]:
    return {
        "name": f"cached-{uuid.uuid4().hex[:6]}",
        "params": {"topic": {"type": "string"}},
        "steps": [
            {
                "id": "fetch",
                "action": "drill.count",
                "with": {"name": "fetch", "value": "${{ params.topic }}"},
                "cache": {"ttl_s": ttl_s},
            },
            {
                "id": "report",
                "action": "drill.count",
                "with": {"name": "report", "value": "${{ steps.fetch.output.value }}"},
                "depends_on": ["fetch"],
            },
        ],
    }


def _run(client: Client, profile: dict[str, Any], topic: str, **given: Any) -> Any:
    view = client.wait_final(client.submit_at(None, profile, topic=topic, **given))
    assert view.job.status == "succeeded", view.job.error
    return view


def _fetched(client: Client, view: Any) -> int:
    return client.count(view.job.id, "fetch", "started")


def test_the_same_params_run_the_cached_action_once_and_name_its_source(client: Client) -> None:
    profile, topic = _profile(), f"t-{uuid.uuid4().hex[:6]}"
    first = _run(client, profile, topic)
    second = _run(client, profile, topic)

    assert (_fetched(client, first), _fetched(client, second)) == (1, 0)
    steps = {step.step_id: step for step in second.steps}
    assert steps["fetch"].status == "cached"
    assert steps["fetch"].cached_from == {"job_id": str(first.job.id), "step_id": "fetch"}
    assert steps["report"].status == "succeeded"
    assert client.count(second.job.id, "report", "started") == 1
    assert second.job.result == first.job.result
    with unit_of_work(client.rt.sessions) as session:
        log = events_after(session, second.job.id, 0)
    [event] = [event.data for event in log if event.kind == "step.cached"]
    assert event["cached_from"] == {"job_id": str(first.job.id), "step_id": "fetch"}


def test_another_param_value_another_owner_or_refresh_run_the_action_again(
    client: Client,
) -> None:
    profile, topic = _profile(), f"t-{uuid.uuid4().hex[:6]}"
    runs = [
        _run(client, profile, topic),
        _run(client, profile, f"{topic}-other"),
        _run(client, profile, topic, owner=f"other-{uuid.uuid4().hex[:6]}"),
        _run(client, profile, topic, refresh=True),
        _run(client, profile, topic),
    ]

    assert [_fetched(client, view) for view in runs] == [1, 1, 1, 1, 0]
    last = {step.step_id: step for step in runs[-1].steps}["fetch"]
    assert last.cached_from == {"job_id": str(runs[3].job.id), "step_id": "fetch"}, (
        "a refreshed run caches its output anew"
    )


def test_after_the_ttl_the_action_runs_again(client: Client) -> None:
    profile, topic = _profile(ttl_s=1), f"t-{uuid.uuid4().hex[:6]}"
    first = _run(client, profile, topic)
    lapse = first.job.finished_at.timestamp() + 1.5 - time.time()
    time.sleep(max(lapse, 0.0))
    second = _run(client, profile, topic)

    assert (_fetched(client, first), _fetched(client, second)) == (1, 1)


def test_a_fan_out_takes_the_items_it_has_seen_from_the_cache(client: Client) -> None:
    tag = uuid.uuid4().hex[:6]
    profile = {
        "name": f"cached-fan-{tag}",
        "params": {"items": {"type": "array"}},
        "steps": [
            {
                "id": "each",
                "action": "drill.count",
                "for_each": {"items": "${{ params.items }}"},
                "with": {"name": "each-${{ item }}", "value": "${{ item }}"},
                "cache": {"ttl_s": 3600},
            }
        ],
    }
    first = client.wait_final(client.submit(profile, items=[f"{tag}-1", f"{tag}-2"]))
    second = client.wait_final(client.submit(profile, items=[f"{tag}-1", f"{tag}-3"]))

    assert (first.job.status, second.job.status) == ("succeeded", "succeeded")
    ran = {item: client.count(second.job.id, f"each-{tag}-{item}", "started") for item in (1, 3)}
    assert ran == {1: 0, 3: 1}
    assert second.steps[0].shards == {"total": 2, "cached": 1, "succeeded": 1}
    assert second.job.result["each"] == [
        {"name": f"each-{tag}-1", "value": f"{tag}-1"},
        {"name": f"each-{tag}-3", "value": f"{tag}-3"},
    ]


def test_the_client_reads_a_cached_steps_source_and_asks_for_a_refresh(
    cluster: Cluster, client: Client
) -> None:
    with unit_of_work(client.rt.sessions) as session:
        key, _ = create_api_key(session, owner=f"sc-{uuid.uuid4().hex[:6]}", scopes=["write"])
    profile, params = _profile(), {"topic": f"t-{uuid.uuid4().hex[:6]}"}
    with ApiClient(cluster.api(), key) as api:
        first = api.jobs.wait(api.jobs.create(profile, params)["id"], timeout_s=60)
        second = api.jobs.wait(api.jobs.create(profile, params)["id"], timeout_s=60)
        again = api.jobs.create(profile, params, refresh=True)
        refreshed = api.jobs.wait(again["id"], timeout_s=60)

    assert second["steps"][0]["status"] == "cached"
    assert second["steps"][0]["cached_from"] == {"job_id": first["id"], "step_id": "fetch"}
    assert refreshed["steps"][0]["status"] == "succeeded"
