"""zombie-worker: SIGSTOP a worker past its lease, reap, SIGCONT -> every write
of the zombie's lease is refused (state, journal, outbox) and its worktree is
removed."""

from __future__ import annotations

import signal

from ledger.errors import StaleLease
from ledger.ops.drill import Drill, DrillContext

from .workshop import WORKER_ARGS, open_campaigns, setup, started


class ZombieWorker(Drill):
    name = "zombie-worker"
    summary = "SIGSTOP past the lease, reap, SIGCONT -> the zombie writes nothing, removes its worktree"

    async def run(self, ctx: DrillContext) -> None:
        await setup(ctx, {"1": [["write", "fix.txt", "zombie"], ["lines", 20], ["block"], ["exit", 0]],
                          "default": [["exit", 1]]}, lease_s=2.0, heartbeat_s=0.4)
        [cid] = await open_campaigns(ctx)
        zombie = ctx.spawn("worker", *WORKER_ARGS)
        await ctx.until(started(ctx, cid, 1).exists, "attempt 1 to start")
        generation = ctx.attempts(cid)[0]["generation"]
        zombie.signal(signal.SIGSTOP)
        ctx.step(f"fault: SIGSTOP the worker (pid {zombie.pid}) holding generation {generation}")
        reaper = await ctx.kernel("reaper")

        async def reaped() -> bool:
            return any(r.campaign_id == cid for r in await reaper.expire_leases(0.5))
        if not await ctx.until(reaped, "the lease to lapse and be reaped", timeout=20):
            ctx.expect(False, "the stopped worker's lease was reaped")
            return
        ctx.step("reaped; the campaign is ready under a new generation")
        cut = ctx.sql("SELECT max(seq) AS s FROM ledger.campaign_event WHERE campaign_id = %s", cid)[0]["s"]
        worker = await ctx.kernel("worker")
        refused = []
        for what, call in [
            ("heartbeat", lambda: worker.heartbeat(cid, generation)),
            ("record", lambda: worker.record_attempt(cid, generation, base_sha="a" * 40, candidate_sha="b" * 40,
                                                     fingerprint="sha256:zombiezombie")),
            ("journal", lambda: worker.append_events(cid, generation, [{"type": "output", "payload": {}}])),
            ("outbox", lambda: worker.request_side_effect(cid, generation, kind="git.update_ref",
                                                          target="refs/heads/ledger/z", precondition={},
                                                          idempotency_key="zombie")),
        ]:
            try:
                await call()
            except StaleLease:
                refused.append(what)
        ctx.expect(refused == ["heartbeat", "record", "journal", "outbox"],
                   "state, journal and outbox writes with the zombie's generation are refused", str(refused))
        ctx.marker("release", cid, 1).write_text("go")  # its command finishes with a change to record
        zombie.signal(signal.SIGCONT)
        ctx.step("SIGCONT: the zombie wakes up with a finished attempt in hand")
        gone = await ctx.until(lambda: not any((ctx.data_dir / "attempts").glob(f"{cid}-1-*")),
                               "the zombie to remove its worktree", timeout=20)
        ctx.expect(gone, "the zombie removed its worktree")
        later = ctx.sql("SELECT seq, type FROM ledger.campaign_event WHERE campaign_id = %s AND seq > %s "
                        "AND generation = %s", cid, cut, generation)
        ctx.expect(later == [], "the zombie's lease wrote nothing to the journal after its reap", str(later))
        ctx.expect(ctx.attempts(cid)[0]["outcome"] == "lost", "its attempt stays recorded as lost")
        ctx.expect(ctx.sql("SELECT count(*) AS n FROM ledger.side_effect")[0]["n"] == 0, "no intent was recorded")
        log = zombie.output()
        ctx.expect("standing down" in log or "self-fenced" in log,
                   "the zombie stood down, told by the database or by its own clock (its log says so)")
        zombie.signal(signal.SIGTERM)
        ctx.expect(zombie.wait(20) == 0, "it then stops cleanly")
