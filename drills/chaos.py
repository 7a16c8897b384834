"""chaos: for N minutes (``ledger drill chaos --minutes N``; default 2 x
--scale, at least 30 s) a whole fleet -- workers, two verifiers, a dispatcher
with git and HTTP side effects, a sensor -- works a steady stream of
objectives while everything fails at once, each fault on its own clock
(every other objective is promoted, onto one of three branches in turn, so
each target is contended and drains through its merge queue):

* PostgreSQL (a throwaway cluster of the drill's own) stopped every 5-40 s,
  fast or immediate (a crash), down for 0-2 s;
* a worker SIGKILLed every 10-30 s (and a new one started);
* a worker SIGSTOPped past its lease every minute, then resumed;
* the hubs' LISTEN backends terminated every 60 s;
* the dispatcher or a verifier SIGKILLed every 15-45 s (and started again).

Then the faults stop, the fleet settles and a checker reads the journal,
attempts, side effects, the git reflog and the HTTP target's counts: 0
objectives lost, 0 side effects applied twice, every (campaign, generation)
with at most one ending, journals gap-free, state replayed from the journal
equal to the table, and nothing waiting for its promotion target."""

from __future__ import annotations

import asyncio
import logging
import random
import signal
import time
from collections import Counter
from pathlib import Path

from ledger.ops.drill import DRILL_TIMEOUT_S, Drill, DrillContext, Proc, UnderExercised

from . import fleet

LEASE_S = 3.0
WORKERS, VERIFIERS = 2, 2
WORKER = ("worker", "--concurrency", "2", "--poll", "0.5", "--grace", "0.5")
SETTLE_S = 150.0
#: Promotion targets, each contended: every other objective is promoted,
#: onto one of these branches in turn.
TARGETS, SHIP_EVERY = 3, 2


def chaos_minutes(scale: float, minutes: float | None) -> float:
    return minutes if minutes is not None else max(0.5, 2.0 * scale)


def settle_cap(minutes: float) -> float:
    """How long the fleet may take to finish the backlog the faults left
    (waited only while it makes progress): on a busy 2-core machine a long
    run ends with hundreds of campaigns queued."""
    return max(SETTLE_S, minutes * 60 / 2)


class Chaos(Drill):
    name = "chaos"
    summary = ("N minutes of restarts, crashes, SIGKILLs, SIGSTOPs and cut LISTENs under a whole fleet "
               "-> nothing lost, no side effect twice, one ending per generation, journals replay")
    own_cluster = True

    def timeout_s(self, scale: float, minutes: float | None) -> float:
        run = chaos_minutes(scale, minutes)
        return run * 60 + settle_cap(run) + DRILL_TIMEOUT_S

    async def run(self, ctx: DrillContext) -> None:
        # the drill's own pools meet every outage too: their reconnect warnings are noise here
        logging.getLogger("psycopg.pool").setLevel(logging.ERROR)
        repo = await fleet.fleet_setup(ctx, lease_s=LEASE_S, targets=TARGETS)
        target = fleet.Target()
        try:
            await Run(ctx, repo, target).run(chaos_minutes(ctx.scale, ctx.minutes))
        finally:
            target.close()


class Run:
    """One chaos run: the fleet, its fault clocks and their tally."""

    def __init__(self, ctx: DrillContext, repo: Path, target: fleet.Target):
        self.ctx, self.repo, self.target = ctx, repo, target
        self.workers: list[Proc] = []
        self.verifiers: list[Proc] = []
        self.dispatcher: Proc | None = None
        self.spawned = Counter[str]()
        self.tally = Counter[str]()
        self.down_s = 0.0
        self.end = 0.0
        self.server_lock = asyncio.Lock()
        #: the leases (campaign, generation) a killed worker held when it died, and those a
        #: stopped one held while frozen: the only attempts a fault may cost
        self.killed_with: set[tuple[int, int]] = set()
        self.frozen_with: set[tuple[int, int]] = set()

    def spawn(self, kind: str) -> Proc:
        self.spawned[kind] += 1
        name = f"{kind}-{self.spawned[kind]}"
        if kind == "worker":
            return self.ctx.spawn(name, *WORKER)
        if kind == "verifier":
            return self.ctx.spawn(name, "verifier", "--poll", "0.5", "--lease", "10")
        if kind == "dispatcher":
            return self.ctx.spawn(name, "dispatcher", "--poll", "0.5", "--lease", "6", "--http-timeout", "1")
        return self.ctx.spawn(name, "sensor", "run")

    async def run(self, minutes: float) -> None:
        ctx = self.ctx
        self.workers = [self.spawn("worker") for _ in range(WORKERS)]
        self.verifiers = [self.spawn("verifier") for _ in range(VERIFIERS)]
        self.dispatcher = self.spawn("dispatcher")
        sensor = self.spawn("sensor")
        opened = fleet.Opened()
        stop_opening = asyncio.Event()
        # one objective a second: what the fleet sustains on a busy 2-core machine, so the
        # run measures the faults, not a backlog
        opener = asyncio.create_task(fleet.open_stream(ctx, opened, self.target, stop_opening, every_s=1.0,
                                                       ship_every=SHIP_EVERY, targets=TARGETS))
        ctx.step(f"chaos for {minutes:g} minute(s)")
        self.end = time.monotonic() + minutes * 60
        faults = [self.restarts(), self.worker_kills(), self.worker_stops(), self.hub_cuts(), self.service_kills()]
        await asyncio.gather(*faults)
        stop_opening.set()
        await opener
        ctx.step(f"chaos over: {dict(self.tally)}; the server was down {self.down_s:.1f}s in all; "
                 f"{len(opened.work)} objectives and {len(opened.notify)} HTTP campaigns opened "
                 f"({opened.refused} tries met an outage and were retried)")
        if self.tally["restart"] == 0 or self.tally["worker-sigkill"] == 0:
            raise UnderExercised("the run was too short for the faults to land")
        procs = [*self.workers, *self.verifiers, self.dispatcher, sensor]
        _, how = await fleet.settle(ctx, cap_s=settle_cap(minutes))
        ctx.step(how)
        figures = fleet.check(ctx, opened, self.target, self.repo)
        dup_ticks = ctx.sql("SELECT count(*) AS n FROM (SELECT tick FROM ledger.observation WHERE tick IS NOT NULL "
                            "GROUP BY tick HAVING count(*) > 1) t")[0]["n"]
        ctx.expect(dup_ticks == 0, "no sensor tick was observed twice")
        # Issue 19: the outbox drains after the faults, and a restart (down at most
        # 2 s, far shorter than a lease) costs no attempt: only a killed or frozen
        # worker loses the attempts it had in flight (at most its concurrency).
        pending = ctx.sql("SELECT count(*) AS n FROM ledger.side_effect "
                          "WHERE state IN ('pending', 'claimed')")[0]["n"]
        ctx.expect(pending == 0, "nothing is pending in the outbox after the settle period",
                   f"{pending} pending or claimed")
        # Issue 26: contended targets drain through their merge queues; nothing
        # verified is left waiting for its branch.
        waiting = ctx.sql("SELECT (SELECT count(*) FROM ledger.campaign WHERE class LIKE 'ship%%' "
                          "AND state = 'verified' AND promoted_at IS NULL) AS unpromoted, "
                          "(SELECT count(*) FROM ledger.merge_queue) AS queued, "
                          "(SELECT count(*) FROM ledger.merge_batch WHERE closed_at IS NULL) AS batches")[0]
        ctx.expect(waiting["unpromoted"] == waiting["queued"] == waiting["batches"] == 0,
                   "nothing waits for a promotion target after the settle: no verified campaign unpromoted, "
                   "the merge queues empty, no batch open", str(waiting))
        shipped = ctx.sql("SELECT count(*) FILTER (WHERE promoted_at IS NOT NULL) AS landed, "
                          "(SELECT count(*) FROM ledger.verification v JOIN ledger.campaign k ON k.id = v.campaign_id "
                          " WHERE k.class LIKE 'ship%%' AND v.status IN ('accepted', 'rejected')) AS verdicts, "
                          "(SELECT count(*) FROM ledger.merge_batch WHERE state = 'landed' "
                          " AND cardinality(members) > 1) AS batches "
                          "FROM ledger.campaign WHERE class LIKE 'ship%%'")[0]
        if shipped["landed"]:
            ctx.step(f"promotions onto {TARGETS} contended targets: {shipped['landed']} landed with "
                     f"{shipped['verdicts']} verdicts ({shipped['verdicts'] / shipped['landed']:.2f} per landed "
                     f"candidate), {shipped['batches']} batch(es) of several landed")
        # To the attempt, what was charged for a lost lease is what the kills and
        # stops took -- never a restart's doing -- and no lease ran its agent twice
        lost = {(r["campaign_id"], r["generation"]) for r in ctx.sql(
            "SELECT campaign_id, generation FROM ledger.attempt WHERE outcome = 'lost'")}
        unexplained = lost - self.killed_with - self.frozen_with
        spared = self.killed_with - lost
        ctx.step(f"measured: {len(lost)} attempt(s) charged for a lost lease; the kills took "
                 f"{len(self.killed_with)} lease(s) in flight, the stops froze {len(self.frozen_with)} "
                 f"({len(lost & self.frozen_with)} of them lost); {self.tally['restart']} restarts cost "
                 f"{len(unexplained)}")
        ctx.expect(not unexplained, "every attempt charged for a lost lease was lost to a kill or a stop "
                   "(none to a restart)", f"unexplained: {sorted(unexplained)[:10]}")
        ctx.expect(not spared, "every lease a killed worker held was charged once (a kill costs its attempt)",
                   f"not charged: {sorted(spared)[:10]}")
        twice = ctx.sql("SELECT campaign_id, generation FROM ledger.campaign_event WHERE type = 'attempt.started' "
                        "GROUP BY 1, 2 HAVING count(*) > 1")
        ctx.expect(not twice, "no lease has two attempt.started (one run of the agent per lease)",
                   str(twice[:10]))
        ctx.step(f"figures: {figures}")
        ctx.expect(all(p.popen.poll() is None for p in procs),
                   "every process the faults did not kill is still running",
                   str({p.name: p.popen.poll() for p in procs if p.popen.poll() is not None}))
        for p in procs:
            p.signal(signal.SIGTERM)
        codes = {p.name: p.wait(40) for p in procs}
        ctx.expect(set(codes.values()) == {0}, "every process stops cleanly", str(codes))

    # -- the fault clocks --------------------------------------------------

    async def _until(self, low: float, high: float) -> bool:
        """Sleep a random ``low``..``high`` seconds (the fault's cadence); False once the run is over."""
        pause = random.uniform(low, high)
        if time.monotonic() + pause >= self.end:
            await asyncio.sleep(max(self.end - time.monotonic(), 0))
            return False
        await asyncio.sleep(pause)
        return True

    async def _held_by(self, worker: Proc) -> set[tuple[int, int]]:
        """The leases ``worker`` (dead or frozen: it holds still) holds now, read
        between restarts."""
        while True:
            async with self.server_lock:
                try:
                    return {(r["id"], r["generation"]) for r in self.ctx.sql(
                        "SELECT id, generation FROM ledger.campaign WHERE state = 'leased' "
                        "AND lease_owner LIKE %s", f"worker:%:{worker.pid}:%")}
                except Exception:  # noqa: BLE001 -- the server may still be starting
                    pass
            await asyncio.sleep(0.2)

    async def restarts(self) -> None:
        while await self._until(5, 40):
            mode = random.choice(("fast", "immediate"))
            down = random.uniform(0, 2)
            async with self.server_lock:
                began = time.monotonic()
                await asyncio.to_thread(self.ctx.stop_server, mode)  # type: ignore[arg-type]
                await asyncio.sleep(down)  # the outage itself
                await asyncio.to_thread(self.ctx.start_server)
                self.down_s += time.monotonic() - began
            self.tally["restart"] += 1
            self.ctx.step(f"fault: PostgreSQL stopped ({mode}) and started after {down:.1f}s")

    async def worker_kills(self) -> None:
        while await self._until(10, 30):
            i = random.randrange(len(self.workers))
            self.workers[i].signal(signal.SIGKILL)
            self.workers[i].wait(10)
            self.killed_with |= await self._held_by(self.workers[i])
            self.tally["worker-sigkill"] += 1
            self.ctx.step(f"fault: SIGKILL {self.workers[i].name}")
            self.workers[i] = self.spawn("worker")

    async def worker_stops(self) -> None:
        while await self._until(50, 60):
            victim = random.choice(self.workers)
            victim.signal(signal.SIGSTOP)
            self.frozen_with |= await self._held_by(victim)
            self.ctx.step(f"fault: SIGSTOP {victim.name} for {LEASE_S + 2:g}s (its lease is {LEASE_S:g}s)")
            await asyncio.sleep(LEASE_S + 2)  # frozen past its lease
            victim.signal(signal.SIGCONT)
            self.tally["worker-sigstop"] += 1

    async def hub_cuts(self) -> None:
        while await self._until(55, 60):
            async with self.server_lock:
                try:
                    cut = self.ctx.sql("SELECT count(pg_terminate_backend(pid)) AS n FROM pg_stat_activity "
                                       "WHERE application_name = 'ledger:reader'")[0]["n"]
                except Exception as exc:  # the server may be starting
                    self.ctx.step(f"could not cut the LISTEN backends: {exc}")
                    continue
            self.tally["hub-cut"] += 1
            self.ctx.step(f"fault: terminated {cut} LISTEN backend(s)")

    async def service_kills(self) -> None:
        while await self._until(15, 45):
            if random.random() < 0.5 and self.dispatcher is not None:
                self.dispatcher.signal(signal.SIGKILL)
                self.dispatcher.wait(10)
                self.ctx.step(f"fault: SIGKILL {self.dispatcher.name}")
                self.dispatcher = self.spawn("dispatcher")
                self.tally["dispatcher-sigkill"] += 1
            else:
                i = random.randrange(len(self.verifiers))
                self.verifiers[i].signal(signal.SIGKILL)
                self.verifiers[i].wait(10)
                self.ctx.step(f"fault: SIGKILL {self.verifiers[i].name}")
                self.verifiers[i] = self.spawn("verifier")
                self.tally["verifier-sigkill"] += 1
