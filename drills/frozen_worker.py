"""frozen-worker: the sole worker is SIGSTOPped past its lease with no other
process running -- no reaper anywhere -- then SIGCONT. Its lease expired by
the database's clock, so every write of its generation is refused although
nobody reaped it; the worker resumes, writes nothing more for that lease, and
the campaign is claimed again under a new generation."""

from __future__ import annotations

import signal

from ledger.errors import StaleLease
from ledger.ops.drill import Drill, DrillContext, UnderExercised

from .workshop import open_campaigns, setup, started


class FrozenWorker(Drill):
    name = "frozen-worker"
    summary = ("the only worker (and so the only reaper) SIGSTOPped past its lease, then SIGCONT -> "
               "its writes are refused unreaped; the campaign is claimed again")

    async def run(self, ctx: DrillContext) -> None:
        await setup(ctx, {"1": [["write", "fix.txt", "frozen"], ["block"], ["exit", 0]],
                          "default": [["write", "fix.txt", "later"], ["exit", 0]]},
                    lease_s=2.0, heartbeat_s=0.4)
        [cid] = await open_campaigns(ctx)
        # its own reaper ticks every 5 s with a 5 s grace: the expiry alone must fence it
        worker = ctx.spawn("worker", "worker", "--poll", "0.3", "--grace", "5")
        await ctx.until(started(ctx, cid, 1).exists, "attempt 1 to start")
        generation = ctx.attempts(cid)[0]["generation"]
        worker.signal(signal.SIGSTOP)
        ctx.step(f"fault: SIGSTOP the only worker (pid {worker.pid}), holding generation {generation}")
        expired = await ctx.until(
            lambda: ctx.sql("SELECT lease_expires_at < now() AS e FROM ledger.campaign WHERE id = %s",
                            cid)[0]["e"], "the lease to expire by the database's clock", timeout=20)
        if not expired or ctx.state(cid) != "leased":
            raise UnderExercised("the lease did not sit expired and unreaped")
        ctx.step("the lease has expired; nothing has reaped it (the campaign is still leased)")
        cut = ctx.sql("SELECT max(seq) AS s FROM ledger.campaign_event WHERE campaign_id = %s", cid)[0]["s"]
        kernel = await ctx.kernel("worker")
        refused = []
        for what, call in [
            ("heartbeat", lambda: kernel.heartbeat(cid, generation)),
            ("journal", lambda: kernel.append_events(cid, generation, [{"type": "output", "payload": {}}])),
            ("record", lambda: kernel.record_attempt(cid, generation, base_sha="a" * 40, candidate_sha="b" * 40,
                                                     fingerprint="sha256:frozenfrozen")),
            ("fail", lambda: kernel.fail_attempt(cid, generation, "frozen")),
        ]:
            try:
                await call()
            except StaleLease:
                refused.append(what)
        ctx.expect(refused == ["heartbeat", "journal", "record", "fail"],
                   "every write of the expired, unreaped generation is refused", str(refused))
        ctx.expect(ctx.state(cid) == "leased", "and none of them moved the campaign")
        ctx.marker("release", cid, 1).write_text("go")  # its command ends with a change to record
        worker.signal(signal.SIGCONT)
        ctx.step("SIGCONT: the worker resumes with a finished attempt in hand")
        again = await ctx.until(
            lambda: ctx.sql("SELECT count(*) AS n FROM ledger.attempt WHERE campaign_id = %s "
                            "AND generation > %s", cid, generation)[0]["n"] > 0,
            "the campaign to be claimed again under a new generation", timeout=30)
        ctx.expect(again, "the campaign was claimed again (a new generation)")
        later = ctx.sql("SELECT seq, type FROM ledger.campaign_event WHERE campaign_id = %s AND seq > %s "
                        "AND generation = %s", cid, cut, generation)
        ctx.expect(later == [], "the resumed worker wrote nothing for its expired lease", str(later))
        ctx.expect(ctx.attempts(cid)[0]["outcome"] == "lost", "attempt 1 is recorded as lost, by the reaper")
        log = worker.output()
        ctx.expect("self-fenced" in log or "standing down" in log,
                   "the worker stood down on its own (its log says so)")
        worker.signal(signal.SIGTERM)
        ctx.expect(worker.wait(30) == 0, "it then stops cleanly")
