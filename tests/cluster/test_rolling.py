"""A rolling restart of every host under load, as a deploy of a new version does it: one host
at a time, its main process sent SIGTERM (each drains: uvicorn finishes its requests, a worker
its running steps, beat frees its lock) and started again, the next host only once it is ready.
A client POSTs jobs all along and, like a load balancer, tries the other API host when one does
not answer; every job it got a 202 for must succeed, each step exactly once."""

import threading
import time
import uuid

import httpx
import pytest

from tests.chaos.executions import checkpoints, examine, executions
from tests.chaos.load import await_settled, lost_jobs, write_key
from tests.cluster.deployment import Deployment
from tests.cluster.results import record
from tests.cluster.steps import overlapping
from tests.e2e.conftest import Client, wait_for

RATE_PER_S = 2


class Load:
    """POSTs a chain job every ``1 / RATE_PER_S`` seconds, to each API host in turn, falling
    over to the other when one does not answer; keeps the accepted ids."""

    def __init__(self, urls: list[str], key: str) -> None:
        self.urls, self.key = urls, key
        self.accepted: list[uuid.UUID] = []
        self.failed_over = 0
        self.unanswered = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "Load":
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=60)

    def _run(self) -> None:
        body = {"pipeline": "chaos-chain", "params": {"hold_s": 0.1}}
        headers = {"Authorization": f"Bearer {self.key}"}
        turn = 0
        while not self._stop.is_set():
            turn += 1
            first, second = self.urls[turn % 2], self.urls[(turn + 1) % 2]
            for n, url in enumerate((first, second)):
                try:
                    answer = httpx.post(f"{url}/v1/jobs", json=body, headers=headers, timeout=10)
                except httpx.HTTPError:
                    continue
                if answer.status_code == 202:
                    self.accepted.append(uuid.UUID(answer.json()["job"]["id"]))
                    self.failed_over += n
                    break
            else:
                self.unanswered += 1
            self._stop.wait(1 / RATE_PER_S)


@pytest.mark.timeout(420)
def test_a_rolling_restart_of_every_host_under_load_loses_and_doubles_nothing(
    hosts: Deployment, reader: Client
) -> None:
    started = time.monotonic()
    order = [*hosts.apis, *hosts.workers, *hosts.beats]
    took: list[float] = []
    with Load([hosts.api_url(api) for api in hosts.apis], write_key(reader)) as load:
        wait_for(lambda: len(load.accepted) >= 4, 30, "the load to be flowing")
        for host in order:
            restart_at = time.monotonic()
            hosts.drain(host)
            hosts.start(host)
            took.append(time.monotonic() - restart_at)
        wait_for(lambda: len(load.accepted) >= 4 + len(order), 30, "jobs after the last restart")
    jobs = load.accepted
    done = await_settled(reader, jobs, 180)
    lost = lost_jobs(jobs, done)
    findings = examine(executions(reader.counters, jobs), checkpoints(reader, jobs), killed={})
    record(
        "a rolling restart of every host under load",
        f"{len(order)} hosts restarted one after another (SIGTERM, start, ready) while a client "
        f"POSTed {RATE_PER_S} jobs/s; {load.failed_over} POST(s) answered by the other API host, "
        f"{load.unanswered} by neither; recovery: a host's stop to its process ready again",
        jobs=len(jobs),
        lost=len(lost),
        doubled=findings.doubled,
        reruns=findings.reruns,
        recovery_s=took,
        started=started,
    )
    assert not lost, f"{len(lost)} jobs did not succeed"
    assert load.unanswered == 0, "a POST found neither API host answering"
    assert findings.concurrent == 0, (
        f"steps ran in two copies at once: {overlapping(executions(reader.counters, jobs))}"
    )
    findings.assert_exactly_once()
