"""dispatcher-crash: SIGKILL the dispatcher between the git update and its
record -> the next dispatcher reads the target back and completes the intent;
the ref moved exactly once."""

from __future__ import annotations

import signal
import subprocess

from ledger.ops.drill import Drill, DrillContext

from .workshop import WORKER_ARGS, content_check, open_campaigns, setup


class DispatcherCrash(Drill):
    name = "dispatcher-crash"
    summary = "SIGKILL the dispatcher after the git update, before the record -> read-back completes it once"

    async def run(self, ctx: DrillContext) -> None:
        _, repo = await setup(ctx, {"default": [["write", "fix.txt", "good"], ["exit", 0]]},
                              acceptance=[content_check("fix.txt", "good")], promote=True)
        [cid] = await open_campaigns(ctx)
        worker = ctx.spawn("worker", *WORKER_ARGS)
        verifier = ctx.spawn("verifier", "verifier", "--poll", "0.3")
        if not await ctx.until(lambda: ctx.state(cid) == "verified", "the candidate to be verified", timeout=40):
            raise RuntimeError("nothing was verified, so nothing to promote")
        faults = ctx.workspace / "faults"
        first = ctx.spawn("dispatcher-1", "dispatcher", "--poll", "0.2", "--lease", "2", "--http-timeout", "0.5",
                          LEDGER_FAULT_POINTS="dispatcher.after_action", LEDGER_FAULT_DIR=str(faults))
        reached = await ctx.until((faults / "dispatcher.after_action.reached").exists,
                                  "dispatcher-1 to move the ref", timeout=20)
        if not reached:
            raise RuntimeError("the dispatcher never reached its action")
        first.signal(signal.SIGKILL)
        ctx.step("fault: SIGKILL dispatcher-1 after update-ref, before recording it")
        effect = ctx.sql("SELECT state FROM ledger.side_effect WHERE campaign_id = %s", cid)[0]["state"]
        ctx.expect(effect == "claimed", "the intent is still claimed: the database never heard of the update")
        second = ctx.spawn("dispatcher-2", "dispatcher", "--poll", "0.2", "--lease", "2", "--http-timeout", "0.5")
        done = await ctx.until(lambda: ctx.sql("SELECT state FROM ledger.side_effect WHERE campaign_id = %s",
                                               cid)[0]["state"] == "done", "the intent to be completed", timeout=30)
        ctx.expect(done, "dispatcher-2 completed the intent")
        row = ctx.sql("SELECT result, tries FROM ledger.side_effect WHERE campaign_id = %s", cid)[0]
        ctx.expect(bool(row["result"].get("already_applied")), "by reading the target back, not by acting again",
                   str(row["result"]))
        reflog = subprocess.run(["git", "-C", str(repo), "reflog", "show", "refs/heads/main"],
                                capture_output=True, text=True).stdout
        ctx.expect(reflog.count("ledger promotion") == 1, "refs/heads/main moved exactly once",
                   f"{reflog.count('ledger promotion')} promotion(s) in the reflog")
        promoted = ctx.sql("SELECT promoted_sha FROM ledger.campaign WHERE id = %s", cid)[0]["promoted_sha"]
        main = subprocess.run(["git", "-C", str(repo), "rev-parse", "main"], capture_output=True,
                              text=True).stdout.strip()
        ctx.expect(promoted == main, "the campaign knows where main is now")
        for p in (worker, verifier, second):
            p.signal(signal.SIGTERM)
        ctx.expect(all(p.wait(20) == 0 for p in (worker, verifier, second)), "the survivors stop cleanly")
