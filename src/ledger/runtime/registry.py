"""The registry of live processes: each service says it is alive and what it holds.

Every service process keeps one row of ``ledger.process`` (``process.sql``):
its role, host, pid and start, the identity it writes on leases and verdicts,
and what it holds now. A ``Registration`` reports on the service's own tick
(its poll interval, at most ``MAX_INTERVAL_S``) through the function of the
role the service acts as (``Kernel.report_worker_process`` and the like: each
granted to that one role), and once more on the way out, saying it stopped.
The dashboard's workers view reads the rows back (``Reads.processes``); a
process that stops reporting shows as gone after three of its intervals. A
service waiting to start (``ledger.runtime.startup``) reports too, saying why
in ``not_ready``.

The registry is what processes say of themselves, for people: nothing is
fenced by it, so a report that fails is logged and tried again on the next
tick, never an error of the service.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from ledger.db.kernel import Kernel
from ledger.db.models import ProcessReport
from ledger.errors import LedgerError
from ledger.logs import get_logger

#: The longest pause between two reports, whatever the service's own tick.
MAX_INTERVAL_S = 10.0
#: How long the last report (on the way out) may take.
FAREWELL_S = 2.0

_REPORTERS: dict[str, Callable[[Kernel, ProcessReport], Awaitable[datetime]]] = {
    "sensor": Kernel.report_sensor_process, "worker": Kernel.report_worker_process,
    "reaper": Kernel.report_reaper_process, "verifier": Kernel.report_verifier_process,
    "dispatcher": Kernel.report_dispatcher_process, "operator": Kernel.report_operator_process,
}

log = get_logger("registry")


def held(kind: str, ident: int | str, since: datetime, **more: Any) -> dict[str, Any]:
    """One thing a process holds, as the registry keeps it."""
    return {"kind": kind, "id": ident, "since": since.isoformat(), **more}


def utcnow() -> datetime:
    """Now, in UTC (when a hold began)."""
    return datetime.now(timezone.utc)


@dataclass
class Registration:
    """One service's row in the registry, and the task that keeps it fresh."""

    kernel: Kernel
    role: str
    service: str
    identity: str
    interval_s: float
    #: what the service holds now (called at every report)
    holds: Callable[[], list[dict[str, Any]]] = list
    host: str = field(default_factory=lambda: socket.gethostname()[:255] or "localhost")
    pid: int = field(default_factory=os.getpid)
    started_at: datetime = field(default_factory=utcnow)
    #: why the service waits to start (``ledger.runtime.startup``); None: it works
    not_ready: str | None = None
    reports: int = 0
    _failing: bool = False

    def __post_init__(self) -> None:
        if self.role not in _REPORTERS:
            raise ValueError(f"no registry report for role {self.role!r}")
        if not self.interval_s > 0:
            raise ValueError(f"a report interval must be positive, not {self.interval_s}")
        self.interval_s = min(self.interval_s, MAX_INTERVAL_S)

    def report_of(self, stopping: bool = False) -> ProcessReport:
        """The report this service would send now."""
        return ProcessReport(host=self.host, pid=self.pid, started_at=self.started_at,
                             identity=self.identity[:200], service=self.service,
                             interval_s=self.interval_s, holds=self.holds(), stopping=stopping,
                             not_ready=self.not_ready)

    async def report(self, stopping: bool = False) -> bool:
        """Send one report; whether it was recorded (a failure is only logged)."""
        try:
            await _REPORTERS[self.role](self.kernel, self.report_of(stopping))
        except (LedgerError, OSError) as exc:
            # Said once per run of failures, then quietly retried each tick.
            (log.debug if self._failing else log.warning)(
                "could not report to the process registry", service=self.service,
                error=getattr(exc, "message", str(exc)))
            self._failing = True
            return False
        self._failing = False
        self.reports += 1
        return True

    async def _keep(self, stop: asyncio.Event, done: asyncio.Event) -> None:
        while not (stop.is_set() or done.is_set()):
            await self.report()
            await _either(stop, done, self.interval_s)

    @contextlib.asynccontextmanager
    async def kept(self, stop: asyncio.Event) -> AsyncIterator[None]:
        """Report now and every interval while the block runs (or until
        ``stop``), then once more saying the service stopped."""
        done = asyncio.Event()
        task = asyncio.create_task(self._keep(stop, done), name=f"registry:{self.service}")
        try:
            yield
        finally:
            done.set()
            await asyncio.gather(task, return_exceptions=True)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.report(stopping=True), FAREWELL_S)


async def _either(a: asyncio.Event, b: asyncio.Event, timeout: float) -> None:
    """Until ``a`` or ``b`` is set, or ``timeout`` passes."""
    waits = [asyncio.ensure_future(a.wait()), asyncio.ensure_future(b.wait())]
    try:
        await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()
        await asyncio.gather(*waits, return_exceptions=True)
