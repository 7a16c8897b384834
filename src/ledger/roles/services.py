"""What a process runs: the services of each runtime command, built and ready
for the host (``ledger.runtime.host``).

A builder opens the database sessions its services use in ``stack`` (each
service acts as its own role) and returns the services; the caller adds them
to a ``Host`` and runs it, and closes ``stack`` after. ``ledger worker`` runs
``worker_services``; ``ledger run`` and the demo run ``one_machine``: every
part on one machine, each restarted by the host if it dies, and each waiting
on its own for what it needs to start (``ledger.runtime.startup``: the
dispatcher promotes while the worker waits for a cell).
"""

from __future__ import annotations

from contextlib import AsyncExitStack
from dataclasses import dataclass

from ledger.config import LedgerConfig
from ledger.db.database import Database
from ledger.db.hub import WakeSource
from ledger.db.kernel import Kernel
from ledger.errors import ConfigError
from ledger.identity import process_identity
from ledger.roles.dispatcher import Dispatcher
from ledger.roles.reaper import Reaper
from ledger.roles.sensors import Sensors
from ledger.roles.trimmer import TRIM_INTERVAL_S, Trimmer
from ledger.roles.verifier import Verifier
from ledger.roles.worker import Worker, WorkerOptions
from ledger.runtime.service import Service
from ledger.settings import default


@dataclass
class ReaperOptions:
    """The reaper every worker process runs."""

    grace_s: float = default("reaper_grace_s")
    interval_s: float = 5.0

    def __post_init__(self) -> None:
        if self.grace_s < 0 or self.interval_s <= 0:
            raise ConfigError("the reaper's grace must not be negative and its interval positive")


@dataclass
class RunOptions:
    """What ``ledger run`` starts."""

    worker: WorkerOptions
    reaper: ReaperOptions
    model_family: str = default("model_family")
    sensors: bool = True
    verifier: bool = True
    dispatcher: bool = True
    verification_lease_s: float = default("verification_lease_s")
    #: trim journal deltas of campaigns closed this long ago (None: no trimmer)
    trim_after_s: float | None = None
    trim_interval_s: float = TRIM_INTERVAL_S


async def worker_services(stack: AsyncExitStack, db: Database, config: LedgerConfig,
                          options: WorkerOptions, reaper: ReaperOptions, hub: WakeSource
                          ) -> list[Service]:
    """A worker and its reaper (every worker process runs one: no singleton to lose)."""
    worker = Worker(db, config, options, hub=hub)  # checks the classes before connecting
    session = await stack.enter_async_context(db.session("reaper", max_size=1))
    return [Reaper(Kernel(session), grace_s=reaper.grace_s, interval_s=reaper.interval_s), worker]


async def one_machine(stack: AsyncExitStack, db: Database, config: LedgerConfig, run: RunOptions,
                      hub: WakeSource) -> list[Service]:
    """Every part on one machine: reaper and worker, verifier, dispatcher,
    sensors (when the config has some) and the trimmer (when asked for)."""
    services = await worker_services(stack, db, config, run.worker, run.reaper, hub)
    poll_s, data_dir = run.worker.poll_s, run.worker.data_dir
    if run.verifier:
        session = await stack.enter_async_context(db.session("verifier", max_size=2))
        # Its checks need a cell unless every class opted its acceptance out.
        needs_cell = any(cls.acceptance.cell.sandbox for cls in config.classes.values())
        services.append(Verifier(Kernel(session), model_family=run.model_family, hub=hub,
                                 lease_s=run.verification_lease_s, poll_s=poll_s,
                                 data_dir=data_dir, needs_cell=needs_cell))
    if run.dispatcher:
        session = await stack.enter_async_context(db.session("dispatcher", max_size=2))
        services.append(Dispatcher(Kernel(session), hub=hub, poll_s=poll_s, data_dir=data_dir))
    if run.sensors and config.sensors:
        session = await stack.enter_async_context(db.session("sensor", max_size=2))
        services.append(Sensors(Kernel(session), config, [], process_identity("sensor"),
                                data_dir=data_dir))
    if run.trim_after_s is not None:
        session = await stack.enter_async_context(db.session("operator", max_size=1))
        services.append(Trimmer(Kernel(session), older_than_s=run.trim_after_s,
                                interval_s=run.trim_interval_s))
    return services
