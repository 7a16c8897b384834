"""The worker process (``ledger worker``): claim, attempt, let go.

A service (``ledger.runtime.service.Service``) that the host runs beside a
reaper (``ledger.roles.reaper``: every worker process runs one). Read top to bottom:
a semaphore bounds concurrent attempts and is acquired *before* claiming, so a
saturated worker never strands a claimed row; the claim loop idles on the hub
(``ledger_ready``) with the poll tick as timeout. Shutdown has two phases: stop
claiming at once, let in-flight attempts finish within the drain budget, then
stop the rest and hand their campaigns back.

A claim whose reply was lost (``OutcomeUnknown``) may have leased a campaign
to this worker: it reads back the leases it holds and adopts them (a
heartbeat confirms each lease before the attempt starts), so a lost reply
costs neither the campaign's attempt nor a lease left to expire.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from ledger import tracing
from ledger.backoff import backoff
from ledger.config import LedgerConfig
from ledger.db.database import Database
from ledger.db.hub import NullHub, WakeSource
from ledger.db.kernel import Kernel
from ledger.db.models import Claim
from ledger.db.reads import Reads
from ledger.errors import ConfigError, LedgerError, OutcomeUnknown, StaleLease, Unavailable
from ledger.identity import process_identity
from ledger.logs import get_logger
from ledger.roles.attempt import ENDING_PATIENCE_S, ENDING_TRY_S, AttemptRun, sweep_orphans
from ledger.roles.lease import LeaseClock
from ledger.roles.sensors import Reobservation
from ledger.runtime import startup
from ledger.runtime.registry import Registration, held, utcnow
from ledger.sandbox import cell as cells
from ledger.settings import default


@dataclass
class WorkerOptions:
    """How one worker process behaves."""

    data_dir: Path
    concurrency: int = default("concurrency")
    classes: list[str] = field(default_factory=list)  # empty: every class in the config
    poll_s: float = default("poll_s")
    drain_timeout_s: float = default("drain_timeout_s")
    #: Ledger's configuration file, which an attempt must never change (its
    #: digest is compared at the claim and at the ending)
    config_file: Path | None = None

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ConfigError("concurrency must be at least 1")
        if self.poll_s <= 0 or self.drain_timeout_s < 0:
            raise ConfigError("poll must be positive and the drain timeout not negative")


class Worker:
    """One worker: a claim loop and its attempts."""

    name = "worker"
    #: the role it acts as (its row in the registry of processes)
    role = "worker"

    def __init__(self, db: Database, config: LedgerConfig, options: WorkerOptions, *,
                 hub: WakeSource | None = None, identity: str | None = None):
        self.db = db
        self.config = config
        self.options = options
        self.hub = hub or NullHub()
        self.identity = identity or process_identity("worker")
        self.classes = options.classes or sorted(config.classes)
        for name in self.classes:
            config.campaign_class(name)  # unknown class: ConfigError now, not at the first claim
        if not self.classes:
            raise ConfigError("the config declares no campaign classes to work on")
        self.slots = asyncio.Semaphore(options.concurrency)
        self.stopping = asyncio.Event()
        self.attempts: dict[int, tuple[AttemptRun, asyncio.Task[str]]] = {}
        self.claimed = 0
        self.since: dict[int, datetime] = {}  # when each attempt in flight was claimed
        #: the leases (campaign, generation) whose attempt this process has run:
        #: one lease runs its agent at most once, whatever a read-back finds
        self.ran: dict[tuple[int, int], None] = {}
        self.log = get_logger("worker", worker=self.identity)
        #: when its row of the registry started (``ledger.runtime.startup`` may
        #: hand it the row the command reported in while it waited)
        self.started_at = utcnow()

    def stop(self) -> None:
        """Begin shutdown: claim nothing more (the host's stop leads here)."""
        if not self.stopping.is_set():
            self.log.info("stopping: no new claims; draining", in_flight=len(self.attempts))
            self.stopping.set()

    async def run(self, stop: asyncio.Event) -> int:
        """Claim and attempt until ``stop`` is set, then drain; returns 0."""
        self.stopping = asyncio.Event()
        follow = asyncio.create_task(self._follow(stop), name="worker:stop")
        try:
            async with self.db.session("worker", max_size=self.options.concurrency + 2) as work:
                kernel = Kernel(work)
                await self._boot(kernel)
                self.log.info("worker started", classes=self.classes,
                              concurrency=self.options.concurrency)
                async with self._registration(kernel).kept(stop):
                    try:
                        await self._claim_loop(kernel)
                    finally:
                        # Also when the claim loop died: the attempts in flight
                        # are drained, never left running behind the host's back.
                        self.stop()
                        await self._drain()
            return 0
        finally:
            follow.cancel()

    async def run_once(self) -> int:
        """Claim one campaign and see its attempt through; 1 if there was one."""
        self.stopping = asyncio.Event()
        async with self.db.session("worker", max_size=2) as work:
            kernel = Kernel(work)
            await self._boot(kernel)
            sent = LeaseClock.now()
            claim_ns = tracing.now_ns()
            claim = await kernel.claim_campaign(self.identity, self.classes)
            if claim is None:
                return 0
            self.claimed += 1
            lease = LeaseClock()
            lease.confirm(sent, claim.lease_remaining_s)
            await self.slots.acquire()
            self._start(kernel, claim, lease, (claim_ns, tracing.now_ns()))
            await asyncio.wait([task for _, task in self.attempts.values()])
            return 1

    async def _follow(self, stop: asyncio.Event) -> None:
        await stop.wait()
        self.stop()

    def _registration(self, kernel: Kernel) -> Registration:
        return Registration(kernel, "worker", self.name, self.identity, self.options.poll_s,
                            holds=self._holds, started_at=self.started_at)

    async def prepare(self) -> None:
        """Its start-up checks, before anything is claimed: a cell can be built
        (where a class needs one), its classes are registered, its login and
        the schema serve it. A start-up fault (``ledger.runtime.startup``) is
        said in its registry row too, and the host waits until it is gone."""
        async with self.db.session("worker", max_size=1) as session:
            kernel = Kernel(session)
            try:
                await self._boot(kernel)
            except Exception as exc:
                fault = startup.fault_of(exc)
                if fault is not None:
                    await startup.say_not_ready(self._registration(kernel), startup.cause(fault))
                raise

    async def _boot(self, kernel: Kernel) -> None:
        if any(self.config.campaign_class(name).cell.sandbox for name in self.classes):
            # No cell, no attempt: say so at start-up, naming the package,
            # rather than release every campaign it claims.
            await asyncio.to_thread(cells.check_available)
        await self._check_registered(Reads(kernel.executor))
        swept = await asyncio.to_thread(sweep_orphans, self.options.data_dir)
        if swept:
            self.log.info("removed worktrees of dead workers", count=swept)

    async def _check_registered(self, reads: Reads) -> None:
        registered = {c.name for c in await reads.classes()}
        missing = [name for name in self.classes if name not in registered]
        if missing:
            raise ConfigError(f"campaign class(es) {', '.join(missing)} not registered in the "
                              "database; run: ledger classes sync")

    async def _claim_loop(self, kernel: Kernel) -> None:
        unsure = False  # a claim's reply was lost: what we hold is not known here
        while await self._acquire_slot():
            if unsure:
                unsure = not await self._adopt(kernel)
                continue
            # Every slot free now goes into one claim: several free slots
            # (a worker starting, a burst of endings) are filled by one batch
            # (claim_campaigns), each campaign with its own lease and attempt.
            held = 1 + await self._take_free_slots()
            # Subscribe before reading: a campaign opened between the claim
            # and the wait still wakes us.
            with self.hub.subscribe("ledger_ready") as ready:
                wait_s = self.options.poll_s
                sent = LeaseClock.now()
                claim_ns = tracing.now_ns()
                try:
                    claims = await self._claim(kernel, held)
                except OutcomeUnknown as exc:
                    self.log.warning("a claim's reply was lost; reading back what this worker holds",
                                     error=exc.message)
                    unsure = True
                    self._release(held)
                    continue
                except LedgerError as exc:
                    claims = []
                    self.log.warning("claim failed", error=exc.message,
                                     error_type=type(exc).__name__)
                    if isinstance(exc, Unavailable):
                        # back soon: a hub reconnect or a hint cuts this short
                        wait_s = min(wait_s, backoff(1, base_s=1.0, cap_s=1.0))
                self._release(held - len(claims))  # the slots no campaign took
                if not claims:
                    self.log.debug("idle: nothing to claim", wait_s=wait_s)
                    await self._idle(ready.wait(wait_s))
                    continue
            claimed = (claim_ns, tracing.now_ns())
            for claim in claims:
                self.claimed += 1
                lease = LeaseClock()
                lease.confirm(sent, claim.lease_remaining_s)
                self._start(kernel, claim, lease, claimed)

    async def _claim(self, kernel: Kernel, slots: int) -> list[Claim]:
        """Up to ``slots`` campaigns: one claim, or a batch when several slots are free."""
        if slots == 1:
            claim = await kernel.claim_campaign(self.identity, self.classes)
            return [claim] if claim is not None else []
        return await kernel.claim_campaigns(self.identity, self.classes, limit=slots)

    async def _take_free_slots(self) -> int:
        """Hold every slot that is free now (none is waited for); how many."""
        taken = 0
        while await self._try_slot():
            taken += 1
        return taken

    def _release(self, slots: int) -> None:
        for _ in range(slots):
            self.slots.release()

    async def _adopt(self, kernel: Kernel) -> bool:
        """Adopt the leases this worker holds but runs no attempt for (a claim
        whose reply was lost). Called holding one slot, which the first
        adopted attempt takes; returns whether the read-back succeeded."""
        try:
            held = [c for c in await Reads(kernel.executor).running_claims(self.identity)
                    if c.campaign_id not in self.attempts]
        except LedgerError as exc:
            self.slots.release()
            self.log.warning("could not read back this worker's leases; trying again",
                             error=exc.message)
            await self._idle(asyncio.sleep(backoff(1, base_s=1.0, cap_s=1.0)))
            return False
        slot = True  # the one held by the caller
        for claim in [c for c in held if (c.campaign_id, c.generation) in self.ran]:
            # its attempt ran here already and ended without its ending written:
            # never a second run of the agent on one lease
            await self._hand_back(kernel, claim, None, RuntimeError(
                "this lease's attempt already ran on this worker and its ending was not written "
                "(the database was out of reach); it is not run a second time"))
        held = [c for c in held if (c.campaign_id, c.generation) not in self.ran]
        for claim in held:
            if not slot and not await self._try_slot():
                self.log.warning("no free slot for a lease found on read-back; it will expire",
                                 campaign=claim.campaign_id)
                continue
            slot = False
            sent = LeaseClock.now()
            try:
                renewed = await kernel.heartbeat(claim.campaign_id, claim.generation)
            except LedgerError as exc:
                self.slots.release()
                self.log.warning("a lease found on read-back could not be confirmed",
                                 campaign=claim.campaign_id, error=exc.message,
                                 stale=isinstance(exc, StaleLease))
                continue
            lease = LeaseClock()
            lease.confirm(sent, renewed.lease_remaining_s)
            self.claimed += 1
            self.log.info("adopted a lease whose claim reply was lost", campaign=claim.campaign_id,
                          attempt=claim.attempt_no, generation=claim.generation)
            self._start(kernel, claim, lease)
        if slot:
            self.slots.release()
        return True

    async def _try_slot(self) -> bool:
        if self.slots.locked():
            return False
        await self.slots.acquire()
        return True

    async def _acquire_slot(self) -> bool:
        """Wait for a free slot; ``False`` (holding none) once stopping began."""
        acquire = asyncio.create_task(self.slots.acquire())
        stopping = asyncio.create_task(self.stopping.wait())
        await asyncio.wait({acquire, stopping}, return_when=asyncio.FIRST_COMPLETED)
        stopping.cancel()
        acquire.cancel()
        try:
            await acquire
        except asyncio.CancelledError:
            return False  # still waiting when stopping began: no slot held
        if self.stopping.is_set():
            self.slots.release()
            return False
        return True

    async def _idle(self, wake: Awaitable[object]) -> None:
        waiter: asyncio.Future[object] = asyncio.ensure_future(wake)
        stopping: asyncio.Future[object] = asyncio.ensure_future(self.stopping.wait())
        await asyncio.wait([waiter, stopping], return_when=asyncio.FIRST_COMPLETED)
        for task in (waiter, stopping):
            task.cancel()

    def _start(self, kernel: Kernel, claim: Claim, lease: LeaseClock,
               claimed: tuple[int, int] | None = None) -> None:
        """Start the attempt of ``claim``; ``claimed``: when its claim was sent
        and answered (ns since the epoch; a span's times when tracing)."""
        try:
            cls = self.config.campaign_class(claim.class_)
            reobservation = Reobservation.of(self.config, claim.class_, claim.objective_key,
                                             claim.target, self.options.data_dir / "repos")
            run = AttemptRun(kernel, claim, cls, identity=self.identity,
                             data_dir=self.options.data_dir, hub=self.hub, lease=lease,
                             config_file=self.options.config_file, reobservation=reobservation)
        except Exception as exc:  # noqa: BLE001 -- a recorded claim starts or is handed back
            self.log.exception("cannot start the attempt of a claim; handing it back",
                               campaign=claim.campaign_id)
            back = asyncio.create_task(self._hand_back(kernel, claim, lease, exc))
            back.add_done_callback(lambda _: self.slots.release())
            return
        self.ran[(claim.campaign_id, claim.generation)] = None
        while len(self.ran) > 10_000:  # oldest first: long ended
            del self.ran[next(iter(self.ran))]
        task = asyncio.create_task(
            tracing.attempt(kernel.executor, claim, run.run(), claimed=claimed,
                            worker=self.identity),
            name=f"attempt-{claim.campaign_id}-{claim.attempt_no}")
        self.attempts[claim.campaign_id] = (run, task)
        self.since[claim.campaign_id] = utcnow()
        self.log.info("claimed", campaign=claim.campaign_id, attempt=claim.attempt_no,
                      generation=claim.generation)

        def finished(t: asyncio.Task[str]) -> None:
            self.attempts.pop(claim.campaign_id, None)
            self.since.pop(claim.campaign_id, None)
            self.slots.release()
            if not t.cancelled() and t.exception() is not None:
                self.log.error("attempt crashed", campaign=claim.campaign_id,
                               error=repr(t.exception()))

        task.add_done_callback(finished)

    async def _hand_back(self, kernel: Kernel, claim: Claim, lease: LeaseClock | None,
                         exc: Exception) -> None:
        """Release a claim whose attempt could not be started (or must not
        run again): a fault of this worker's, never charged to the campaign.
        Tried again until the database answers (it gives a lease its length
        again after a restart), for up to ``ENDING_PATIENCE_S``."""
        reason = f"the worker could not start the attempt: {type(exc).__name__}: {exc}"[:4000]
        loop = asyncio.get_running_loop()
        give_up = loop.time() + (max(lease.remaining(), 0.0) if lease else 0.0) + ENDING_PATIENCE_S
        tries = 0
        while True:
            tries += 1
            try:
                await kernel.release_attempt(claim.campaign_id, claim.generation, reason,
                                             timeout_s=max(lease.remaining() if lease else 0.0,
                                                           ENDING_TRY_S))
                self.log.info("claim handed back, nothing charged", campaign=claim.campaign_id,
                              reason=reason)
                return
            except Unavailable as error:
                if loop.time() >= give_up:
                    self.log.warning("could not hand the claim back; its lease will expire",
                                     campaign=claim.campaign_id, error=error.message)
                    return
                await asyncio.sleep(backoff(tries, base_s=0.25, cap_s=2.0))
            except LedgerError as error:
                self.log.warning("could not hand the claim back", campaign=claim.campaign_id,
                                 error=error.message, stale=isinstance(error, StaleLease))
                return

    def _holds(self) -> list[dict[str, Any]]:
        """The leases this worker holds now, for the registry of processes."""
        return [held("campaign", cid, self.since.get(cid) or utcnow(),
                     attempt=run.claim.attempt_no, generation=run.claim.generation)
                for cid, (run, _) in list(self.attempts.items())]

    async def _drain(self) -> None:
        """Phase two of shutdown: wait for in-flight attempts up to the budget,
        then stop the rest and hand their campaigns back as ready."""
        tasks = [task for _, task in self.attempts.values()]
        if tasks:
            self.log.info("draining", in_flight=len(tasks), budget_s=self.options.drain_timeout_s)
            await asyncio.wait(tasks, timeout=self.options.drain_timeout_s)
        leftovers = list(self.attempts.values())
        for run, _ in leftovers:
            self.log.warning("drain budget spent: stopping the attempt", campaign=run.claim.campaign_id)
            await run.drain()
        if leftovers:
            await asyncio.wait([task for _, task in leftovers])
        self.log.info("drained", claimed=self.claimed)
