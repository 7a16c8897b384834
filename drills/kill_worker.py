"""kill-worker: SIGKILL the worker mid-attempt -> the lease is reclaimed after
lease + grace, another worker finishes, the killed attempt is recorded lost,
one ending per attempt."""

from __future__ import annotations

import signal
import time

from ledger.ops.drill import Drill, DrillContext, host_pid, process_gone

from .workshop import WORKER_ARGS, one_ending_per_attempt, open_campaigns, setup, started

LEASE_S = 3.0


class KillWorker(Drill):
    name = "kill-worker"
    summary = "SIGKILL a worker mid-attempt -> attempt lost, campaign finished by another worker"

    async def run(self, ctx: DrillContext) -> None:
        await setup(ctx, {"1": [["write", "fix.txt", "one"], ["block"], ["exit", 0]],
                          "2": [["write", "fix.txt", "two"], ["exit", 0]]}, lease_s=LEASE_S)
        [cid] = await open_campaigns(ctx)
        first = ctx.spawn("worker-1", *WORKER_ARGS)
        await ctx.until(started(ctx, cid, 1).exists, "attempt 1 to start")
        command = host_pid(started(ctx, cid, 1).read_text())
        first.signal(signal.SIGKILL)
        killed_at = time.monotonic()
        ctx.step(f"fault: SIGKILL worker-1 (pid {first.pid}) mid-attempt")
        ctx.expect(await ctx.until(lambda: process_gone(command), "the attempt command to die", timeout=10),
                   "the attempt command died with its worker")
        second = ctx.spawn("worker-2", *WORKER_ARGS)
        reclaimed = await ctx.until(lambda: ctx.attempts(cid)[0]["outcome"] == "lost", "the lease to be reaped",
                                    timeout=30)
        ctx.expect(reclaimed, "the killed attempt was recorded as lost")
        ctx.expect(time.monotonic() - killed_at >= LEASE_S * 0.5,
                   "not reclaimed before its lease could lapse", f"{time.monotonic() - killed_at:.1f}s")
        done = await ctx.until(lambda: ctx.state(cid) == "attempted", "worker-2 to finish", timeout=30)
        ctx.expect(done, "another worker finished the campaign")
        ctx.expect([(a["attempt_no"], a["outcome"]) for a in ctx.attempts(cid)] == [(1, "lost"), (2, "attempted")],
                   "attempt 1 lost, attempt 2 recorded")
        ctx.expect(ctx.transitions(cid) == ["open", "claim", "expire_lease", "claim", "record_attempt"],
                   "the journal tells exactly that", str(ctx.transitions(cid)))
        ctx.expect(one_ending_per_attempt(ctx), "every attempt has exactly one ending")
        second.signal(signal.SIGTERM)
        ctx.expect(second.wait(20) == 0, "worker-2 stops cleanly")
