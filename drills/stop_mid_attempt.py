"""stop-mid-attempt: abandon a running campaign -> the attempt process is gone
within one heartbeat, no result is recorded, the state is abandoned."""

from __future__ import annotations

import signal
import time

from ledger.ops.drill import Drill, DrillContext, host_pid, process_gone

from .workshop import WORKER_ARGS, open_campaigns, setup, started

HEARTBEAT_S = 0.5


class StopMidAttempt(Drill):
    name = "stop-mid-attempt"
    summary = "abandon a running campaign -> its attempt dies within a heartbeat, nothing recorded"

    async def run(self, ctx: DrillContext) -> None:
        await setup(ctx, {"default": [["child"], ["write", "fix.txt", "x"], ["block"], ["exit", 0]]},
                    heartbeat_s=HEARTBEAT_S)
        [cid] = await open_campaigns(ctx)
        worker = ctx.spawn("worker", *WORKER_ARGS)
        await ctx.until(started(ctx, cid, 1).exists, "the attempt to start")
        command = host_pid(started(ctx, cid, 1).read_text())
        child = host_pid(ctx.marker("child", cid, 1).read_text())
        cut = ctx.sql("SELECT max(seq) AS s FROM ledger.campaign_event WHERE campaign_id = %s", cid)[0]["s"]
        began = time.monotonic()
        await (await ctx.kernel("operator")).abandon(cid, "drill: stop", "drill-operator")
        ctx.step("fault: an operator abandons the running campaign")
        await ctx.until(lambda: process_gone(command), "the attempt command to die", timeout=10, interval=0.02)
        took = time.monotonic() - began
        ctx.expect(process_gone(command) and took < HEARTBEAT_S + 1.0,
                   "the attempt process is gone within one heartbeat", f"{took:.2f}s (heartbeat {HEARTBEAT_S:g}s)")
        ctx.expect(await ctx.until(lambda: process_gone(child), "its child to die"), "so is the process it started")
        ctx.expect(ctx.state(cid) == "abandoned", "the campaign is abandoned")
        ctx.expect([a["outcome"] for a in ctx.attempts(cid)] == ["abandoned"], "no result was recorded")
        after = ctx.sql("SELECT type FROM ledger.campaign_event WHERE campaign_id = %s AND seq > %s", cid, cut)
        ctx.expect([r["type"] for r in after] == ["transition"], "the journal ends with the abandon itself")
        worker.signal(signal.SIGTERM)
        ctx.expect(worker.wait(20) == 0, "the worker stops cleanly")
