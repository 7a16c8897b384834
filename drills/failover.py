"""failover: a primary and a synchronous streaming standby (``pg_basebackup``);
every Ledger process -- two workers, a verifier, a dispatcher with git and HTTP
side effects, a sensor -- connects with one multi-host URL
(``host=A,B ... target_session_attrs=read-write``). Under load the primary is
SIGKILLed (every process of it: the machine dies) and the standby promoted.
Every process reconnects by itself to the new primary; nothing committed
before the kill is missing after it (synchronous replication); no campaign is
lost or closed twice; each (campaign, generation) has at most one ending;
journals are gap-free; the timeline shows how long the fleet stalled."""

from __future__ import annotations

import asyncio
import logging
import signal
from datetime import UTC, datetime
from pathlib import Path

from ledger.ops.drill import Drill, DrillContext, UnderExercised

from . import fleet

WORKER = ("worker", "--concurrency", "2", "--poll", "0.5", "--grace", "0.5")


class Failover(Drill):
    name = "failover"
    summary = ("SIGKILL the primary under load, promote its synchronous standby -> every process "
               "reconnects through its multi-host URL; nothing committed is lost, nothing doubled")
    replicated = True

    async def run(self, ctx: DrillContext) -> None:
        pair = ctx.pair
        assert pair is not None
        ctx.step(f"every process connects with: {pair.url}")
        # the drill's own pools meet the outage too: their reconnect warnings are noise here
        logging.getLogger("psycopg.pool").setLevel(logging.ERROR)
        repo = await fleet.fleet_setup(ctx)
        target = fleet.Target()
        try:
            await self._run(ctx, repo, target)
        finally:
            target.close()

    async def _run(self, ctx: DrillContext, repo: Path, target: fleet.Target) -> None:
        pair = ctx.pair
        assert pair is not None
        procs = [ctx.spawn("worker-1", *WORKER), ctx.spawn("worker-2", *WORKER),
                 ctx.spawn("verifier", "verifier", "--poll", "0.5"),
                 ctx.spawn("dispatcher", "dispatcher", "--poll", "0.5", "--lease", "6", "--http-timeout", "1"),
                 ctx.spawn("sensor", "sensor", "run")]
        opened = fleet.Opened()
        stop = asyncio.Event()
        opener = asyncio.create_task(fleet.open_stream(ctx, opened, target, stop))
        try:
            loaded = await ctx.until(lambda: ctx.sql(
                "SELECT count(*) AS n FROM ledger.side_effect WHERE state = 'done'")[0]["n"] >= 4,
                "the fleet to be under load (promotions and HTTP calls done)", timeout=60 * max(ctx.scale, 1),
                interval=0.25)
            if not loaded:
                raise UnderExercised(f"the fleet never got going: {fleet.still_moving(ctx)}")
            sync = ctx.sql("SELECT application_name, sync_state FROM pg_stat_replication")
            ctx.expect([r["sync_state"] for r in sync] == ["sync"], "the standby replicates synchronously",
                       str(sync))
            committed = {r["campaign_id"]: r["seq"] for r in ctx.sql(
                "SELECT campaign_id, max(seq) AS seq FROM ledger.campaign_event GROUP BY 1")}
            n = pair.primary.kill()
            killed_at = datetime.now(UTC)  # every process of it is gone: nothing commits there after this
            ctx.step(f"fault: SIGKILL the primary ({n} processes), {len(committed)} campaigns' journals read "
                     "just before")
            await asyncio.to_thread(pair.standby.promote)
            promoted_at = datetime.now(UTC)
            ctx.step(f"the standby is promoted ({(promoted_at - killed_at).total_seconds():.2f}s after the kill)")
            alive = await ctx.until(lambda: all(p.popen.poll() is None for p in procs)
                                    and self._first_after(ctx, killed_at) is not None,
                                    "the fleet to write again", timeout=60, interval=0.1)
            ctx.expect(alive, "the fleet writes again on the new primary",
                       str({p.name: p.popen.poll() for p in procs}))
            first = self._first_after(ctx, killed_at)
            stall = (first - killed_at).total_seconds() if first else float("nan")
            ctx.step(f"the fleet stalled {stall:.2f}s: from the kill to the first journal write on the new "
                     "primary (the promotion itself took "
                     f"{(promoted_at - killed_at).total_seconds():.2f}s, pg_ctl's wait included)")
            for role in ("worker", "verifier", "dispatcher", "sensor"):
                got = await ctx.until(lambda role=role: self._role_after(ctx, role, killed_at),
                                      f"the {role} to act on the new primary", timeout=60, interval=0.25)
                first_act = self._role_after(ctx, role, killed_at)
                ctx.expect(got, f"the {role} reconnected by itself and acted on the new primary",
                           f"{(first_act - killed_at).total_seconds():.2f}s after the kill" if first_act else "")
            await asyncio.sleep(5 * max(ctx.scale, 0.5))  # more load on the new primary
        finally:
            stop.set()
            await opener
        ctx.step(f"stopped opening: {len(opened.work)} objectives, {len(opened.notify)} HTTP campaigns "
                 f"({opened.refused} tries met the outage and were retried)")
        after = {r["campaign_id"]: r["seq"] for r in ctx.sql(
            "SELECT campaign_id, max(seq) AS seq FROM ledger.campaign_event GROUP BY 1")}
        lost = [cid for cid, seq in committed.items() if after.get(cid, 0) < seq]
        ctx.expect(not lost, "nothing committed before the kill is missing after the failover",
                   f"{len(committed)} journals compared; short: {lost[:5]}")
        _, how = await fleet.settle(ctx, cap_s=90)
        ctx.step(how)
        figures = fleet.check(ctx, opened, target, repo)
        ctx.step(f"figures: {figures}")
        ctx.expect(all(p.popen.poll() is None for p in procs), "no process exited",
                   str({p.name: p.popen.poll() for p in procs}))
        for p in procs:
            p.signal(signal.SIGTERM)
        codes = {p.name: p.wait(30) for p in procs}
        ctx.expect(set(codes.values()) == {0}, "every process stops cleanly", str(codes))

    @staticmethod
    def _first_after(ctx: DrillContext, when: datetime) -> datetime | None:
        rows = ctx.sql("SELECT min(created_at) AS t FROM ledger.campaign_event WHERE created_at > %s", when)
        return rows[0]["t"]

    @staticmethod
    def _role_after(ctx: DrillContext, role: str, when: datetime) -> datetime | None:
        """When ``role`` first acted on the new primary (None: not yet): a
        journal write, a side effect done, an observation."""
        if role == "sensor":
            rows = ctx.sql("SELECT min(finished_at) AS t FROM ledger.observation WHERE finished_at > %s", when)
        elif role == "dispatcher":
            rows = ctx.sql("SELECT min(finished_at) AS t FROM ledger.side_effect WHERE finished_at > %s "
                           "AND state = 'done'", when)
        else:
            transitions = {"worker": ["claim", "record_attempt", "fail_attempt"],
                           "verifier": ["accept", "reject"]}[role]
            rows = ctx.sql("SELECT min(created_at) AS t FROM ledger.campaign_event WHERE created_at > %s "
                           "AND type = 'transition' AND payload->>'transition' = ANY(%s)", when, transitions)
        return rows[0]["t"]
