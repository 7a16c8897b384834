"""database-restart: restart PostgreSQL mid-attempt -> workers, verifier,
dispatcher and sensors reconnect by themselves; nothing is lost or doubled; the
attempt either completes or is recorded lost and retried. Runs on a throwaway
cluster of its own (it restarts the server)."""

from __future__ import annotations

import json
import signal
import time

from ledger.ops.drill import Drill, DrillContext, drill_python

from .workshop import CLASS, WORKER_ARGS, content_check, one_ending_per_attempt, setup


class DatabaseRestart(Drill):
    name = "database-restart"
    summary = "restart PostgreSQL mid-attempt -> every process reconnects; the loop still closes, once"
    own_cluster = True

    async def run(self, ctx: DrillContext) -> None:
        # The sensor's check runs in an export of main (target repo#main): it
        # passes once the fix is there.
        check_main = [drill_python(), "-c", "import pathlib, sys; p = pathlib.Path('fix.txt'); "
                      "sys.exit(0 if p.exists() and p.read_text() == 'good' else 1)"]
        sensor = (f"\n[sensors.main]\ntarget = \"repo#main\"\nevery_s = 1.0\nclass = \"{CLASS}\"\n"
                  f"command = {json.dumps(check_main)}\n")
        config, repo = await setup(ctx, {"1": [["write", "fix.txt", "good"], ["block"], ["exit", 0]],
                                         "default": [["write", "fix.txt", "good"], ["exit", 0]]},
                                   lease_s=10.0, heartbeat_s=1.0, promote=True,
                                   acceptance=[content_check("fix.txt", "good")], sensor=sensor)
        procs = [ctx.spawn("sensor", "sensor", "run"), ctx.spawn("worker", *WORKER_ARGS),
                 ctx.spawn("verifier", "verifier", "--poll", "0.5"),
                 ctx.spawn("dispatcher", "dispatcher", "--poll", "0.5")]
        started = await ctx.until(lambda: list(ctx.markers.glob("started-*-1")), "attempt 1 to start", timeout=30)
        if not started:
            raise RuntimeError("no attempt started before the restart")
        cid = int(next(ctx.markers.glob("started-*-1")).name.split("-")[1])
        began = time.monotonic()
        ctx.restart_server()
        ctx.step(f"fault: PostgreSQL restarted (fast shutdown) in {time.monotonic() - began:.2f}s, mid-attempt")
        ctx.marker("release", cid, 1).write_text("go")
        closed = await ctx.until(lambda: ctx.state(cid) == "confirmed", "the loop to close after the restart",
                                 timeout=90, interval=0.25)
        ctx.expect(closed, "the campaign was verified, promoted and confirmed after the restart",
                   ctx.state(cid))
        ctx.expect(all(p.popen.poll() is None for p in procs),
                   "every process survived the restart and reconnected by itself",
                   str({p.name: p.popen.poll() for p in procs}))
        ctx.expect(ctx.sql("SELECT count(*) AS n FROM ledger.campaign")[0]["n"] == 1, "nothing was doubled: one campaign")
        outcomes = [a["outcome"] for a in ctx.attempts(cid)]
        ctx.expect(outcomes in (["attempted"], ["lost", "attempted"]),
                   "the attempt completed, or was recorded lost and retried", str(outcomes))
        ctx.expect(one_ending_per_attempt(ctx), "every attempt has exactly one ending")
        dup_ticks = ctx.sql("SELECT count(*) AS n FROM (SELECT tick FROM ledger.observation WHERE tick IS NOT NULL "
                            "GROUP BY tick HAVING count(*) > 1) t")[0]["n"]
        ctx.expect(dup_ticks == 0, "no tick was observed twice")
        effects = ctx.sql("SELECT state FROM ledger.side_effect")
        ctx.expect([e["state"] for e in effects] == ["done"], "one promotion, done", str(effects))
        for p in procs:
            p.signal(signal.SIGTERM)
        ctx.expect(all(p.wait(30) == 0 for p in procs), "everything stops cleanly")
