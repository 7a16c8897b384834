"""bad-patch: a candidate that breaks acceptance is rejected with evidence; a
good one is accepted; only then is the campaign verified."""

from __future__ import annotations

import signal

from ledger.ops.drill import Drill, DrillContext

from .workshop import WORKER_ARGS, content_check, open_campaigns, setup


class BadPatch(Drill):
    name = "bad-patch"
    summary = "a breaking candidate is rejected with evidence; a good one is accepted; then verified"

    async def run(self, ctx: DrillContext) -> None:
        await setup(ctx, {"1": [["write", "fix.txt", "broken"], ["exit", 0]],
                          "2": [["write", "fix.txt", "good"], ["exit", 0]]},
                    acceptance=[content_check("fix.txt", "good")])
        [cid] = await open_campaigns(ctx)
        worker = ctx.spawn("worker", *WORKER_ARGS)
        verifier = ctx.spawn("verifier", "verifier", "--poll", "0.3")
        ctx.expect(await ctx.until(lambda: ctx.state(cid) == "verified", "a verdict", timeout=40),
                   "the campaign ended verified")
        rows = ctx.sql("SELECT v.status, v.reason, v.evidence, a.attempt_no FROM ledger.verification v "
                       "JOIN ledger.attempt a ON a.id = v.attempt_id WHERE v.campaign_id = %s ORDER BY v.id", cid)
        ctx.expect([(r["attempt_no"], r["status"]) for r in rows] == [(1, "rejected"), (2, "accepted")],
                   "attempt 1 rejected, attempt 2 accepted", str([(r["attempt_no"], r["status"]) for r in rows]))
        if rows:
            evidence = str(rows[0]["evidence"])
            ctx.expect("exit_code" in evidence and "broken" in evidence,
                       "the rejection kept its evidence (command, exit code, output)")
        t = ctx.transitions(cid)
        ctx.expect(t.index("accept") > t.index("reject") and t.count("accept") == 1,
                   "verified only after the good candidate", str(t))
        for p in (worker, verifier):
            p.signal(signal.SIGTERM)
        ctx.expect(worker.wait(20) == 0 and verifier.wait(20) == 0, "worker and verifier stop cleanly")
