"""A Sentinel broker URL is read as kombu reads it, refused at start when it cannot work, and
every client of the broker's Redis is made for the primary the sentinels name."""

import asyncio

import pytest
import redis
import redis.asyncio
import redis.asyncio.sentinel
import redis.sentinel
from pydantic import ValidationError

from service.platform.brokers import (
    BrokerAddress,
    SentinelUrl,
    async_redis_client,
    parse_sentinel_url,
    redis_client,
)
from service.platform.settings import Settings

SENTINELS = "sentinel://:s%40cret@10.0.0.1:26379;sentinel://10.0.0.2:26380/2;sentinel://10.0.0.3"


def test_a_sentinel_url_names_each_sentinel_and_the_primarys_database_and_password() -> None:
    parsed = parse_sentinel_url(SENTINELS)
    assert parsed == SentinelUrl(
        (("10.0.0.1", 26379), ("10.0.0.2", 26380), ("10.0.0.3", 26379)), 2, None, "s@cret"
    )


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("sentinel://a:1/1;sentinel://b:2/2", "different databases"),
        ("sentinel://:x@a:1;sentinel://:y@b:2", "different databases or passwords"),
        ("sentinel://a:1;redis://b:2", "expected sentinel://host:port"),
        ("sentinel://:1", "expected sentinel://host:port"),
        ("sentinel://a:1/zero", "must be a number"),
        ("sentinel://a:port", "not a number"),
        ("sentinel://;", "expected sentinel://host:port"),
    ],
)
def test_a_sentinel_url_that_cannot_work_says_why(url: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        parse_sentinel_url(url)


def test_celery_gets_the_primarys_database_and_password_on_every_sentinel() -> None:
    """kombu and Celery read them from the first part, and switch parts on failure."""
    url = BrokerAddress(SENTINELS, "main").celery_url()
    assert url == (
        "sentinel://:s%40cret@10.0.0.1:26379/2;sentinel://:s%40cret@10.0.0.2:26380/2;"
        "sentinel://:s%40cret@10.0.0.3:26379/2"
    )
    assert BrokerAddress("redis://h:6379/4").celery_url() == "redis://h:6379/4"


def test_the_transport_options_name_the_master_and_give_the_sentinels_timeouts() -> None:
    assert BrokerAddress("redis://h:6379/0").transport_options(5.0) == {}
    options = BrokerAddress(SENTINELS, "main").transport_options(5.0)
    assert options == {
        "master_name": "main",
        "sentinel_kwargs": {"socket_timeout": 5.0, "socket_connect_timeout": 5.0},
    }
    guarded = BrokerAddress(SENTINELS, "main", "pw").transport_options(5.0)
    assert guarded["sentinel_kwargs"]["password"] == "pw"


def test_a_sentinel_url_without_the_masters_name_is_a_settings_error() -> None:
    with pytest.raises(ValidationError, match="broker_sentinel_master\n  Value error, required"):
        Settings(broker_url=SENTINELS, database_url="postgresql://x/y")


def test_a_sentinel_url_that_does_not_parse_is_a_settings_error() -> None:
    with pytest.raises(ValidationError, match="the database must be a number"):
        Settings(broker_url="sentinel://a:1/x", broker_sentinel_master="main")


def test_the_settings_give_the_broker_with_its_master_and_the_sentinels_password() -> None:
    settings = Settings(
        broker_url=SENTINELS, broker_sentinel_master="main", broker_sentinel_password="pw"
    )
    assert settings.broker() == BrokerAddress(SENTINELS, "main", "pw")
    assert "pw" not in repr(settings.broker())


def test_a_plain_url_gets_a_plain_client() -> None:
    client = redis_client("redis://127.0.0.1:6379/3", socket_timeout=2)
    try:
        assert type(client.connection_pool) is redis.ConnectionPool
        assert client.connection_pool.connection_kwargs["db"] == 3
    finally:
        client.close()


def test_a_sentinel_url_gets_a_client_of_the_primary_the_sentinels_name() -> None:
    """Made without connecting: each connection asks the sentinels where the primary is."""
    client = redis_client(BrokerAddress(SENTINELS, "main", "pw"), socket_timeout=2)
    try:
        pool = client.connection_pool
        assert isinstance(pool, redis.sentinel.SentinelConnectionPool)
        assert pool.service_name == "main" and pool.is_master
        assert pool.connection_kwargs["db"] == 2
        assert pool.connection_kwargs["password"] == "s@cret"
        assert pool.connection_kwargs["socket_timeout"] == 2
        sentinels = pool.sentinel_manager.sentinels
        kwargs = [s.connection_pool.connection_kwargs for s in sentinels]
        assert [(k["host"], k["port"]) for k in kwargs] == [
            ("10.0.0.1", 26379),
            ("10.0.0.2", 26380),
            ("10.0.0.3", 26379),
        ]
        assert all(k["password"] == "pw" and k["socket_timeout"] == 2 for k in kwargs)
    finally:
        client.close()


def test_an_event_loop_gets_the_same_choice() -> None:
    async def made() -> tuple[object, object]:
        plain = async_redis_client("redis://127.0.0.1:6379/3")
        sentinel = async_redis_client(BrokerAddress(SENTINELS, "main"))
        pools = plain.connection_pool, sentinel.connection_pool
        await plain.aclose()
        await sentinel.aclose()
        return pools

    plain, sentinel = asyncio.run(made())
    assert type(plain) is redis.asyncio.ConnectionPool
    assert isinstance(sentinel, redis.asyncio.sentinel.SentinelConnectionPool)
    assert sentinel.service_name == "main"


def test_a_sentinel_client_without_the_masters_name_is_refused() -> None:
    with pytest.raises(ValueError, match="FLOWBEAT_BROKER_SENTINEL_MASTER"):
        redis_client(SENTINELS)


def test_a_username_alone_is_kept_on_every_sentinel() -> None:
    url = BrokerAddress("sentinel://flow@a:1;sentinel://b:2", "main").celery_url()
    assert url == "sentinel://flow:@a:1/0;sentinel://flow:@b:2/0"
