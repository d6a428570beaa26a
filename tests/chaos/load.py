"""Load for the chaos scenarios: jobs POSTed to a live API at a steady rate, and what became
of them, read from PostgreSQL."""

import http.client
import json
import threading
import time
import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from tests.e2e.conftest import FINAL, Client, Proc

RATE_PER_S = 8


class Poster:
    """POSTs chain jobs until stopped; keeps the ids of the accepted (202) ones and the status
    and error code of every refusal (``0`` when the connection itself failed)."""

    def __init__(self, base: str, key: str) -> None:
        self.base, self.key = base, key
        self.accepted: list[uuid.UUID] = []
        self.refused: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "Poster":
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=60)

    def _run(self) -> None:
        host, port = self.base.removeprefix("http://").split(":")
        body = json.dumps({"pipeline": "chaos-chain", "params": {"hold_s": 0.1}}).encode()
        headers = {"Authorization": f"Bearer {self.key}", "Content-Type": "application/json"}
        while not self._stop.is_set():
            conn = http.client.HTTPConnection(host, int(port), timeout=30)
            try:
                conn.request("POST", "/v1/jobs", body=body, headers=headers)
                answer = conn.getresponse()
                text = answer.read()
                if answer.status == 202:
                    self.accepted.append(uuid.UUID(json.loads(text)["job"]["id"]))
                else:
                    code = json.loads(text).get("error", {}).get("code", "")
                    self.refused.append(f"{answer.status} {code}")
            except (OSError, http.client.HTTPException, ValueError):
                self.refused.append("0")
            finally:
                conn.close()
            self._stop.wait(1 / RATE_PER_S)


Finished = dict[uuid.UUID, tuple[str, float | None]]


def finished(client: Client, job_ids: list[uuid.UUID]) -> Finished:
    """Each job's status and when it finished (epoch seconds)."""
    from sqlalchemy import select

    from service.platform.db import unit_of_work
    from service.platform.models import JobRow

    with unit_of_work(client.rt.sessions) as session:
        rows = session.execute(
            select(JobRow.id, JobRow.status, JobRow.finished_at).where(JobRow.id.in_(job_ids))
        )
        return {i: (s, f.timestamp() if f else None) for i, s, f in rows}


def lost_jobs(accepted: list[uuid.UUID], done: Finished) -> list[uuid.UUID]:
    """Accepted jobs that did not succeed, or that the database no longer has at all (a commit
    it forgot): either way, jobs the system took and did not do."""
    return [job for job in accepted if done.get(job, ("forgotten", None))[0] != "succeeded"]


def await_settled(
    client: Client, job_ids: list[uuid.UUID], timeout_s: float, procs: Sequence[Proc] = ()
) -> Finished:
    """Wait for every job to reach a final state; on timeout, fail naming each unfinished job
    with its dispatch time and the state of each of its steps, which is what tells a lost
    message from a slow queue, and the end of the log of any of ``procs`` that exited."""
    deadline = time.monotonic() + timeout_s
    while True:
        done = finished(client, job_ids)
        if all(status in FINAL for status, _ in done.values()):
            return done
        if time.monotonic() > deadline:
            open_jobs = [job for job, (status, _) in done.items() if status not in FINAL]
            exited = [
                f"{proc.log.name} exited with {proc.popen.returncode}:\n{proc.output()[-3000:]}"
                for proc in procs
                if proc.popen.poll() is not None
            ]
            raise AssertionError(
                f"timed out after {timeout_s}s waiting for every accepted job to finish; "
                f"{len(open_jobs)} of {len(job_ids)} still open:\n{describe(client, open_jobs)}"
                + "".join(f"\n{text}" for text in exited)
            )
        time.sleep(0.2)


def describe(client: Client, job_ids: list[uuid.UUID]) -> str:
    """One line per job: status, creation and last dispatch, then each step's row."""
    from sqlalchemy import select

    from service.platform.db import unit_of_work
    from service.platform.models import JobRow, StepRunRow

    def at(moment: datetime | None) -> str:
        return moment.strftime("%H:%M:%S.%f")[:-3] if moment else "-"

    lines = []
    with unit_of_work(client.rt.sessions) as session:
        jobs = session.scalars(select(JobRow).where(JobRow.id.in_(job_ids)).order_by(JobRow.id))
        for job in jobs:
            steps = session.scalars(
                select(StepRunRow).where(StepRunRow.job_id == job.id).order_by(StepRunRow.id)
            )
            rows = ", ".join(
                f"{s.step_id}{'' if s.shard < 0 else f'[{s.shard}]'}={s.status}#{s.attempts} "
                f"started {at(s.started_at)} finished {at(s.finished_at)} "
                f"lease {at(s.lease_until)}{_code(s.error)}"
                for s in steps
            )
            lines.append(
                f"{job.id} {job.pipeline} {job.status}{_code(job.error)} "
                f"created {at(job.created_at)} dispatched {at(job.dispatched_at)}: {rows}"
            )
    return "\n".join(lines)


def _code(error: dict[str, Any] | None) -> str:
    return f" ({error.get('code')}: {error.get('message')})" if error else ""


def first_finish_after(done: Finished, moments: list[float]) -> list[float]:
    """For each moment, how long until the next job finished after it."""
    ends = sorted(f for _, f in done.values() if f is not None)
    return [min(f for f in ends if f > m) - m for m in moments if ends and ends[-1] > m]


def write_key(client: Client) -> str:
    from service.platform.auth import create_api_key
    from service.platform.db import unit_of_work

    with unit_of_work(client.rt.sessions) as session:
        key, _ = create_api_key(session, owner="tests", scopes=["write"])
    return key
