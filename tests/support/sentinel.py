"""A Redis primary, its replica and three sentinels of a test's own, on loopback, for failover
drills: ``redis-server --sentinel`` is the sentinel Debian's ``redis-sentinel`` package runs."""

import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

import redis

from tests.e2e.conftest import wait_for

MASTER = "flowbeat"
SENTINELS = 3
QUORUM = 2
DOWN_AFTER_MS = 1000
FAILOVER_TIMEOUT_MS = 5000
TIMEOUT_S = 1.0
PROMOTABLE = "100"
"""Redis's default replica priority."""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _server(argv: list[str], log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(argv, stdout=log.open("wb"), stderr=subprocess.STDOUT)


def _answers(port: int) -> bool:
    try:
        with redis.Redis(port=port, socket_timeout=TIMEOUT_S) as client:
            return bool(client.ping())
    except redis.RedisError:
        return False


def _promotable(replica: dict[str, Any], port: int) -> bool:
    return bool(
        replica["port"] == port
        and not replica["is_sdown"]
        and int(replica.get("slave-priority", 0)) == int(PROMOTABLE)
    )


class SentinelGroup:
    """The servers run until ``stop``; each sentinel writes its own conf file, as a sentinel
    must (it records what it learns there)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.servers: dict[int, subprocess.Popen[bytes]] = {}
        self.primary = self.replica = self.down = 0
        self.sentinels: list[int] = []
        self.started: list[int] = []

    def start(self) -> None:
        self.primary = self._redis()
        self.replica = self._redis("--replicaof", "127.0.0.1", str(self.primary))
        wait_for(self._replicating, 20, "the replica to sync with the primary")
        self.sentinels = [self._sentinel() for _ in range(SENTINELS)]
        wait_for(self._watched, 20, "every sentinel to see the replica and its peers")

    def _redis(self, *extra: str, port: int | None = None) -> int:
        """A server in a directory of its own, new at each start: a replica writes the RDB of
        its full sync there, which a server started again in it would load and resume from."""
        port = port or _free_port()
        home = self.directory / f"redis-{port}-{len(self.started)}"
        home.mkdir()
        self.started.append(port)
        argv = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", ""]
        argv += ["--appendonly", "no", "--dir", str(home), *extra]
        self.servers[port] = _server(argv, home / "redis.log")
        wait_for(lambda: _answers(port), 10, f"redis-server on {port}")
        return port

    def _sentinel(self) -> int:
        port = _free_port()
        conf = self.directory / f"sentinel-{port}.conf"
        conf.write_text(
            f"port {port}\nbind 127.0.0.1\ndir {self.directory}\n"
            f"sentinel monitor {MASTER} 127.0.0.1 {self.primary} {QUORUM}\n"
            f"sentinel down-after-milliseconds {MASTER} {DOWN_AFTER_MS}\n"
            f"sentinel failover-timeout {MASTER} {FAILOVER_TIMEOUT_MS}\n"
        )
        argv = ["redis-server", str(conf), "--sentinel"]
        self.servers[port] = _server(argv, self.directory / f"sentinel-{port}.log")
        wait_for(lambda: _answers(port), 10, f"the sentinel on {port}")
        return port

    def _replicating(self) -> bool:
        with redis.Redis(port=self.replica, socket_timeout=TIMEOUT_S) as client:
            info = client.info("replication")
        return bool(info.get("master_link_status") == "up")

    def _watched(self) -> bool:
        """Every sentinel knows its peers and a replica it does not think down."""
        for port in self.sentinels:
            with redis.Redis(port=port, socket_timeout=TIMEOUT_S) as sentinel:
                master = cast(dict[str, Any], sentinel.sentinel_master(MASTER))
                replicas = cast(list[dict[str, Any]], sentinel.sentinel_slaves(MASTER))
            if master["num-other-sentinels"] < SENTINELS - 1:
                return False
            if not any(_promotable(r, self.replica) for r in replicas):
                return False
        return True

    @property
    def url(self) -> str:
        """kombu's form, with the database on the first sentinel's part only."""
        first, *others = self.sentinels
        return ";".join(
            [
                f"sentinel://127.0.0.1:{first}/0",
                *(f"sentinel://127.0.0.1:{port}" for port in others),
            ]
        )

    def kill_primary(self) -> float:
        """SIGKILL the primary the sentinels agree on (on a busy machine they may have failed
        over on their own, taking a slow answer for a death); when it died (epoch seconds)."""
        self.primary = wait_for(self._agreed_primary, 20, "the sentinels to agree on a primary")
        self.replica = next(
            port for port in self.servers if port not in (self.primary, *self.sentinels)
        )
        proc = self.servers.pop(self.primary)
        proc.kill()
        proc.wait(timeout=10)
        self.down = self.primary
        return time.time()

    def _agreed_primary(self) -> int | None:
        named = {self._named_by(port) for port in self.sentinels}
        if len(named) != 1:
            return None
        port = named.pop()
        return port if port is not None and self._is_primary(port) else None

    def _is_primary(self, port: int) -> bool:
        if port not in self.servers:
            return False
        with redis.Redis(port=port, socket_timeout=TIMEOUT_S) as client:
            return bool(client.info("replication").get("role") == "master")

    def revive(self) -> None:
        """The killed primary started again, empty, as the primary's replica; returns once it
        is in sync and every sentinel counts it a healthy replica, so that the next failover
        has it to promote. It starts with priority 0, which no sentinel promotes: one that
        took the new primary for dead meanwhile would otherwise promote an empty replica."""
        self.replica = self._redis(
            "--replicaof", "127.0.0.1", str(self.primary), "--replica-priority", "0", port=self.down
        )
        wait_for(self._replicating, 20, "the revived server to sync with the primary")
        with redis.Redis(port=self.replica, socket_timeout=TIMEOUT_S) as client:
            client.config_set("replica-priority", PROMOTABLE)
        wait_for(self._watched, 30, "every sentinel to see the revived replica, promotable")

    def await_failover(self, timeout_s: float) -> float:
        """Wait until every sentinel names the replica and it takes writes; when (epoch s)."""

        def promoted() -> bool:
            named = {self._named_by(port) for port in self.sentinels}
            return named == {self.replica} and self._is_primary(self.replica)

        wait_for(promoted, timeout_s, "the sentinels to promote the replica")
        self.primary = self.replica
        return time.time()

    def _named_by(self, sentinel: int) -> int | None:
        try:
            with redis.Redis(port=sentinel, socket_timeout=TIMEOUT_S) as client:
                address = client.sentinel_get_master_addr_by_name(MASTER)
        except redis.RedisError:
            return None
        return int(address[1]) if isinstance(address, tuple) else None

    def stop(self) -> None:
        for proc in self.servers.values():
            proc.kill()
            proc.wait(timeout=10)
        self.servers.clear()


@contextmanager
def sentinel_group(directory: Path) -> Iterator[SentinelGroup]:
    group = SentinelGroup(directory)
    try:
        group.start()
        yield group
    finally:
        group.stop()
