"""A key's request limit shared by two live API processes that each lease units of its window:
hammered through both at once, the key gets no more than its burst plus the stated tolerance
(processes x lease) in any window, and every refusal is the same 429 as before."""

import threading
import time
import uuid
from dataclasses import dataclass

import httpx
import redis

from service.platform.auth import create_api_key
from service.platform.constants import RATE_LIMIT_KEY_PREFIX
from service.platform.db import unit_of_work
from tests.conftest import Stack
from tests.e2e.conftest import Client, Cluster

PER_S = 25
BURST = 100
LEASE = 5
APIS = 2
CLIENTS_PER_API = 4
HAMMER_S = 9.0
WINDOW_S = BURST / PER_S
TOLERANCE = APIS * LEASE


@dataclass(frozen=True)
class Answer:
    sent: float
    received: float
    status: int
    code: str | None
    retry_after: str | None


def _hammer(base: str, key: str, until: float, out: list[Answer], lock: threading.Lock) -> None:
    """A cheap authenticated request: a job that does not exist is a 404 once let through."""
    headers = {"Authorization": f"Bearer {key}"}
    with httpx.Client(base_url=base, headers=headers, timeout=30) as http:
        while time.monotonic() < until:
            sent = time.monotonic()
            answer = http.get(f"/v1/jobs/{uuid.uuid4()}")
            received = time.monotonic()
            refused = answer.status_code == 429
            code = answer.json()["error"]["code"] if refused else None
            retry_after = answer.headers.get("Retry-After") if refused else None
            got = Answer(sent, received, answer.status_code, code, retry_after)
            with lock:
                out.append(got)


def _most_surely_in_one_window(admitted: list[Answer], window_s: float) -> int:
    """A request was let through between its sending and its answer, so those sent and
    answered within one window were certainly let through in it: their count can only
    understate the window's, however slow some answers were."""
    starts = sorted(a.sent for a in admitted)
    return max(
        sum(1 for a in admitted if start <= a.sent and a.received <= start + window_s)
        for start in starts
    )


def test_two_api_processes_leasing_one_keys_window_stay_within_the_stated_tolerance(
    cluster: Cluster, client: Client, stack: Stack
) -> None:
    limits = {"rate_limit_per_s": str(PER_S), "rate_limit_burst": str(BURST)}
    bases = [cluster.api(**limits, rate_limit_lease=str(LEASE)) for _ in range(APIS)]
    with unit_of_work(client.rt.sessions) as session:
        key, row = create_api_key(
            session, owner=f"e2e-rate-{uuid.uuid4().hex[:6]}", scopes={"read"}
        )
    answers: list[Answer] = []
    lock = threading.Lock()
    until = time.monotonic() + HAMMER_S
    threads = [
        threading.Thread(target=_hammer, args=(base, key, until, answers, lock))
        for base in bases
        for _ in range(CLIENTS_PER_API)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    admitted = [a for a in answers if a.status == 404]
    refused = [a for a in answers if a.status == 429]
    assert len(admitted) + len(refused) == len(answers)
    assert _most_surely_in_one_window(admitted, WINDOW_S) <= BURST + TOLERANCE
    assert len(admitted) >= BURST
    assert refused, "the hammering never reached the limit"
    assert {a.code for a in refused} == {"rate_limited"}
    assert all(a.retry_after is not None and int(a.retry_after) >= 1 for a in refused)
    window = redis.Redis.from_url(stack.broker_url)
    members = window.zrange(f"{RATE_LIMIT_KEY_PREFIX}api-key:{row.id}", 0, -1)
    names = [member.decode() for member in members if isinstance(member, bytes)]
    assert any(name.endswith(f":{LEASE}") for name in names), f"no lease of {LEASE} units"
