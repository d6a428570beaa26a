"""The leader lock: one holder, renewed and released only by that holder, taken over on lapse."""

import uuid
from collections.abc import Iterator

import pytest
import redis

from scheduler.lock import LeaderLock, inspect, make_token
from tests.conftest import Stack
from tests.e2e.conftest import wait_for


@pytest.fixture
def client(stack: Stack) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(stack.broker_url)
    yield client
    client.close()


@pytest.fixture
def key() -> str:
    return f"test:leader:{uuid.uuid4().hex}"


def test_only_one_replica_holds_the_lock_and_renews_it(client: redis.Redis, key: str) -> None:
    first = LeaderLock(client, key, 5, make_token())
    second = LeaderLock(client, key, 5, make_token())
    assert first.hold() and not second.hold()
    client.pexpire(key, 1000)
    assert first.hold()
    assert client.pttl(key) > 1000
    assert inspect(client, key).holder == first.token


def test_a_lapsed_lock_is_taken_over_and_the_old_holder_cannot_renew_or_release_it(
    client: redis.Redis, key: str
) -> None:
    old = LeaderLock(client, key, 0.3, make_token())
    new = LeaderLock(client, key, 5, make_token())
    assert old.hold()
    wait_for(new.hold, 5, "the standby to take the lapsed lock")

    assert not old.hold()
    old.held = True
    old.release()
    assert inspect(client, key).holder == new.token


def test_release_on_shutdown_frees_the_lock_at_once(client: redis.Redis, key: str) -> None:
    leader = LeaderLock(client, key, 30, make_token())
    assert leader.hold()
    leader.release()
    state = inspect(client, key)
    assert (state.holder, state.ttl_ms) == (None, -2)
    assert LeaderLock(client, key, 30, make_token()).hold()
