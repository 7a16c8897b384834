"""Fair claims: a small class behind a large backlog of another.

100,000 ready campaigns in one class (quick: 10,000), opened first, then 50
in a second class; a fleet of four workers serving both claims until the
small class is drained. Reports how many claims that took (the issue's goal:
all 50 within the first ~100), and the claim latency meanwhile. Under the old
order (priority, then age, across classes) the small class was served only
after the whole backlog: claim 100,001.

usage: python -m bench.fair [--quick] [--database-url URL]
"""

from __future__ import annotations

import asyncio
import time

from bench.harness import Context, Section, Target, cli, percentiles
from ledger import Kernel

SMALL = 50
FLEET = 4


async def run(ctx: Context) -> Section:
    backlog = 10_000 if ctx.quick else 100_000
    section = Section("fair", "Fair claims: a small class behind a large backlog")
    with ctx.ledger() as db:
        with db.connect_sync(None) as admin:
            for class_ in ("backlog", "small"):
                admin.execute("SELECT ledger_api.register_class(%s, p_lease_seconds => 600)", (class_,))
            started = time.perf_counter()
            admin.execute("SELECT ledger_api.open_campaign('backlog', 'b-' || i, 't') "
                          "FROM generate_series(1, %s) i", (backlog,))
            admin.execute("SELECT ledger_api.open_campaign('small', 's-' || i, 't') "
                          "FROM generate_series(1, %s) i", (SMALL,))
            admin.execute("VACUUM ANALYZE")
            fill_s = time.perf_counter() - started
        latencies: list[float] = []
        small_left = SMALL
        stop = asyncio.Event()
        async with db.session("worker", min_size=FLEET, max_size=FLEET) as session:
            kernel = Kernel(session)

            async def worker(i: int) -> None:
                nonlocal small_left
                while not stop.is_set():
                    t0 = time.perf_counter()
                    claim = await kernel.claim_campaign(f"fleet-{i}")  # every class
                    latencies.append(time.perf_counter() - t0)
                    if claim is not None and claim.class_ == "small":
                        small_left -= 1
                        if small_left == 0:
                            stop.set()
            await asyncio.gather(*(worker(i) for i in range(FLEET)))
        with db.connect_sync(None) as admin:
            order = [r["class"] for r in admin.execute(
                "SELECT c.class FROM ledger.attempt a JOIN ledger.campaign c ON c.id = a.campaign_id "
                "ORDER BY a.id").fetchall()]
    drained_at = max(i for i, c in enumerate(order) if c == "small") + 1
    first_small = order.index("small") + 1
    lat = percentiles(latencies)
    section.rows.append({"backlog": backlog, "small": SMALL, "fleet": FLEET, "fill_s": round(fill_s, 1),
                         "first_small_claim": first_small, "small_drained_at_claim": drained_at,
                         "claims": len(order), **{f"claim_{k}": v for k, v in lat.items()}})
    section.targets.append(Target(f"claims until {SMALL} small-class campaigns are drained, behind {backlog:,}",
                                  f"≤ ~{2 * SMALL}", f"{drained_at} (first at claim {first_small})",
                                  drained_at <= 2 * SMALL + FLEET))
    return section


if __name__ == "__main__":
    cli(run, __doc__)
