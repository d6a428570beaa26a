"""A Redis server of their own, SIGKILLed and started again empty (no persistence) again and
again while jobs are POSTed to the API: every job the API accepted succeeds.

The broker's messages, the beat lock and the chord counters vanish with each restart; the
sweeper notices the empty broker (its epoch key is gone) and sends every open job again, and
a step that was running meanwhile finishes under its lease. A POST that meets the outage is
refused with 503 and is not counted as accepted."""

import http.client
import json
import random
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.chaos.executions import examine, executions
from tests.chaos.results import record, scaled
from tests.e2e.conftest import FINAL, Client, Cluster, wait_for

RESTARTS = scaled(ci=3, full=20)
RATE_PER_S = 8
QUICK = {"sweep_interval_s": "1", "lease_s": "4", "dispatch_grace_s": "2", "stall_after_s": "15"}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class RedisServer:
    def __init__(self, directory: Path) -> None:
        self.port = _free_port()
        self.directory = directory
        self.proc = self._start()

    def _start(self) -> subprocess.Popen[bytes]:
        argv = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", ""]
        argv += ["--appendonly", "no", "--dir", str(self.directory)]
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for(self._answers, 10, "redis-server to answer")
        return proc

    def _answers(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as sock:
                sock.sendall(b"PING\r\n")
                return sock.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def restart(self) -> float:
        """Kill it and start it again, empty; returns when it answers again."""
        self.proc.kill()
        self.proc.wait(timeout=10)
        self.proc = self._start()
        return time.time()

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=10)


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path)
    yield server
    server.stop()


def _poster(
    base: str, key: str, accepted: list[uuid.UUID], refused: list[int], stop: threading.Event
) -> None:
    host, port = base.removeprefix("http://").split(":")
    body = json.dumps({"pipeline": "chaos-chain", "params": {"hold_s": 0.1}}).encode()
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    while not stop.is_set():
        conn = http.client.HTTPConnection(host, int(port), timeout=30)
        try:
            conn.request("POST", "/v1/jobs", body=body, headers=headers)
            answer = conn.getresponse()
            text = answer.read()
            if answer.status == 202:
                accepted.append(uuid.UUID(json.loads(text)["job"]["id"]))
            else:
                refused.append(answer.status)
        except (OSError, http.client.HTTPException):
            refused.append(0)
        finally:
            conn.close()
        stop.wait(1 / RATE_PER_S)


Finished = dict[uuid.UUID, tuple[str, float | None]]


def _finished(client: Client, job_ids: list[uuid.UUID]) -> Finished:
    from sqlalchemy import select

    from service.db import unit_of_work
    from service.models import JobRow

    with unit_of_work(client.rt.sessions) as session:
        rows = session.execute(
            select(JobRow.id, JobRow.status, JobRow.finished_at).where(JobRow.id.in_(job_ids))
        )
        return {i: (s, f.timestamp() if f else None) for i, s, f in rows}


def _write_key(client: Client) -> str:
    from service.auth import create_api_key
    from service.db import unit_of_work

    with unit_of_work(client.rt.sessions) as session:
        key, _ = create_api_key(session, owner="tests", scopes=["write"])
    return key


@pytest.mark.drill
@pytest.mark.timeout(scaled(ci=180, full=1800))
def test_redis_restarted_empty_under_load_loses_no_accepted_job(
    client: Client, cluster: Cluster, private_redis: RedisServer
) -> None:
    rng = random.Random(11)
    cluster.env["DRILL_REDIS_URL"] = cluster.stack.broker_url.rsplit("/", 1)[0] + "/0"
    settings = {"broker_url": f"redis://127.0.0.1:{private_redis.port}/0", **QUICK}
    base = cluster.api(**settings)
    cluster.beat(**settings)
    cluster.worker(concurrency=2, **settings)
    accepted: list[uuid.UUID] = []
    refused: list[int] = []
    stop = threading.Event()
    poster = threading.Thread(
        target=_poster, args=(base, _write_key(client), accepted, refused, stop), daemon=True
    )
    poster.start()
    restarts = []
    for _ in range(RESTARTS):
        time.sleep(rng.uniform(2.0, 4.0))
        restarts.append(private_redis.restart())
    time.sleep(2.0)
    stop.set()
    poster.join(timeout=30)

    def settled() -> bool:
        return all(s in FINAL for s, _ in _finished(client, accepted).values())

    wait_for(settled, scaled(ci=90, full=600), "every accepted job to finish")
    finished = _finished(client, accepted)
    lost = [job for job, (status, _) in finished.items() if status != "succeeded"]
    findings = examine(executions(client.counters, accepted), {})
    ends = sorted(f for _, f in finished.values() if f is not None)
    recovery = [min(f for f in ends if f > up) - up for up in restarts if ends and ends[-1] > up]
    record(
        "Redis SIGKILLed and restarted empty under load",
        f"{RESTARTS} restarts, {len(refused)} POSTs refused meanwhile",
        len(accepted),
        len(lost),
        findings.completed_twice + findings.concurrent,
        recovery,
    )
    assert accepted and not lost, f"{len(lost)} accepted jobs did not succeed"
    assert findings.concurrent == 0 and findings.completed_twice == 0
    assert len(recovery) == RESTARTS
    assert set(refused) <= {0, 503}, refused
