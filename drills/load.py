"""load: 16 workers in 4 processes, 2,000 campaigns with random attempt
outcomes, random SIGKILLs of workers every few seconds for a bounded time ->
every campaign ends in a legal state, no campaign ever had two concurrent
leases (checked from the journal), every attempt has exactly one ending,
journal seqs are gap-free. ``--scale`` shrinks it (CI runs it small)."""

from __future__ import annotations

import asyncio
import random
import signal
import time
from collections import defaultdict

from ledger.drill import Drill, DrillContext, Proc, UnderExercised

from .workshop import CLASS, setup

PROCESSES, CONCURRENCY = 4, 4
ENDINGS = {"record_attempt", "fail_attempt", "expire_lease", "abandon"}


class Load(Drill):
    name = "load"
    summary = "16 workers, random outcomes, random SIGKILLs -> legal states, one lease at a time, gap-free"

    async def run(self, ctx: DrillContext) -> None:
        campaigns = max(40, int(2000 * ctx.scale))
        chaos_s = max(8.0, 60.0 * ctx.scale)
        await setup(ctx, {"default": [["random", 0.5]]}, lease_s=2.0, heartbeat_s=0.4, max_attempts=3)
        ctx.sql("SELECT ledger_api.open_campaign(%s, 'load-' || i, 'repo') FROM generate_series(1, %s) i",
                CLASS, campaigns)
        ctx.step(f"opened {campaigns} campaigns; attempts succeed or fail at random")
        args = ("worker", "--concurrency", str(CONCURRENCY), "--poll", "0.3", "--grace", "0.3")
        workers: list[Proc] = [ctx.spawn(f"worker-{i}", *args) for i in range(PROCESSES)]
        kills, respawns = 0, 0
        chaos_end = time.monotonic() + chaos_s
        while time.monotonic() < chaos_end:
            await asyncio.sleep(random.uniform(1.0, 3.0))  # the chaos cadence itself
            victim = random.randrange(PROCESSES)
            workers[victim].signal(signal.SIGKILL)
            workers[victim].wait(10)
            kills += 1
            workers[victim] = ctx.spawn(f"worker-{victim}-{respawns}", *args)
            respawns += 1
        ctx.step(f"chaos over: {kills} SIGKILLs in {chaos_s:g}s; letting the fleet finish")
        settled = await ctx.until(lambda: ctx.sql(
            "SELECT count(*) AS n FROM ledger.campaign WHERE state IN ('ready', 'leased')")[0]["n"] == 0,
            "every campaign to come to rest", timeout=max(60.0, campaigns * 0.2), interval=0.5)
        ctx.expect(settled, "every campaign came to rest (attempted or exhausted)")
        for w in workers:
            w.signal(signal.SIGTERM)
        codes = [w.wait(30) for w in workers]
        ctx.expect(codes == [0] * PROCESSES, "the surviving workers drain and exit 0", str(codes))

        lost = ctx.sql("SELECT count(*) AS n FROM ledger.attempt WHERE outcome = 'lost'")[0]["n"]
        states = {r["state"]: r["n"] for r in ctx.sql("SELECT state, count(*) AS n FROM ledger.campaign GROUP BY 1")}
        ctx.step(f"states {states}; {lost} attempt(s) lost to SIGKILL")
        ctx.expect(set(states) <= {"attempted", "exhausted"}, "every campaign is in a legal resting state")
        violations = self.double_leases(ctx)
        ctx.expect(violations == [], "no campaign ever had two concurrent leases (per the journal)",
                   f"{len(violations)} violation(s) {violations[:3]}")
        claims = ctx.sql("SELECT count(*) AS n FROM ledger.campaign_event WHERE type = 'transition' "
                         "AND payload->>'transition' = 'claim'")[0]["n"]
        attempts = ctx.sql("SELECT count(*) AS n, count(*) FILTER (WHERE outcome = 'running') AS running "
                           "FROM ledger.attempt")[0]
        ctx.expect(attempts["running"] == 0 and attempts["n"] == claims,
                   "every attempt (one per claim) has exactly one ending",
                   f"{attempts['n']} attempts, {claims} claims, {attempts['running']} running")
        gaps = ctx.sql("SELECT count(*) AS n FROM (SELECT campaign_id FROM ledger.campaign_event GROUP BY 1 "
                       "HAVING count(*) <> max(seq) OR min(seq) <> 1) g")[0]["n"]
        ctx.expect(gaps == 0, "journal seqs are gap-free for every campaign")
        if lost == 0:
            raise UnderExercised("no SIGKILL landed on an attempt in flight; run longer or larger")

    @staticmethod
    def double_leases(ctx: DrillContext) -> list[tuple[int, int]]:
        leased: dict[int, bool] = defaultdict(bool)
        bad = []
        for e in ctx.sql("SELECT campaign_id, seq, payload->>'transition' AS t FROM ledger.campaign_event "
                         "WHERE type = 'transition' ORDER BY campaign_id, seq"):
            if e["t"] == "claim":
                if leased[e["campaign_id"]]:
                    bad.append((e["campaign_id"], e["seq"]))
                leased[e["campaign_id"]] = True
            elif e["t"] in ENDINGS:
                if not leased[e["campaign_id"]]:
                    bad.append((e["campaign_id"], e["seq"]))
                leased[e["campaign_id"]] = False
        return bad
