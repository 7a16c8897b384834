"""Wake latency: from a campaign's commit to its claim, with an idle worker
whose poll tick is long -- over LISTEN/NOTIFY (the hub), against the poll-only
bound measured in the same run (expected: about half the tick on average).

usage: python bench/wake.py [--campaigns 30] [--poll 2]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from harness import bench_database, server_version  # noqa: E402

from ledger import Database, Kernel  # noqa: E402
from ledger import logs  # noqa: E402
from ledger.hub import Hub, NullHub, WakeSource  # noqa: E402


async def idle_claimer(kernel: Kernel, hub: WakeSource, poll_s: float, stop: asyncio.Event) -> None:
    """The worker's claim loop, without attempts: subscribe, claim, idle."""
    while not stop.is_set():
        with hub.subscribe("ledger_ready") as ready:
            claim = await kernel.claim_campaign("bench-worker", ["bench"])
            if claim is None:
                await ready.wait(poll_s)


async def latencies(db: Database, hub: WakeSource, n: int, poll_s: float) -> list[float]:
    async with db.session("worker") as w, db.session("sensor") as s:
        stop = asyncio.Event()
        claimer = asyncio.create_task(idle_claimer(Kernel(w), hub, poll_s, stop))
        sensor = Kernel(s)
        for i in range(n):
            await sensor.open_campaign("bench", f"wake-{id(hub)}-{i}", "t")
            await asyncio.sleep(poll_s * 0.37)  # spread opens across the tick
        await asyncio.sleep(poll_s * 1.2)  # let the last one be claimed
        stop.set()
        await claimer
    with db.connect_sync(None) as conn:
        rows = conn.execute(
            "SELECT extract(epoch FROM a.claimed_at - c.created_at) AS s FROM ledger.attempt a "
            "JOIN ledger.campaign c ON c.id = a.campaign_id WHERE c.objective_key LIKE %s",
            (f"wake-{id(hub)}-%",)).fetchall()
    return sorted(float(r["s"]) for r in rows)


def describe(name: str, values: list[float]) -> None:
    p95 = values[int(len(values) * 0.95) - 1] if values else float("nan")
    print(f"{name:<13}: median {statistics.median(values) * 1000:8.1f} ms   p95 {p95 * 1000:8.1f} ms   "
          f"max {values[-1] * 1000:8.1f} ms   ({len(values)} claims)")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--campaigns", type=int, default=30)
    parser.add_argument("--poll", type=float, default=2.0)
    args = parser.parse_args()
    logs.configure("warning")
    with bench_database() as db:
        with db.connect_sync(None) as conn:
            conn.execute("SELECT ledger_api.register_class('bench')")
        print(f"PostgreSQL {server_version(db)}, poll tick {args.poll:g} s")
        async with Hub(db) as hub:
            describe("hub (NOTIFY)", await latencies(db, hub, args.campaigns, args.poll))
        describe("poll only", await latencies(db, NullHub(), args.campaigns, args.poll))


if __name__ == "__main__":
    asyncio.run(main())
