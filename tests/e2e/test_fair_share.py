"""Fair share on real workers and beat: one owner's backlog delays another owner's job by a
turn, not by the backlog."""

from tests.e2e.conftest import Client, Cluster

ONE_STEP = {
    "name": "turns",
    "steps": [{"id": "call", "action": "drill.count", "with": {"name": "call", "hold_s": 0.2}}],
}
AHEAD = 2


def test_another_owners_job_finishes_before_the_first_owners_twelfth(
    client: Client, cluster: Cluster
) -> None:
    """Fair share counts every job sent and not started in the database, so it runs where the
    cluster fixture has ended every job earlier tests of this process left open."""
    cluster.beat(fair_share_ahead=str(AHEAD))
    backlog = [
        client.submit_at(None, ONE_STEP, owner="big", fair_share_ahead=AHEAD) for _ in range(40)
    ]
    small = client.submit_at(None, ONE_STEP, owner="small", fair_share_ahead=AHEAD)
    assert client.view(small).job.waiting_for == "turn"
    cluster.worker(concurrency=1, fair_share_ahead=str(AHEAD))

    small_done = client.wait_final(small, timeout_s=60).job
    assert small_done.status == "succeeded"
    twelfth = client.wait_final(backlog[11], timeout_s=60).job
    assert small_done.finished_at < twelfth.finished_at
    for job in backlog:
        assert client.wait_final(job, timeout_s=90).job.status == "succeeded"
