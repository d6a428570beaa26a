"""Fair share on real workers and beat: one owner's backlog delays another owner's job by a
turn, not by the backlog, and an owner's urgent job passes that owner's own backlog."""

from tests.e2e.conftest import Client, Cluster
from tests.support.overtaking import post_backlog_then_urgent, started_before

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


FEW_AHEAD = "4"
SLOW = {
    "name": "urgent-or-not",
    "steps": [{"id": "call", "action": "drill.count", "with": {"name": "call", "hold_s": 0.5}}],
}


def test_a_priority_9_job_held_back_for_its_turn_passes_its_owners_backlog(
    client: Client, cluster: Cluster
) -> None:
    """As an operator runs it: fair share on the API, the beat and the worker, the jobs
    posted while no worker runs, so the backlog and the urgent job are held back for their
    turn; within the owner's turn the urgent one goes first."""
    base = cluster.api(fair_share_ahead=FEW_AHEAD)
    cluster.beat(fair_share_ahead=FEW_AHEAD)
    low, urgent = post_backlog_then_urgent(client, base, SLOW)
    assert client.view(urgent).job.waiting_for == "turn"

    cluster.worker(concurrency=1, fair_share_ahead=FEW_AHEAD)

    ahead = started_before(client, low, urgent, "call")
    assert len(ahead) <= 2, f"{len(ahead)} of {len(low)} low-priority jobs started first"
