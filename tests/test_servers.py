"""Redis DB numbers are claimed exclusively, test databases are created and dropped, and a run
deletes the side-effect counters of its own jobs, never another run's."""

from __future__ import annotations

import os
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from multiprocessing import get_context

import psycopg
import pytest
import redis
from sqlalchemy.engine import make_url

from tests.support.servers import (
    CLAIM_PREFIX,
    REDIS_DBS,
    admin_database_url,
    allocate_redis_db,
    create_test_database,
    drop_counters,
    drop_test_database,
    held_db,
    redis_base_url,
    redis_db_url,
    release_redis_db,
    run_jobs_key,
)


def _owner(label: str) -> str:
    return f"{label}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def _claim_in_child(redis_url: str) -> int:
    return allocate_redis_db(redis_url, _owner("child"))


def _release_all(redis_url: str, claims: dict[int, str]) -> None:
    for number, owner in claims.items():
        release_redis_db(redis_url, number, owner)


@pytest.mark.e2e  # spawns processes that claim together
def test_concurrent_claims_never_share_a_number() -> None:
    base = redis_base_url()
    owners = [_owner(f"thread{i}") for i in range(6)]
    with ThreadPoolExecutor(max_workers=6) as pool:
        numbers = list(pool.map(lambda owner: allocate_redis_db(base, owner), owners))
    claims = dict(zip(numbers, owners, strict=True))
    try:
        assert len(set(numbers)) == len(numbers)
        assert all(number in REDIS_DBS for number in numbers)
        with get_context("spawn").Pool(2) as processes:
            children = processes.map(_claim_in_child, [base, base])
        control = redis.Redis.from_url(redis_db_url(base, 0), decode_responses=True)
        for number in children:
            claims[number] = str(control.get(f"{CLAIM_PREFIX}{number}"))
        control.close()
        assert len(claims) == len(numbers) + len(children)
    finally:
        _release_all(base, claims)


def test_claimed_db_starts_empty_and_is_flushed_on_release() -> None:
    base = redis_base_url()
    owner = _owner("flush")
    number = allocate_redis_db(base, owner)
    db = redis.Redis.from_url(redis_db_url(base, number))
    control = redis.Redis.from_url(redis_db_url(base, 0))
    try:
        assert db.dbsize() == 0
        db.set("leftover", "1")
        assert control.get(f"{CLAIM_PREFIX}{number}") == owner.encode()
        assert 0 < control.ttl(f"{CLAIM_PREFIX}{number}") <= 1800
    finally:
        release_redis_db(base, number, owner)
    assert db.dbsize() == 0
    assert control.get(f"{CLAIM_PREFIX}{number}") is None
    db.close()
    control.close()


def test_release_by_a_stranger_leaves_the_claim_and_data_alone() -> None:
    base = redis_base_url()
    owner = _owner("holder")
    number = allocate_redis_db(base, owner)
    db = redis.Redis.from_url(redis_db_url(base, number))
    other = _owner("other")
    second: int | None = None
    try:
        db.set("mine", "1")
        release_redis_db(base, number, _owner("stranger"))
        assert db.get("mine") == b"1"
        second = allocate_redis_db(base, other)
        assert second != number
    finally:
        release_redis_db(base, number, owner)
        if second is not None:
            release_redis_db(base, second, other)
        db.close()


def test_create_and_drop_database_with_open_session() -> None:
    admin = admin_database_url()
    name = f"flowbeat_test_{uuid.uuid4().hex[:10]}"
    url = create_test_database(admin, name)
    assert url.startswith("postgresql+psycopg://")
    assert make_url(url).database == name
    libpq = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    lingering = psycopg.connect(libpq)
    try:
        assert lingering.execute("SELECT current_database()").fetchone() == (name,)
        drop_test_database(admin, name)
    finally:
        lingering.close()
    with psycopg.connect(
        make_url(admin).set(drivername="postgresql").render_as_string(hide_password=False)
    ) as conn:
        row = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
    assert row is None


def test_a_run_drops_the_counters_of_its_own_jobs_and_no_others() -> None:
    base = redis_base_url()
    run = _owner("run")
    stored, pruned, theirs = (str(uuid.uuid4()) for _ in range(3))
    keys = {
        job: [f"drill:{job}:a:started", f"drill:{job}:a:pid", f"chaos:{job}:b:-1"]
        for job in (stored, pruned, theirs)
    }
    db0 = redis.Redis.from_url(redis_db_url(base, 0))
    try:
        for key in keys[stored] + keys[pruned] + keys[theirs]:
            db0.set(key, 1, ex=600)
        db0.sadd(run_jobs_key(run), stored, pruned, str(uuid.uuid4()))
        assert drop_counters(base, run) == 6
        assert db0.exists(*keys[stored], *keys[pruned], run_jobs_key(run)) == 0
        assert db0.exists(*keys[theirs]) == 3
    finally:
        db0.delete(*keys[theirs])
        db0.close()


def test_a_claim_held_by_a_live_run_outlives_its_expiry_and_lapses_once_let_go() -> None:
    """A full-scale chaos run lasts longer than the claim's half hour; a claim that lapsed
    under it would hand its DB, flushed, to the next run, beside the first one's workers."""
    base = redis_base_url()
    owner = _owner("long")
    number = allocate_redis_db(base, owner)
    control = redis.Redis.from_url(redis_db_url(base, 0))
    key = f"{CLAIM_PREFIX}{number}"
    try:
        control.expire(key, 2)
        with held_db(base, number, owner, ttl_s=2):
            time.sleep(3)
            assert control.get(key) == owner.encode()
        deadline = time.monotonic() + 5
        while control.get(key) is not None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert control.get(key) is None
    finally:
        release_redis_db(base, number, owner)
        control.close()
