"""Claim throughput: Ledger's claim_campaign (fenced, journaled, one attempt row
per claim, through SECURITY DEFINER and SET ROLE) against a raw-SQL bound
measured in the same run -- the bare ``UPDATE ... WHERE id = (SELECT ... FOR
UPDATE SKIP LOCKED)`` on a plain table of the same shape.

usage: python bench/claims.py [--campaigns 5000] [--claimers 8]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from harness import bench_database, server_version  # noqa: E402

from ledger import Database, Kernel  # noqa: E402
from ledger.database import Transaction  # noqa: E402

RAW_SETUP = """
CREATE TABLE bench_raw (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    state text NOT NULL, priority int NOT NULL DEFAULT 0, created_at timestamptz NOT NULL DEFAULT now(),
    generation bigint NOT NULL DEFAULT 0, lease_owner text, lease_expires_at timestamptz);
CREATE INDEX bench_raw_ready ON bench_raw (priority DESC, created_at, id) WHERE state = 'ready';
"""
RAW_CLAIM = """
UPDATE bench_raw SET state = 'leased', generation = generation + 1, lease_owner = %s,
       lease_expires_at = now() + interval '60 seconds'
 WHERE id = (SELECT id FROM bench_raw WHERE state = 'ready'
              ORDER BY priority DESC, created_at, id LIMIT 1 FOR UPDATE SKIP LOCKED)
RETURNING id, generation
"""


async def ledger_claims(db: Database, claimers: int) -> tuple[int, float]:
    async def claimer(i: int) -> int:
        conn = await db.connect("worker")
        kernel, n = Kernel(Transaction(conn)), 0
        while await kernel.claim_campaign(f"bench-{i}", ["bench"]) is not None:
            n += 1
        await conn.close()
        return n
    start = time.perf_counter()
    counts = await asyncio.gather(*(claimer(i) for i in range(claimers)))
    return sum(counts), time.perf_counter() - start


async def raw_claims(db: Database, claimers: int) -> tuple[int, float]:
    async def claimer(i: int) -> int:
        conn = await db.connect(None)
        n = 0
        while True:
            cur = await conn.execute(RAW_CLAIM, (f"bench-{i}",))
            if await cur.fetchone() is None:
                break
            n += 1
        await conn.close()
        return n
    start = time.perf_counter()
    counts = await asyncio.gather(*(claimer(i) for i in range(claimers)))
    return sum(counts), time.perf_counter() - start


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--campaigns", type=int, default=5000)
    parser.add_argument("--claimers", type=int, default=8)
    args = parser.parse_args()
    with bench_database() as db:
        admin = db.connect_sync(None)
        admin.execute("SELECT ledger_api.register_class('bench', p_lease_seconds => 60)")
        admin.execute("SELECT ledger_api.open_campaign('bench', 'bench-' || i, 't') "
                      "FROM generate_series(1, %s) i", (args.campaigns,))
        admin.execute(RAW_SETUP)
        admin.execute("INSERT INTO bench_raw (state) SELECT 'ready' FROM generate_series(1, %s)",
                      (args.campaigns,))
        admin.execute("VACUUM ANALYZE")
        print(f"PostgreSQL {server_version(db)}, {args.campaigns} campaigns, {args.claimers} claimers")
        n_raw, t_raw = await raw_claims(db, args.claimers)
        n_led, t_led = await ledger_claims(db, args.claimers)
        assert n_raw == n_led == args.campaigns
        raw_rate, led_rate = n_raw / t_raw, n_led / t_led
        print(f"raw SQL bound : {raw_rate:8.0f} claims/s  ({t_raw:.2f} s)")
        print(f"ledger claims : {led_rate:8.0f} claims/s  ({t_led:.2f} s)")
        print(f"ratio         : {led_rate / raw_rate:8.2f} of the raw bound")
        admin.close()


if __name__ == "__main__":
    asyncio.run(main())
