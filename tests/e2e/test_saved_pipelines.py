"""A saved pipeline re-run on real workers runs its current version, and says which one."""

import uuid

import pytest

from service.catalogue.saving import save_pipeline
from service.platform.db import unit_of_work
from service.platform.models import JobRow
from tests.e2e.conftest import Client

pytestmark = pytest.mark.usefixtures("shared_worker")


def search(name: str, term: str) -> str:
    year = "${{ params.year }}"
    return (
        f"name: {name}\n"
        "params:\n  year: {type: integer, default: 2024}\n"
        "steps:\n"
        f"  - {{id: search, action: noop, with: {{term: {term}, year: '{year}'}}}}\n"
    )


def test_a_saved_search_reruns_its_newest_version(client: Client) -> None:
    name = f"search-{uuid.uuid4().hex[:8]}"

    def save(term: str) -> None:
        with unit_of_work(client.rt.sessions) as session:
            save_pipeline(
                session,
                owner="tests",
                name=name,
                body=search(name, term),
                settings=client.settings,
                known_actions=client.rt.registry.names(),
            )

    save("propofol")
    first = client.wait_final(client.submit(name, year=2025))
    save("remimazolam")
    second = client.wait_final(client.submit(name))

    assert (first.job.status, second.job.status) == ("succeeded", "succeeded")
    with client.rt.sessions() as session:
        ran = [session.get(JobRow, view.job.id) for view in (first, second)]
    assert [(job.pipeline_version, job.params) for job in ran if job] == [
        (1, {"year": 2025}),
        (2, {"year": 2024}),
    ]
    assert [job.profile["steps"][0]["with"]["term"] for job in ran if job] == [
        "propofol",
        "remimazolam",
    ]
