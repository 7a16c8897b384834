"""Wake latency: how long an idle worker takes to hold a lease on a campaign
that was just opened -- over LISTEN/NOTIFY (the hub), and poll-only (no
LISTEN connection: the claim loop's tick is all it has).

Both ends run in this process, so one clock times them: from the moment
``open_campaign`` returns (committed) to the moment the worker's
``claim_campaign`` returns the lease. The worker loop is the one the runtime
uses: subscribe, claim, and only when nothing was claimed wait on the
subscription with the poll tick as timeout. Opens are spaced so that each finds
the worker idle.

usage: python -m bench.wake [--quick] [--database-url URL]
"""

from __future__ import annotations

import asyncio
import random
import time

from bench.harness import Context, Section, Target, cli, percentiles
from ledger import Database, Kernel
from ledger.db.hub import Hub, NullHub, WakeSource


async def wake_latencies(db: Database, hub: WakeSource, class_: str, samples: int,
                         poll_s: float, gap_s: float) -> list[float]:
    claimed: dict[str, float] = {}
    waiting: dict[str, asyncio.Event] = {}
    async with db.session("worker", min_size=1, max_size=1) as w, \
            db.session("sensor", min_size=1, max_size=1) as s:
        worker, sensor = Kernel(w), Kernel(s)
        stop = asyncio.Event()

        async def idle_worker() -> None:
            while not stop.is_set():
                with hub.subscribe("ledger_ready") as ready:
                    claim = await worker.claim_campaign("bench-wake", [class_])
                    if claim is not None:
                        claimed[claim.objective_key] = time.perf_counter()
                        waiting.pop(claim.objective_key, asyncio.Event()).set()
                        continue
                    await ready.wait(poll_s)

        tag = random.getrandbits(32)
        task = asyncio.create_task(idle_worker())
        latencies = []
        try:
            for i in range(samples):
                key = f"{class_}-{tag}-{i}"
                waiting[key] = done = asyncio.Event()
                await sensor.open_campaign(class_, key, "t")
                opened = time.perf_counter()
                await asyncio.wait_for(done.wait(), poll_s * 3 + 5)
                latencies.append(claimed[key] - opened)
                # a random pause, so opens land anywhere within the poll tick
                await asyncio.sleep(gap_s * random.uniform(0.5, 1.5))
        finally:
            stop.set()
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    return latencies


async def run(ctx: Context) -> Section:
    samples = 60 if ctx.quick else 300
    poll_s = 0.25 if ctx.quick else 1.0
    poll_samples = 12 if ctx.quick else 40
    section = Section("wake", "Wake latency: open -> claimed, idle worker")
    with ctx.ledger() as db:
        with db.connect_sync("operator") as op:
            for name in ("wake-hub", "wake-poll"):
                op.execute("SELECT ledger_api.register_class(%s)", (name,))
        async with Hub(db) as hub:
            await wake_latencies(db, hub, "wake-hub", 10, poll_s=5.0, gap_s=0.005)  # warm up
            hub_ms = percentiles(await wake_latencies(db, hub, "wake-hub", samples, poll_s=5.0, gap_s=0.01))
        poll_ms = percentiles(await wake_latencies(db, NullHub(), "wake-poll", poll_samples,
                                                   poll_s=poll_s, gap_s=poll_s / 3))
    section.rows.append({"path": "hub (LISTEN/NOTIFY)", "poll_tick_s": 5.0, **hub_ms})
    section.rows.append({"path": "poll only", "poll_tick_s": poll_s, **poll_ms})
    section.targets.append(Target("wake p50 with the hub", "≤ 1.5 ms", f"{hub_ms['p50']} ms",
                                  hub_ms["p50"] <= 1.5))
    section.targets.append(Target("wake p99 with the hub", "≤ 3 ms", f"{hub_ms['p99']} ms",
                                  hub_ms["p99"] <= 3.0))
    section.targets.append(Target("poll-only p99 ≈ the poll tick", f"≤ {poll_s * 1000:.0f} ms + a claim",
                                  f"{poll_ms['p99']} ms", poll_ms["p99"] <= poll_s * 1000 * 1.1 + 20))
    return section


if __name__ == "__main__":
    cli(run, __doc__)
