"""A worker told to stop (SIGTERM, as a rolling restart sends it) stops within seconds, and
gives back what it took, however often it is stopped.

Each round stops a worker that runs a step and has a free slot, so its ``BRPOP`` is blocked
on Redis when the warm shutdown begins; a sweep (a control message) is sent once the worker
has stopped consuming, while its pool still runs the step. Before, that ``BRPOP`` popped the
sweep, and the worker held it unseen until it closed its connection after the pool drained
("Requeuing undeliverable message for queue 'flowbeat.control'"), handing it back only
through another channel still open.
"""

import os
import signal
import subprocess
import time
from typing import cast

import pytest
import redis

from service.platform.constants import QUEUE_CONTROL, TASK_SWEEP, WORKERS_KEY
from tests.e2e.conftest import Client, Cluster, Proc, wait_for

ROUNDS = 12
"""On today's main about one stop in three popped the sweep."""
HOLD_S = 1.0
STOP_TIMEOUT_S = 15.0
"""What the test stack, ``flowbeat dev`` and ``flowbeat run`` give a worker before SIGKILL."""
STOP_BOUND_S = STOP_TIMEOUT_S / 2
UNDELIVERABLE = "Requeuing undeliverable message"


def _blocked_brpop(broker: redis.Redis, db: int) -> bool:
    return any(
        peer.get("cmd") == "brpop" and "b" in peer.get("flags", "") and peer.get("db") == str(db)
        for peer in broker.client_list()
    )


def _stopped_consuming(broker: redis.Redis, worker: Proc) -> bool:
    """The worker's liveness step wrote its heartbeat of zero, which it does right after its
    consumer stopped taking messages."""
    beats = cast(list[tuple[bytes, float]], broker.zrange(WORKERS_KEY, 0, -1, withscores=True))
    return any(f":{worker.popen.pid}:" in name.decode() and not beat for name, beat in beats)


def _stop_holding_a_step_and_a_sweep(client: Client, cluster: Cluster, db: int) -> float:
    """One round: how long the worker took to exit from its SIGTERM (the stop timeout and
    more where it had to be killed)."""
    client.broker.delete(QUEUE_CONTROL)
    worker = cluster.worker(concurrency=2)
    job = client.submit("slow", hold_s=HOLD_S)
    wait_for(lambda: client.count(job, "slow", "started"), 30, "the slow step")
    wait_for(lambda: _blocked_brpop(client.broker, db), 10, "the free slot's BRPOP")
    started = time.monotonic()
    os.kill(worker.popen.pid, signal.SIGTERM)
    wait_for(lambda: _stopped_consuming(client.broker, worker), 10, "the consumer to stop")
    client.app.send_task(TASK_SWEEP)
    try:
        worker.popen.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        worker.kill()
    return time.monotonic() - started


@pytest.mark.timeout(600)
def test_a_worker_holding_a_step_and_a_sweep_stops_promptly_every_time(
    client: Client, cluster: Cluster
) -> None:
    db = int(client.settings.require_broker_url().rsplit("/", 1)[1])
    stops: list[float] = []
    kept: list[int] = []
    for _ in range(ROUNDS):
        stops.append(_stop_holding_a_step_and_a_sweep(client, cluster, db))
        kept.append(int(client.broker.llen(QUEUE_CONTROL)))

    spread = f"stops (s): {sorted(round(s, 2) for s in stops)}"
    print(spread)
    taken = sum(UNDELIVERABLE in proc.output() for proc in cluster.procs)
    assert taken == 0, f"{taken} of {ROUNDS} stopped workers popped the sweep; {spread}"
    assert kept == [1] * ROUNDS, f"the sweep left in its queue, by round: {kept}; {spread}"
    assert max(stops) <= STOP_BOUND_S, spread
