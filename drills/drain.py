"""drain: SIGTERM a busy worker -> in-flight attempts that finish within the
drain budget are recorded, nothing new is claimed, exit 0; past the budget the
leftovers end ready, never stuck in leased."""

from __future__ import annotations

import signal

from ledger.ops.drill import Drill, DrillContext

from .workshop import open_campaigns, setup, started


class Drain(Drill):
    name = "drain"
    summary = "SIGTERM a busy worker -> short attempts finish, long ones are handed back, exit 0"

    async def run(self, ctx: DrillContext) -> None:
        await setup(ctx, {"default": [["write", "fix.txt", "x"], ["block"], ["exit", 0]]})
        quick, slow, waiting = await open_campaigns(ctx, 3)
        worker = ctx.spawn("worker", "worker", "--concurrency", "2", "--poll", "0.3", "--drain-timeout", "3")
        both = await ctx.until(lambda: started(ctx, quick, 1).exists() and started(ctx, slow, 1).exists(),
                               "two attempts in flight")
        if not both:
            raise RuntimeError("the worker never got busy")
        worker.signal(signal.SIGTERM)
        ctx.step("fault: SIGTERM with two attempts in flight (budget 3 s)")
        await ctx.until(lambda: "stopping" in worker.output(), "the worker to begin stopping")
        ctx.marker("release", quick, 1).write_text("go")
        ctx.step(f"campaign {quick}'s attempt finishes inside the budget; {slow}'s never does")
        code = worker.wait(30)
        ctx.expect(code == 0, "the worker exits 0", f"exit {code}")
        ctx.expect(ctx.state(quick) == "attempted", "the attempt that finished in time was recorded")
        ctx.expect(ctx.state(slow) == "ready" and [a["outcome"] for a in ctx.attempts(slow)] == ["drained"],
                   "the one past the budget was handed back as ready, not left leased")
        ctx.expect(ctx.sql("SELECT attempt_count FROM ledger.campaign WHERE id = %s", slow)[0]["attempt_count"] == 0,
                   "a drained attempt does not use up the budget")
        ctx.expect(ctx.attempts(waiting) == [], "nothing new was claimed while draining")
        ctx.expect(ctx.sql("SELECT count(*) AS n FROM ledger.campaign WHERE state = 'leased'")[0]["n"] == 0,
                   "no campaign is stuck in leased")
