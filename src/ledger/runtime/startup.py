"""Waiting to start: what a long-running service does when its host or its
configuration is not ready for it, instead of dying and being restarted.

The design at length: docs/internals.md (``ledger.runtime.startup``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

import structlog

from ledger.backoff import backoff
from ledger.errors import (
    CodeTooOld,
    ConfigError,
    DatabaseMissing,
    LedgerError,
    LoginRefused,
    NotMigrated,
    SchemaMismatch,
)
from ledger.logs import get_logger

if TYPE_CHECKING:
    from ledger.db.database import Database
    from ledger.runtime.registry import Registration
    from ledger.runtime.service import Service

T = TypeVar("T")

#: The errors a long-running service waits out: a cause of its host or its
#: configuration, which a restart would only meet again.
FAULTS: tuple[type[LedgerError], ...] = (ConfigError, LoginRefused, DatabaseMissing, NotMigrated,
                                         SchemaMismatch)
#: The first re-check comes after this; each next one waits twice as long ...
RECHECK_BASE_S = 0.5
#: ... up to this: a cause fixed is noticed within half a minute.
RECHECK_CAP_S = 30.0
#: How often a process that waits to start says so to the registry.
REPORT_INTERVAL_S = 10.0


def fault_of(exc: BaseException) -> LedgerError | None:
    """The start-up fault ``exc`` is (looking inside exception groups), or ``None``."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    # (code older than the schema serves waits for nothing: only a newer Ledger here mends it)
    return exc if isinstance(exc, FAULTS) and not isinstance(exc, CodeTooOld) else None


def cause(error: LedgerError) -> str:
    """The one line that says a fault: its cause, and its fix."""
    line = " ".join(error.message.split())
    if error.hint:
        line = f"{line} (hint: {' '.join(error.hint.split())})"
    return line[:1000]


@dataclass
class Readiness:
    """What this process waits on to start, by part (``/readyz`` with ``--health``)."""

    waiting: dict[str, str] = field(default_factory=dict)
    #: whether its services run (set by the host)
    serving: bool = False

    @property
    def ready(self) -> bool:
        return self.serving and not self.waiting

    def reasons(self) -> list[str]:
        """Why it is not ready (empty: it is)."""
        if not self.serving and not self.waiting:
            return ["starting"]
        return [f"{part}: {line}" for part, line in sorted(self.waiting.items())]


#: The process's readiness (one process, one answer).
READINESS = Readiness()


class Waiter:
    """One part's wait for its start-up faults to go (see the module)."""

    def __init__(self, part: str, *, log: structlog.stdlib.BoundLogger | None = None,
                 wait_s: float | None = None,
                 report: Callable[[str], Awaitable[object]] | None = None,
                 base_s: float = RECHECK_BASE_S, cap_s: float = RECHECK_CAP_S,
                 readiness: Readiness = READINESS):
        if wait_s is not None and wait_s < 0:
            raise ValueError(f"a wait to start must not be negative, not {wait_s}")
        self.part = part
        self.log = log or get_logger("startup", part=part)
        self.wait_s = wait_s
        self.report = report
        self.base_s = base_s
        self.cap_s = cap_s
        self.readiness = readiness
        self.failures = 0
        self.said: str | None = None
        self.since: float | None = None

    @property
    def waiting(self) -> bool:
        return self.said is not None

    async def failed(self, exc: BaseException, stop: asyncio.Event | None = None) -> bool:
        """A try met the start-up fault ``exc``: say it if it is new, report
        it, pause. ``False`` if ``stop`` was set meanwhile; raises ``exc``
        once the wait is over (``wait_s``)."""
        error = fault_of(exc)
        if error is None:
            raise exc
        now = time.monotonic()
        self.since = now if self.since is None else self.since
        if self.wait_s is not None and now - self.since >= self.wait_s:
            raise exc
        self.failures += 1
        delay = backoff(self.failures, base_s=self.base_s, cap_s=self.cap_s)
        line = cause(error)
        if line != self.said:
            left = ("" if self.wait_s is None
                    else f", for up to {self.wait_s - (now - self.since):.0f}s more")
            self.log.warning(f"not ready: {line}; waiting, re-checking with backoff{left}",
                             part=self.part, error_type=type(error).__name__,
                             exit_code=error.exit_code)
            self.said = line
        else:
            self.log.debug("still not ready", part=self.part, recheck_in_s=round(delay, 2))
        self.readiness.waiting[self.part] = line
        if self.report is not None:
            await self.report(line)
        return not await _stopped(stop, delay)

    def succeeded(self) -> None:
        """The part is past its start-up checks: say so once if it waited."""
        if self.said is not None:
            waited = time.monotonic() - (self.since or time.monotonic())
            self.log.info(f"ready: {self.part} starts (the cause is gone after {waited:.0f}s)",
                          part=self.part)
        self.readiness.waiting.pop(self.part, None)
        self.failures, self.said, self.since = 0, None, None

    async def until_ready(self, attempt: Callable[[], Awaitable[T]],
                          stop: asyncio.Event | None = None) -> T | None:
        """``attempt()``'s result once it no longer meets a start-up fault;
        ``None`` if ``stop`` was set first. Anything else it raises escapes."""
        while True:
            try:
                result = await attempt()
            except Exception as exc:
                if fault_of(exc) is None:
                    raise
                if not await self.failed(exc, stop):
                    return None
                continue
            self.succeeded()
            return result


async def _stopped(stop: asyncio.Event | None, delay: float) -> bool:
    """Pause ``delay`` seconds; whether ``stop`` was set meanwhile."""
    if stop is None:
        await asyncio.sleep(delay)
        return False
    try:
        await asyncio.wait_for(stop.wait(), delay)
        return True
    except TimeoutError:
        return False


async def say_not_ready(registration: Registration | None, line: str) -> None:
    """Tell the registry (``registration``'s row) why its service waits."""
    if registration is None:
        return
    registration.not_ready = line
    await registration.report()


class Standby:
    """The registry row of a command that waits before its services exist:
    once it knows its database (``through``), each failed try reports there
    as its main role (while the database and the role's login serve), and the
    service of that role that starts goes on in the same row (``hand_over``)."""

    def __init__(self, role: str, service: str):
        self.role = role
        self.service = service
        self.database: Database | None = None
        self.registration: Registration | None = None
        self._stack = AsyncExitStack()

    def through(self, database: Database) -> None:
        """Report through ``database`` from now on."""
        self.database = database

    async def report(self, line: str) -> None:
        if self.database is None:
            return
        if self.registration is None:
            from ledger.db.kernel import Kernel
            from ledger.identity import process_identity
            from ledger.runtime.registry import Registration

            session = self.database.session(self.role, max_size=1)
            try:
                # at once or not at all: a report never holds up the re-check
                await session.open(timeout=5.0, wait_for_database_s=0)
            except LedgerError as exc:  # its login or schema is the fault itself
                await session.close()
                get_logger("startup").debug("cannot report to the registry", error=exc.message)
                return
            self._stack.push_async_callback(session.close)
            self.registration = Registration(Kernel(session), self.role, self.service,
                                             process_identity(self.role), REPORT_INTERVAL_S)
        await say_not_ready(self.registration, line)

    def hand_over(self, services: Iterable[Service]) -> None:
        """Let the service acting as this role go on in the row reported so far."""
        if self.registration is None:
            return
        since = self.registration.started_at
        for service in services:
            if adopt_row(service, self.role, since):
                return

    async def close(self) -> None:
        await self._stack.aclose()


def adopt_row(service: Any, role: str, since: datetime) -> bool:
    """Make ``service`` (acting as ``role``) report in the row started at
    ``since``; whether it does."""
    registration = getattr(service, "registration", None)
    if registration is not None and getattr(registration, "role", None) == role:
        registration.started_at = since
        return True
    if getattr(service, "role", None) == role and hasattr(service, "started_at"):
        service.started_at = since
        return True
    return False
