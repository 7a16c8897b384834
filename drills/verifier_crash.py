"""verifier-crash: SIGKILL the verifier mid-check -> its claim lapses, another
verifier finishes, exactly one verdict."""

from __future__ import annotations

import signal

from ledger.ops.drill import Drill, DrillContext, drill_python

from .workshop import WORKER_ARGS, open_campaigns, setup

LEASE_S = 2.0


class VerifierCrash(Drill):
    name = "verifier-crash"
    summary = "SIGKILL the verifier mid-check -> its claim lapses, a second verifier gives one verdict"

    async def run(self, ctx: DrillContext) -> None:
        # in the one host directory the acceptance's cell may write
        gate = ctx.markers / "checks-may-finish"
        marker = ctx.markers / "check-started"
        check = [drill_python(), "-c",
                 f"import pathlib, time\npathlib.Path({str(marker)!r}).touch()\n"
                 f"while not pathlib.Path({str(gate)!r}).exists(): time.sleep(0.02)"]
        await setup(ctx, {"default": [["write", "fix.txt", "x"], ["exit", 0]]}, acceptance=[check])
        [cid] = await open_campaigns(ctx)
        worker = ctx.spawn("worker", *WORKER_ARGS)
        await ctx.until(lambda: ctx.state(cid) == "attempted", "a candidate to verify")
        first = ctx.spawn("verifier-1", "verifier", "--poll", "0.2", "--lease", str(LEASE_S))
        if not await ctx.until(marker.exists, "verifier-1 to start checking"):
            raise RuntimeError("the check never started")
        first.signal(signal.SIGKILL)
        ctx.step("fault: SIGKILL verifier-1 mid-check")
        gate.touch()
        second = ctx.spawn("verifier-2", "verifier", "--poll", "0.2", "--lease", str(LEASE_S))
        done = await ctx.until(lambda: ctx.state(cid) in ("verified", "ready"), "a verdict", timeout=30)
        ctx.expect(done and ctx.state(cid) == "verified", "the second verifier finished the check")
        rows = ctx.sql("SELECT verifier, status FROM ledger.verification WHERE campaign_id = %s ORDER BY id", cid)
        statuses = [r["status"] for r in rows]
        ctx.expect(statuses == ["lost", "accepted"], "the lapsed claim is lost; exactly one verdict", str(statuses))
        ctx.expect(len({r["verifier"] for r in rows}) == 2, "two different verifiers took part")
        for p in (worker, second):
            p.signal(signal.SIGTERM)
        ctx.expect(worker.wait(20) == 0 and second.wait(20) == 0, "the survivors stop cleanly")
