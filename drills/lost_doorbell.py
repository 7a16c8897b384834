"""lost-doorbell: terminate the hub's LISTEN backend and open campaigns while it
is gone (their NOTIFYs reach nobody) -> every campaign is still claimed, within
the poll tick, and the hub reconnects."""

from __future__ import annotations

import signal
import time

from ledger.ops.drill import Drill, DrillContext

from .workshop import open_campaigns, setup

POLL_S = 2.0
LISTENERS = ("SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
             "AND application_name = 'ledger:reader'")


class LostDoorbell(Drill):
    name = "lost-doorbell"
    summary = "kill the LISTEN connection and lose NOTIFYs -> claims still happen within the poll tick"

    async def run(self, ctx: DrillContext) -> None:
        n = max(2, int(6 * ctx.scale))
        await setup(ctx, {"default": [["write", "fix.txt", "x"], ["exit", 0]]})
        worker = ctx.spawn("worker", "worker", "--poll", str(POLL_S), "--concurrency", "2")
        if not await ctx.until(lambda: ctx.sql(LISTENERS), "the worker's hub to LISTEN"):
            raise RuntimeError("the worker never listened")
        before = {r["pid"] for r in ctx.sql(LISTENERS)}
        ctx.sql("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() "
                "AND application_name = 'ledger:reader'")
        ctx.step(f"fault: terminated the hub's LISTEN backend(s) {sorted(before)}")
        began = time.monotonic()
        cids = await open_campaigns(ctx, n)  # their NOTIFYs go to a hub that is not there
        claimed = await ctx.until(lambda: ctx.sql(
            "SELECT count(*) AS n FROM ledger.campaign WHERE id = ANY(%s) AND state <> 'ready'", cids)[0]["n"] == n,
            "every campaign to be claimed", timeout=POLL_S * 5)
        elapsed = time.monotonic() - began
        ctx.expect(claimed, f"all {n} campaigns were claimed despite the lost doorbell")
        ctx.expect(elapsed < POLL_S * 2 + 1, "within the poll tick", f"{elapsed:.2f}s, tick {POLL_S:g}s")
        reconnected = await ctx.until(lambda: {r["pid"] for r in ctx.sql(LISTENERS)} - before, "a new LISTEN backend")
        ctx.expect(reconnected, "the hub reconnected")
        [late] = await open_campaigns(ctx, 1, prefix="after")
        began = time.monotonic()
        woken = await ctx.until(lambda: ctx.state(late) != "ready", "the claim after reconnect", timeout=POLL_S * 3)
        ctx.expect(woken and time.monotonic() - began < POLL_S,
                   "wake-ups are back: a new campaign is claimed faster than the poll tick",
                   f"{time.monotonic() - began:.2f}s")
        worker.signal(signal.SIGTERM)
        ctx.expect(worker.wait(30) == 0, "the worker stops cleanly")
