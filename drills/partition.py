"""partition: the network path between one worker and the database goes
silent mid-attempt (a TCP proxy that keeps both sockets open and drops every
byte: no reset, no error), while another worker and the database stay
connected. The partitioned worker stops its attempt before its lease expires
by the database's clock, the other worker claims and finishes the campaign,
the silent hub is noticed within its check interval, and when the path heals
the old worker writes nothing for its old lease, reconnects and takes new
work."""

from __future__ import annotations

import json
import signal
import time
from datetime import datetime

from ledger.ops.drill import Drill, DrillContext, UnderExercised, host_pid, process_gone
from ledger.ops.faultproxy import FaultProxy

from .workshop import open_campaigns, setup, started

LEASE_S, HEARTBEAT_S, HUB_PING_S = 4.0, 0.5, 2.0
WORKER = ("worker", "--poll", "0.3", "--grace", "0.5")


class Partition(Drill):
    name = "partition"
    summary = ("a worker's path to the database goes silent mid-attempt -> it stops before its lease "
               "expires, another finishes the campaign; healed, it writes nothing old and works again")

    async def run(self, ctx: DrillContext) -> None:
        await setup(ctx, {"1": [["write", "fix.txt", "partitioned"], ["block"], ["exit", 0]],
                          "default": [["write", "fix.txt", "fixed"], ["exit", 0]]},
                    lease_s=LEASE_S, heartbeat_s=HEARTBEAT_S)
        proxy = FaultProxy.before(ctx.db.url)
        try:
            await self._run(ctx, proxy)
        finally:
            proxy.stop()

    async def _run(self, ctx: DrillContext, proxy: FaultProxy) -> None:
        ping = {"LEDGER_HUB_PING_S": str(HUB_PING_S)}
        cut_off = ctx.spawn("worker-behind-proxy", *WORKER, LEDGER_DATABASE_URL=proxy.url(ctx.db.url), **ping)
        [cid] = await open_campaigns(ctx)
        if not await ctx.until(started(ctx, cid, 1).exists, "attempt 1 to start behind the proxy"):
            raise UnderExercised("the worker behind the proxy never started an attempt")
        command_pid = host_pid(started(ctx, cid, 1).read_text())
        [attempt] = ctx.attempts(cid)
        generation, holder = attempt["generation"], attempt["worker"]
        other = ctx.spawn("worker-direct", *WORKER, **ping)
        cut = ctx.sql("SELECT max(seq) AS s FROM ledger.campaign_event WHERE campaign_id = %s", cid)[0]["s"]
        proxy.silence()
        silenced = time.time()
        ctx.step(f"fault: the path of {holder} goes silent (generation {generation}, command pid {command_pid})")

        stopped = await ctx.until(lambda: process_gone(command_pid), "the partitioned attempt to stop",
                                  timeout=4 * LEASE_S, interval=0.02)
        stopped_at = time.time()
        expires = ctx.sql("SELECT extract(epoch FROM lease_expires_at) AS e FROM ledger.attempt "
                          "WHERE campaign_id = %s AND generation = %s", cid, generation)[0]["e"]
        ctx.expect(stopped and stopped_at < float(expires),
                   "the partitioned worker stopped its attempt before its lease expired by the database's clock",
                   f"stopped {stopped_at - silenced:.2f}s after the silence, "
                   f"{float(expires) - stopped_at:.2f}s before the expiry")

        finished = await ctx.until(
            lambda: any(a["outcome"] == "attempted" and a["worker"] != holder for a in ctx.attempts(cid)),
            "the other worker to claim and finish the campaign", timeout=30)
        ctx.expect(finished, "the other worker claimed the campaign and recorded its attempt",
                   str([(a["attempt_no"], a["worker"], a["outcome"]) for a in ctx.attempts(cid)]))

        def noticed_after() -> float | None:
            for line in cut_off.output().splitlines():
                try:
                    entry = json.loads(line)
                except ValueError:
                    continue
                if entry.get("component") == "hub" and entry.get("event") in (
                        "hub connection lost", "hub connected but deaf"):
                    at = datetime.fromisoformat(entry["timestamp"].replace("Z", "+00:00")).timestamp()
                    if at >= silenced:
                        return at - silenced
            return None
        await ctx.until(lambda: noticed_after() is not None, "the silent hub to be noticed",
                        timeout=3 * HUB_PING_S + 10)
        delay = noticed_after()
        ctx.expect(delay is not None and delay <= HUB_PING_S + 5.0 + 1.0,
                   "the partitioned worker noticed its silent hub within its check interval",
                   f"after {delay if delay is None else round(delay, 2)}s; a NOTIFY to itself every "
                   f"{HUB_PING_S:g}s, 5s to come back")

        proxy.heal()
        ctx.step("the path heals")
        other.signal(signal.SIGTERM)
        ctx.expect(other.wait(30) == 0, "the other worker stops cleanly")
        [second] = await open_campaigns(ctx, prefix="after-the-partition")
        took = await ctx.until(lambda: any(a["worker"] == holder for a in ctx.attempts(second)),
                               "the healed worker to take new work", timeout=30)
        ctx.expect(took, "the healed worker reconnected and took new work", str(ctx.attempts(second)))
        ctx.marker("release", second, 1).write_text("go")
        late = ctx.sql("SELECT seq, type FROM ledger.campaign_event WHERE campaign_id = %s AND seq > %s "
                       "AND generation = %s AND actor = %s", cid, cut, generation, holder)
        ctx.expect(late == [], "nothing was written for the partitioned lease after the silence", str(late))
        ctx.expect(cut_off.popen.poll() is None, "the partitioned worker never exited")
        cut_off.signal(signal.SIGTERM)
        ctx.expect(cut_off.wait(30) == 0, "it then stops cleanly")
