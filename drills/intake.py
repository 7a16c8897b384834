"""intake: break the watched target -> the sensor opens exactly one campaign
unaided; a duplicate red observation and a concurrent double intake still
leave one."""

from __future__ import annotations

import asyncio
import json
import signal
from datetime import datetime, timezone

from ledger.ops.drill import Drill, DrillContext, drill_python

from .workshop import CLASS, setup

CHECK = "import pathlib, sys; sys.exit(0 if pathlib.Path(sys.argv[1]).read_text() == 'green' else 1)"


class Intake(Drill):
    name = "intake"
    summary = "break the target -> one campaign, opened by the sensor alone, whatever the duplicates"

    async def run(self, ctx: DrillContext) -> None:
        status = ctx.workspace / "target.status"
        status.write_text("green")
        sensor = (f"\n[sensors.tests]\ntarget = \"repo\"\nevery_s = 0.5\nclass = \"{CLASS}\"\n"
                  f"command = {json.dumps([drill_python(), '-c', CHECK, str(status)])}\n")
        config, _ = await setup(ctx, {}, sensor=sensor)
        key = config.sensors["tests"].objective_key()
        sensors = [ctx.spawn(f"sensor-{i}", "sensor", "run") for i in range(2)]
        await ctx.until(lambda: ctx.sql("SELECT count(*) AS n FROM ledger.observation")[0]["n"] >= 2,
                        "green observations")
        ctx.expect(ctx.sql("SELECT count(*) AS n FROM ledger.campaign")[0]["n"] == 0,
                   "while the target is green, nothing opens")
        status.write_text("red")
        ctx.step("fault: the watched target breaks")
        opened = await ctx.until(lambda: ctx.sql("SELECT count(*) AS n FROM ledger.campaign")[0]["n"] >= 1,
                                 "the sensor to open a campaign", timeout=20)
        ctx.expect(opened, "a sensor opened a campaign without help")
        await ctx.until(lambda: ctx.sql("SELECT count(*) AS n FROM ledger.observation WHERE status = 'red'"
                                        )[0]["n"] >= 4, "more red ticks from both sensors")
        kernel = await ctx.kernel("sensor")
        dup = await kernel.record_observation("drill", key, "repo", "red",
                                              datetime.now(timezone.utc), class_=CLASS)
        ctx.expect(dup.effect == "recorded", "a duplicate red observation opens nothing", dup.effect)
        results = await asyncio.gather(*(
            kernel.record_observation(f"drill-{i}", "double-intake", "repo", "red",
                                      datetime.now(timezone.utc), class_=CLASS) for i in range(8)))
        ctx.expect(sum(r.effect == "opened" for r in results) == 1 and len({r.campaign_id for r in results}) == 1,
                   "eight concurrent red observations of a new objective open one campaign")
        for s in sensors:
            s.signal(signal.SIGTERM)
        ctx.expect(all(s.wait(20) == 0 for s in sensors), "the sensors stop cleanly on SIGTERM")
        counts = ctx.sql("SELECT objective_key, count(*) AS n FROM ledger.campaign GROUP BY 1 ORDER BY 1")
        ctx.expect([(c["objective_key"], c["n"]) for c in counts] == [("double-intake", 1), (key, 1)],
                   "exactly one campaign per objective", str(counts))
        ticks = ctx.sql("SELECT count(*) AS n FROM (SELECT tick FROM ledger.observation WHERE tick IS NOT NULL "
                        "GROUP BY tick HAVING count(*) > 1) t")[0]["n"]
        ctx.expect(ticks == 0, "two sensor processes never observed one tick twice")
