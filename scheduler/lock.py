"""The beat leader lock, after RedBeat: one Redis key with a TTL, taken with SET NX PX, renewed
by its holder each tick through a compare-and-PEXPIRE script and deleted on shutdown through a
compare-and-DEL script. Comparing the token inside Redis makes renewal and release atomic, so a
replica whose lock lapsed and was taken over can never extend or delete the new leader's lock.
"""

import os
import socket
import uuid
from dataclasses import dataclass

import redis

_RENEW = """
if redis.call('get', KEYS[1]) == ARGV[1] then
  return redis.call('pexpire', KEYS[1], ARGV[2])
end
return 0
"""

_RELEASE = """
if redis.call('get', KEYS[1]) == ARGV[1] then
  return redis.call('del', KEYS[1])
end
return 0
"""


def make_token() -> str:
    """Who holds the lock: host and pid for operators, a random part so restarts differ."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:12]}"


@dataclass(frozen=True)
class LockState:
    holder: str | None
    ttl_ms: int


class LeaderLock:
    def __init__(self, client: redis.Redis, key: str, ttl_s: float, token: str) -> None:
        self.client = client
        self.key = key
        self.ttl_ms = max(1, int(ttl_s * 1000))
        self.token = token
        self.held = False
        self._renew = client.register_script(_RENEW)
        self._release = client.register_script(_RELEASE)

    def hold(self) -> bool:
        """Renew the lock if this replica holds it, else try to take it. True when leader."""
        if self.held and self._renew(keys=[self.key], args=[self.token, self.ttl_ms]) == 1:
            return True
        self.held = bool(self.client.set(self.key, self.token, nx=True, px=self.ttl_ms))
        return self.held

    def release(self) -> None:
        if self.held:
            self._release(keys=[self.key], args=[self.token])
            self.held = False


def inspect(client: redis.Redis, key: str) -> LockState:
    with client.pipeline() as pipe:
        pipe.get(key)
        pipe.pttl(key)
        raw, ttl_ms = pipe.execute()
    holder = raw.decode() if isinstance(raw, bytes) else None
    return LockState(holder=holder, ttl_ms=int(ttl_ms) if holder else -2)
