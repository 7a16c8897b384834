"""The one shape of every runtime service.

A service has a ``name``, a ``run_once`` step that tests (and ``--once``)
call directly, and ``run(stop)``, which works until ``stop`` is set and then
returns. Its options are checked when it is built, so a bad option is a
``ConfigError``/``ValueError`` before anything connects. ``ledger.runtime.host``
runs services; ``Loop`` is the base of the periodic ones (reaper, verifier,
dispatcher, gc collector, journal trimmer).
"""

from __future__ import annotations

import asyncio
import random
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from ledger.backoff import backoff
from ledger.db.hub import NullHub, Subscription, WakeSource
from ledger.errors import LedgerError, Unavailable
from ledger.logs import get_logger

if TYPE_CHECKING:
    from ledger.runtime.registry import Registration

#: The pause after passes that could not reach the database starts here and
#: stops here: the server may be back any moment, and a wake-up (a hint, or
#: the hub's reconnect) cuts it short.
UNAVAILABLE_BASE_S = 0.25
UNAVAILABLE_CAP_S = 2.0
#: Any other failing pass waits longer and longer, up to this.
FAILING_CAP_S = 60.0


@runtime_checkable
class Service(Protocol):
    """What the host runs."""

    name: str

    async def run_once(self) -> int:
        """One unit of work now; returns how much was done."""
        ...  # pragma: no cover

    async def run(self, stop: asyncio.Event) -> object:
        """Work until ``stop`` is set, then return. Transient failures (the
        database away, a target down) are survived inside; an exception that
        escapes is a defect, and the host's policy decides what follows."""
        ...  # pragma: no cover


class Stopped(Exception):
    """``stop`` was set while a pass was in flight and the pass was given up
    (``Loop.unless_stopped``); the loop ends."""


class Loop(ABC):
    """A periodic service: ``run_once`` every ``interval_s`` (jittered) until
    stopped -- sooner when the hub wakes it on ``wake_channel``.

    A pass that could not reach the database is retried after a short pause
    that a wake-up cuts short; a pass that failed with one of ``survives``
    after a growing one that it does not. Anything else escapes ``run`` to the
    host. Subclasses set ``name`` and implement ``run_once``.
    """

    name: str = "loop"
    #: the hub channel whose notifications start a pass early (None: none)
    wake_channel: str | None = None
    #: what a failing pass may raise without ending the loop
    survives: tuple[type[BaseException], ...] = (LedgerError, OSError)

    def __init__(self, interval_s: float, *, jitter: float = 0.1, hub: WakeSource | None = None):
        if not interval_s > 0:
            raise ValueError(f"{self.name}: interval must be positive, not {interval_s}")
        if not 0 <= jitter < 1:
            raise ValueError(f"{self.name}: jitter must be in [0, 1), not {jitter}")
        self.interval_s = interval_s
        self.jitter = jitter
        self.hub: WakeSource = hub or NullHub()
        self.log = get_logger(self.name)
        self.runs = 0
        self.failures = 0
        #: this service's row in the registry of processes (set by a service
        #: that acts as a role; kept fresh while ``run`` runs)
        self.registration: Registration | None = None

    @abstractmethod
    async def run_once(self) -> int:
        """One pass; returns how much work it did (for logs and tests)."""

    async def one_pass(self, stop: asyncio.Event) -> int:
        """What ``run`` does each time: ``run_once``; a loop whose pass must
        end when ``stop`` is set wraps it in ``unless_stopped``."""
        return await self.run_once()

    def _pause(self) -> float:
        return self.interval_s * (1 + self.jitter * (2 * random.random() - 1))

    async def run(self, stop: asyncio.Event) -> None:
        """Repeat the pass until ``stop`` is set (see the class)."""
        if self.registration is None:
            await self._run(stop)
            return
        async with self.registration.kept(stop):
            await self._run(stop)

    async def _run(self, stop: asyncio.Event) -> None:
        if self.wake_channel is None:
            await self._repeat(stop, None)
            return
        # Subscribe before the first pass, so a wake-up during a pass is kept.
        with self.hub.subscribe(self.wake_channel) as wake:
            await self._repeat(stop, wake)

    async def _repeat(self, stop: asyncio.Event, wake: Subscription | None) -> None:
        while not stop.is_set():
            if wake is not None:
                wake.drain()  # the pass reads the rows those payloads point at
            woken = wake
            try:
                done = await self.one_pass(stop)
                self.runs += 1
                self.failures = 0
                if done:
                    self.log.info(f"{self.name} pass", work=done)
                delay = self._pause()
            except Stopped:
                self.log.debug(f"{self.name} stopped mid-pass")
                return
            except Unavailable as exc:
                self.failures += 1
                delay = backoff(self.failures, base_s=UNAVAILABLE_BASE_S, cap_s=UNAVAILABLE_CAP_S)
                self.log.warning(f"{self.name} pass could not reach the database", error=exc.message,
                                 error_type=type(exc).__name__, retry_in_s=round(delay, 2))
            except self.survives as exc:
                self.failures += 1
                delay = backoff(self.failures, base_s=2 * self.interval_s,
                                cap_s=FAILING_CAP_S, jitter=0)
                woken = None
                self.log.warning(f"{self.name} pass failed", error=str(exc),
                                 error_type=type(exc).__name__, retry_in_s=round(delay, 2),
                                 exc_info=not isinstance(exc, LedgerError))
            else:
                self.log.debug(f"{self.name} idle", until_s=round(delay, 2))
            await idle(stop, woken, delay)

    @staticmethod
    async def unless_stopped(work: asyncio.Future[int] | asyncio.Task[int], stop: asyncio.Event) -> int:
        """Await ``work``, cancelling it (and raising ``Stopped``) if ``stop`` is set first."""
        stopper = asyncio.ensure_future(stop.wait())
        both: list[asyncio.Future[Any]] = [work, stopper]
        try:
            await asyncio.wait(both, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopper.cancel()
            if not work.done():
                work.cancel()
            await asyncio.gather(work, stopper, return_exceptions=True)
        if work.cancelled():
            raise Stopped
        return work.result()


async def idle(stop: asyncio.Event, wake: Subscription | None, timeout: float) -> None:
    """Until ``stop`` is set, ``wake`` fires or ``timeout`` passes."""
    waiters: set[asyncio.Future[Any]] = {asyncio.ensure_future(stop.wait())}
    if wake is not None:
        waiters.add(asyncio.ensure_future(wake.wait(timeout)))
    try:
        await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()
        await asyncio.gather(*waiters, return_exceptions=True)
