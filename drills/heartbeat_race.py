"""heartbeat-vs-reaper: the worker heartbeats between the reaper's read and
its write -> the run is not reaped. Forced deterministically: the heartbeat
holds the row lock while the reaper's UPDATE (which already read the lease as
expired) waits for it; the clock is pinned on both sides."""

from __future__ import annotations

import asyncio
from datetime import timedelta

from ledger import Kernel
from ledger.ops.drill import Drill, DrillContext

from .workshop import CLASS, open_campaigns, setup


class HeartbeatRace(Drill):
    name = "heartbeat-vs-reaper"
    summary = "a heartbeat lands between the reaper's read and write -> not reaped"

    async def run(self, ctx: DrillContext) -> None:
        await setup(ctx, {}, lease_s=30.0, heartbeat_s=5.0)
        for renew in (True, False):
            [cid] = await open_campaigns(ctx, prefix=f"race-{renew}")
            claim = await (await ctx.kernel("worker")).claim_campaign("drill-worker", [CLASS])
            assert claim is not None and claim.campaign_id == cid
            leased_at = ctx.sql("SELECT leased_at FROM ledger.campaign WHERE id = %s", cid)[0]["leased_at"]
            await ctx.kernel("reaper")
            worker_s, reaper_s = ctx._sessions["worker"], ctx._sessions["reaper"]
            # The heartbeat lands while the lease is still live (25 s of 30);
            # the reaper's clock reads it as expired (45 s) but not the renewed
            # one (25 + 30 = 55 s).
            async with worker_s.transaction(now=leased_at + timedelta(seconds=25)) as wtx:
                if renew:
                    await Kernel(wtx).heartbeat(cid, claim.generation)
                    ctx.step("worker heartbeats (uncommitted: it holds the row)")

                async def reap() -> list:
                    async with reaper_s.transaction(now=leased_at + timedelta(seconds=45)) as rtx:
                        return await Kernel(rtx).expire_leases()
                reaping = asyncio.create_task(reap())
                if renew:
                    blocked = await ctx.until(lambda: ctx.sql(
                        "SELECT count(*) AS n FROM pg_stat_activity WHERE datname = current_database() "
                        "AND application_name = 'ledger:reaper' AND wait_event_type = 'Lock'")[0]["n"] > 0,
                        "the reaper to read the lease as expired and wait at its write", timeout=10)
                    if not blocked:
                        raise RuntimeError("the race could not be staged")
                    ctx.step("the reaper read the lease as expired and waits to write")
                else:
                    await asyncio.wait_for(asyncio.shield(reaping), 10)
            reaped = [r.campaign_id for r in await reaping]
            state = ctx.state(cid)
            if renew:
                ctx.expect(reaped == [] and state == "leased",
                           "a lease renewed between the reaper's read and write is not reaped", state)
            else:
                ctx.expect(reaped == [cid] and state == "ready",
                           "control: the same lease without the heartbeat is reaped", state)
            await (await ctx.kernel("operator")).abandon(cid, "drill done")
