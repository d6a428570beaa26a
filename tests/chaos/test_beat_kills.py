"""Three beat replicas and a schedule firing every second, the leader SIGKILLed again and
again (each replaced by a fresh replica, as a supervisor would): exactly one job per fire
time, no gap between fires beyond the lock's lifetime, every job succeeded."""

import itertools
import time
from collections.abc import Callable

import pytest

from service.platform.constants import QUEUE_STEPS
from tasks.queues import queue_lists
from tests.chaos.results import record, scaled
from tests.e2e.conftest import FINAL, Client, Cluster, wait_for
from tests.e2e.test_beat_drill import _fired_at_least, _jobs, _leader, _save

KILLS = scaled(ci=3, full=20)
OWNER = "chaos"
"""Not the beat drill's owner: both may run in one test process, on one database."""
LOCK_TTL_S = 3
EVERY_S = 1


def _two_more(client: Client) -> Callable[[], bool]:
    return _fired_at_least(client, len(_jobs(client, OWNER)) + 2, OWNER)


@pytest.mark.drill
@pytest.mark.timeout(scaled(ci=150, full=900))
def test_beat_leader_kills_neither_double_nor_miss_a_fire(client: Client, cluster: Cluster) -> None:
    client.broker.delete(*queue_lists(QUEUE_STEPS))
    cluster.worker()
    beats = [cluster.beat(beat_lock_ttl_s=str(LOCK_TTL_S)) for _ in range(3)]
    _save(client, OWNER, every=f"{EVERY_S}s", overlap="allow", params={"hold_s": 0})
    takeovers = []
    for _ in range(KILLS):
        wait_for(_two_more(client), 20, "two fires under this leader")
        leader = wait_for(lambda: _leader(client.broker, beats), 10, "a leader")
        killed_at = time.monotonic()
        leader.kill()
        beats.append(cluster.beat(beat_lock_ttl_s=str(LOCK_TTL_S)))
        wait_for(lambda: _leader(client.broker, beats), 2 * LOCK_TTL_S + 5, "a standby to lead")
        takeovers.append(time.monotonic() - killed_at)
    wait_for(_two_more(client), 20, "fires under the last leader")
    _save(client, OWNER, every=f"{EVERY_S}s", enabled=False)
    wait_for(lambda: all(s in FINAL for *_, s in _jobs(client, OWNER)), 60, "runs to finish")

    jobs = _jobs(client, OWNER)
    fires = [fire for fire, _, _ in jobs]
    gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(fires)]
    doubled = len(fires) - len(set(fires))
    lost = sum(status != "succeeded" for *_, status in jobs)
    record(
        "beat leader SIGKILLed, 3 replicas, a schedule every 1 s",
        f"{KILLS} leader kills; longest gap between fires {max(gaps):.1f} s",
        len(jobs),
        lost,
        doubled,
        takeovers,
    )
    assert doubled == 0, "a fire time got two jobs"
    assert lost == 0
    assert max(gaps) <= LOCK_TTL_S, f"missed fires: gaps {gaps}"
