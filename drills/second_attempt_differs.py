"""second-attempt-differs: force attempt 1 to fail -> a repeat of its
approach is refused and a different approach succeeds."""

from __future__ import annotations

import signal

from ledger.ops.drill import Drill, DrillContext

from .workshop import WORKER_ARGS, content_check, open_campaigns, setup


class SecondAttemptDiffers(Drill):
    name = "second-attempt-differs"
    summary = "attempt 1 fails -> the same approach again is refused; a different one is verified"

    async def run(self, ctx: DrillContext) -> None:
        await setup(ctx, {"1": [["write", "fix.txt", "same"], ["exit", 1]],
                          "2": [["write", "fix.txt", "same"], ["exit", 0]],
                          "3": [["write", "fix.txt", "different"], ["exit", 0]]},
                    acceptance=[content_check("fix.txt", "different")])
        [cid] = await open_campaigns(ctx)
        worker = ctx.spawn("worker", *WORKER_ARGS)
        verifier = ctx.spawn("verifier", "verifier", "--poll", "0.3")
        done = await ctx.until(lambda: ctx.state(cid) == "verified", "the campaign to be verified", timeout=40)
        ctx.expect(done, "the campaign was verified")
        a = ctx.attempts(cid)
        ctx.expect([x["outcome"] for x in a] == ["failed", "failed", "attempted"],
                   "attempts: failed, refused, recorded", str([x["outcome"] for x in a]))
        if len(a) == 3:
            ctx.expect(a[0]["fingerprint"] == a[1]["fingerprint"] and "must differ" in (a[1]["failure_reason"] or ""),
                       "the repeat of attempt 1's approach was refused by the kernel", a[1]["failure_reason"] or "")
            ctx.expect(a[2]["fingerprint"] not in (a[0]["fingerprint"], None), "attempt 3 took another approach")
            ctx.expect(a[2]["verdict"] == "accepted", "the different approach was accepted")
        for p in (worker, verifier):
            p.signal(signal.SIGTERM)
        ctx.expect(worker.wait(20) == 0 and verifier.wait(20) == 0, "worker and verifier stop cleanly")
