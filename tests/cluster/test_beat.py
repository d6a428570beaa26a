"""The beat leader's host cut off from Redis while it still reaches PostgreSQL, with a schedule
firing every second: the leader cannot renew its lock, the other beat host takes it once it
expires, and each fire time gets exactly one job, the ``schedule_fires`` fence refusing any
fire the cut-off leader attempts before it notices (``service/triggers/firing.py``)."""

import itertools
import time
from collections.abc import Callable

import pytest

from tests.cluster.deployment import BEAT_LOCK_TTL_S, Deployment
from tests.cluster.results import record
from tests.e2e.conftest import FINAL, Client, Proc, wait_for
from tests.e2e.test_beat_drill import _jobs, _leader, _save

OWNER = "cluster"
TAKEN = "was already taken"
"""What a scheduler logs when the fence refuses its fire."""


def _more_fires(client: Client, n: int) -> Callable[[], bool]:
    target = len(_jobs(client, OWNER)) + n
    return lambda: len(_jobs(client, OWNER)) >= target


@pytest.mark.timeout(180)
def test_the_beat_leader_cut_off_from_redis_fires_nothing_twice(
    hosts: Deployment, reader: Client
) -> None:
    started = time.monotonic()
    beats = [hosts.procs[host.name] for host in hosts.beats]
    _save(reader, OWNER, every="1s", overlap="allow", params={"hold_s": 0})
    wait_for(_more_fires(reader, 2), 30, "two fires under the first leader")
    leader: Proc = wait_for(lambda: _leader(reader.broker, beats), 10, "a leader")
    host = hosts.beats[beats.index(leader)]
    hosts.net.partition(host, [hosts.redis_address])
    cut_at = time.monotonic()
    standby = wait_for(
        lambda: (p := _leader(reader.broker, beats)) is not None and p is not leader and p,
        3 * BEAT_LOCK_TTL_S + 10,
        "the other beat host to lead",
    )
    takeover_s = time.monotonic() - cut_at
    wait_for(_more_fires(reader, 3), 30, "three fires under the new leader")
    hosts.net.heal()
    wait_for(_more_fires(reader, 2), 30, "fires after the heal")
    assert _leader(reader.broker, beats) is standby, "the healed host took the lock back"
    _save(reader, OWNER, every="1s", enabled=False)
    wait_for(lambda: all(s in FINAL for *_, s in _jobs(reader, OWNER)), 60, "runs to finish")

    jobs = _jobs(reader, OWNER)
    fires = [fire for fire, _, _ in jobs]
    gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(fires)]
    doubled = len(fires) - len(set(fires))
    lost = sum(status != "succeeded" for *_, status in jobs)
    refused = leader.output().count(TAKEN)
    record(
        "the beat leader's host cut off from Redis, keeping PostgreSQL",
        f"beat leader partitioned from Redis until the other beat host led and fired 3 times "
        f"(lock TTL {BEAT_LOCK_TTL_S} s, a schedule every 1 s), then healed; longest gap "
        f"between fire times {max(gaps):.1f} s; {refused} fire(s) of the cut-off leader "
        "refused by the fence",
        jobs=len(jobs),
        lost=lost,
        doubled=doubled,
        reruns=0,
        recovery_s=[takeover_s],
        started=started,
    )
    assert doubled == 0, "a fire time got two jobs"
    assert lost == 0
    assert max(gaps) <= BEAT_LOCK_TTL_S, f"missed fires: gaps {gaps}"
