"""The one shape of every maintenance loop (reaper, trimmer, sensor ticks ...):
a validated config, a ``run_once`` step that tests call directly, and a ``run``
loop that repeats it until stopped, surviving errors with backoff."""

from __future__ import annotations

import asyncio
import random
from abc import ABC, abstractmethod

from .errors import LedgerError, Unavailable
from .hub import Subscription

#: The longest pause after a pass that could not reach the database: the
#: server may be back any moment, and a wake-up (a hint, or the hub's
#: reconnect) cuts it short.
UNAVAILABLE_CAP_S = 2.0


def unavailable_pause(failures: int) -> float:
    """Jittered pause after ``failures`` consecutive passes that found the
    database unreachable: 0.25 s doubling, at most ``UNAVAILABLE_CAP_S``."""
    ceiling = min(UNAVAILABLE_CAP_S, 0.25 * 2.0 ** max(failures - 1, 0))
    return ceiling / 2 + random.uniform(0, ceiling / 2)
from .logs import get_logger


class Loop(ABC):
    """Subclasses set ``name`` and implement ``run_once``."""

    name: str = "loop"

    def __init__(self, interval_s: float, *, jitter: float = 0.1):
        if interval_s <= 0:
            raise ValueError(f"{self.name}: interval must be positive, not {interval_s}")
        self.interval_s = interval_s
        self.jitter = jitter
        self.log = get_logger(self.name)
        self.runs = 0
        self.failures = 0

    @abstractmethod
    async def run_once(self) -> int:
        """One pass; returns how much work it did (for logs and tests)."""

    def _pause(self) -> float:
        return self.interval_s * (1 + self.jitter * (2 * random.random() - 1))

    async def run(self, stop: asyncio.Event, wake: Subscription | None = None) -> None:
        """Repeat ``run_once`` every interval until ``stop`` is set -- sooner when
        ``wake`` (a hub subscription, taken before the first pass) fires. A
        pass that could not reach the database is retried after a short pause
        (``unavailable_pause``) that a wake-up cuts short; any other failing
        pass with growing delay, which a wake-up does not cut short. Nothing
        ends the loop but ``stop``."""
        while not stop.is_set():
            if wake is not None:
                wake.drain()  # the pass reads the rows those payloads point at
            woken = wake
            try:
                done = await self.run_once()
                self.runs += 1
                self.failures = 0
                if done:
                    self.log.info(f"{self.name} pass", work=done)
                delay = self._pause()
            except Unavailable as exc:
                self.failures += 1
                delay = unavailable_pause(self.failures)
                self.log.warning(f"{self.name} pass could not reach the database", error=exc.message,
                                 error_type=type(exc).__name__, retry_in_s=round(delay, 2))
            except (LedgerError, OSError) as exc:
                self.failures += 1
                delay = min(self.interval_s * 2 ** self.failures, 60.0)
                woken = None
                self.log.warning(f"{self.name} pass failed", error=str(exc), retry_in_s=round(delay, 2))
            else:
                self.log.debug(f"{self.name} idle", until_s=round(delay, 2))
            await idle(stop, woken, delay)


async def idle(stop: asyncio.Event, wake: Subscription | None, timeout: float) -> None:
    """Until ``stop`` is set, ``wake`` fires or ``timeout`` passes."""
    waiters: set[asyncio.Future[bool]] = {asyncio.ensure_future(stop.wait())}
    if wake is not None:
        waiters.add(asyncio.ensure_future(wake.wait(timeout)))
    try:
        await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()
        await asyncio.gather(*waiters, return_exceptions=True)
