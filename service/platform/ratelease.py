"""A process's lease of a few units of a shared window, so most requests need no round trip.

The window (``service.platform.ratelimit``) stays the one shared limit: a process takes up to
``units`` of it in one grant, as one atomic script call, and spends them on its own requests
until they are spent or the window they were granted in has passed, when Redis has dropped
them anyway. It holds at most one lease of a key at a time and asks for the next only once it
is spent, with one ask in flight however many requests wait for it. Requests that arrive while
it is in flight and find it spent ask together for as many units as they are, or ``units`` if
more, so a burst costs two round trips, not one a request; what they take at once is spent at
once, so no more than ``units`` wait in a lease.

The tolerance, in any window of ``window_s`` seconds, with ``P`` processes leasing ``k``:

- at most ``limit + P * k`` requests are let through: the grants of the window are at most
  ``limit``, as before, and besides them only units granted earlier and not yet spent, at most
  ``k`` a process, can be spent in it;
- a request is refused only when the window is full and at most ``P * k`` of its units wait
  unspent in leases, the refusing process's own included, which it spends first.

``k = 1`` is the exact per-request limit. Units unspent when a process stops are given back.
"""

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from service.platform.ratelimit import Ask, AsyncRateLimiter, unit_members

Grant = Callable[[Ask], Awaitable[tuple[int, float]]]
"""Sends one ask to the window: ``(units granted, grant time)``, or ``(0, seconds to wait)``."""


@dataclass
class Lease:
    """Units of one grant, spent by this process alone until its window has passed."""

    member: str
    granted: int
    expires_at: float
    spent: int = 0

    def take(self, now: float) -> bool:
        if self.spent >= self.granted or now >= self.expires_at:
            return False
        self.spent += 1
        return True

    def unspent(self, now: float) -> list[str]:
        """The members still in the window that no request used; none once it has passed."""
        if now >= self.expires_at:
            return []
        return unit_members(self.member, self.spent + 1, self.granted)


class LeasedLimit:
    """One limit in one process: requests spend its lease; a spent lease is renewed once."""

    def __init__(
        self,
        limiter: AsyncRateLimiter,
        units: int,
        grant: Grant,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limiter = limiter
        self.units = units
        self._grant = grant
        self._clock = clock
        self.lease: Lease | None = None
        self._renewal: asyncio.Future[tuple[int, float]] | None = None
        self._waiting = 0

    async def acquire(self) -> tuple[bool, float]:
        """``(True, 0)`` for a unit of this process's lease, or ``(False, seconds to wait)``
        when the window has none left for it."""
        while True:
            if self.lease is not None and self.lease.take(self._clock()):
                return True, 0.0
            self._waiting += 1
            try:
                if self._renewal is None:
                    wanted = max(self.units, self._waiting)
                    self._renewal = asyncio.ensure_future(self._renew(wanted))
                granted, wait_s = await asyncio.shield(self._renewal)
            finally:
                self._waiting -= 1
            if not granted:
                return False, wait_s

    async def _renew(self, units: int) -> tuple[int, float]:
        """The window is counted from the grant, which Redis makes after this moment: a lease
        that expires a window after it is never spent after Redis has dropped its units."""
        asked_at = self._clock()
        ask = Ask(self.limiter, units)
        try:
            granted, value = await self._grant(ask)
        finally:
            self._renewal = None
        if granted:
            self.lease = Lease(ask.member, granted, asked_at + self.limiter.window_s)
        return granted, value

    def unspent(self) -> list[str]:
        return [] if self.lease is None else self.lease.unspent(self._clock())
