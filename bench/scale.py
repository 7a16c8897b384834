"""Claim latency as the ledger grows: 1k, 100k and 1M campaigns (quick: 1k and
20k), mostly closed as a long-lived ledger is, each with its attempt, and a
small ready pool. Reports claim p50/p99 at each size and the claim's plan at
the largest (it must walk the partial ``campaign_claim_order`` index, not the
table).

The history is written in bulk as the administrator with triggers off
(``session_replication_role = replica``): it stands for years of closed
campaigns, and writing a million through the kernel would take the run's whole
budget. The ready pool and every timed claim go through the kernel.

usage: python -m bench.scale [--quick] [--database-url URL]
"""

from __future__ import annotations

import time

import psycopg

from bench.harness import Context, Section, Target, cli, percentiles
from ledger import Database, Kernel

CLASS = "scale"
# A second class with work of its own: claims serving every class take turns
# between the two (the fair claim), and are timed as well.
OTHER = "scale-other"
# Closed states dominate, as in a ledger that has run for a while.
HISTORY = ("""
INSERT INTO ledger.campaign (class, objective_key, target, state, generation, attempt_count,
                             max_attempts, next_attempt_at, event_seq, created_at, updated_at,
                             closed_at, labels)
SELECT %(class)s, 'history-' || i, 'repo-' || (i %% 5000) || '#main',
       (ARRAY['confirmed', 'confirmed', 'confirmed', 'confirmed', 'confirmed', 'confirmed',
              'dismissed', 'dismissed', 'abandoned', 'exhausted'])[1 + i %% 10],
       1, 1, 3, now(), 4, now() - make_interval(secs => i), now() - make_interval(secs => i / 2),
       now() - make_interval(secs => i / 2), ARRAY['team-' || (i %% 7)]
  FROM generate_series(%(start)s::bigint, %(stop)s::bigint) i""", """
INSERT INTO ledger.attempt (campaign_id, attempt_no, generation, worker, claimed_at,
                            lease_expires_at, outcome, ended_at, fingerprint, candidate_sha)
SELECT c.id, 1, 1, 'worker-' || (c.id %% 40), c.created_at, c.created_at, 'attempted',
       c.updated_at, 'fp:' || lpad(c.id::text, 12, '0'), lpad(to_hex(c.id), 40, '0')
  FROM ledger.campaign c
 WHERE c.objective_key LIKE 'history-%%' AND c.id > %(after)s""")
CLAIM_PLAN = """
EXPLAIN (ANALYZE, BUFFERS, COSTS OFF)
SELECT r.id FROM ledger.campaign r
 WHERE r.class = %(class)s AND r.state = 'ready' AND r.next_attempt_at <= now()
   AND (r.seat IS NULL OR NOT EXISTS (SELECT 1 FROM ledger.campaign s
                                       WHERE s.seat = r.seat AND s.state = 'leased'))
 ORDER BY r.priority DESC, r.created_at, r.id
 LIMIT 1 FOR NO KEY UPDATE SKIP LOCKED
"""


def grow(url: str, have: int, want: int) -> None:
    """Add closed history until the ledger holds ``want`` campaigns."""
    with psycopg.connect(url, autocommit=True) as conn:
        after = conn.execute("SELECT coalesce(max(id), 0) FROM ledger.campaign").fetchone()[0]
        step = 200_000
        conn.execute("SET session_replication_role = replica")
        for start in range(have + 1, want + 1, step):
            for statement in HISTORY:
                conn.execute(statement, {"class": CLASS, "start": start,
                                         "stop": min(want, start + step - 1), "after": after})
            after = conn.execute("SELECT coalesce(max(id), 0) FROM ledger.campaign").fetchone()[0]
        conn.execute("SET session_replication_role = DEFAULT")
        conn.execute("VACUUM ANALYZE ledger.campaign")
        conn.execute("VACUUM ANALYZE ledger.attempt")


async def timed_claims(db: Database, size: int, claims: int,
                       classes: list[str] | None = [CLASS]) -> list[float]:  # noqa: B006 (read only)
    """Claim latency of ``claims`` claims (one class named, or every class)."""
    tag = "one" if classes else "fair"
    with db.connect_sync("sensor") as sensor:
        for class_ in (CLASS, OTHER) if classes is None else classes:
            sensor.execute("SELECT ledger_api.open_campaign(%s, %s || '-' || %s || '-' || %s || '-' || i, 't') "
                           "FROM generate_series(1, %s) i", (class_, class_, tag, size, claims * 2))
    with db.connect_sync(None) as admin:
        admin.execute("ANALYZE ledger.campaign")
    out = []
    async with db.session("worker", min_size=1, max_size=1) as session:
        kernel = Kernel(session)
        for _ in range(20):  # warm the connection and its prepared statement
            await kernel.claim_campaign("bench-scale", classes)
        for _ in range(claims):
            start = time.perf_counter()
            claim = await kernel.claim_campaign("bench-scale", classes)
            out.append(time.perf_counter() - start)
            assert claim is not None
    return out


async def run(ctx: Context) -> Section:
    sizes = (1_000, 20_000) if ctx.quick else (1_000, 100_000, 1_000_000)
    claims = 300 if ctx.quick else 1000
    section = Section("scale", "Claim latency as the ledger grows")
    p50: dict[int, float] = {}
    fair50: dict[int, float] = {}
    with ctx.database() as url:
        db = ctx.as_ledger(url)
        with db.connect_sync("operator") as op:
            op.execute("SELECT ledger_api.register_class(%s)", (CLASS,))
            op.execute("SELECT ledger_api.register_class(%s)", (OTHER,))
        have = 0
        for size in sizes:
            started = time.perf_counter()
            grow(url, have, size)
            have = size
            fill_s = time.perf_counter() - started
            lat = percentiles(await timed_claims(db, size, claims))
            p50[size] = lat["p50"]
            fair = percentiles(await timed_claims(db, size, claims, None))
            fair50[size] = fair["p50"]
            with db.connect_sync(None) as admin:
                total = admin.execute("SELECT count(*) AS n FROM ledger.campaign").fetchone()["n"]
                heap = admin.execute("SELECT pg_size_pretty(pg_total_relation_size('ledger.campaign')) AS s"
                                     ).fetchone()["s"]
            section.rows.append({"campaigns": total, "closed_history": size, "table_size": heap,
                                 "fill_s": round(fill_s, 1), **{f"claim_{k}": v for k, v in lat.items()},
                                 **{f"fair_claim_{k}": v for k, v in fair.items()}})
        with db.connect_sync(None) as admin:
            plan = [r["QUERY PLAN"] for r in admin.execute(CLAIM_PLAN, {"class": CLASS}).fetchall()]
    section.extra["claim_plan_at_largest"] = plan
    uses_index = any("campaign_claim_order" in line for line in plan)
    small, large = min(sizes), max(sizes)
    section.targets.append(Target(f"claim p50 at {large:,} / at {small:,}", "≤ 1.5×",
                                  f"{p50[large] / p50[small]:.2f}× ({p50[large]} vs {p50[small]} ms)",
                                  p50[large] <= 1.5 * p50[small]))
    section.targets.append(Target(f"fair claim (every class) p50 at {large:,} / at {small:,}", "≤ 1.5×",
                                  f"{fair50[large] / fair50[small]:.2f}× ({fair50[large]} vs {fair50[small]} ms)",
                                  fair50[large] <= 1.5 * fair50[small]))
    section.targets.append(Target("claim plan uses the partial index", "campaign_claim_order",
                                  "yes" if uses_index else "no", uses_index))
    return section


if __name__ == "__main__":
    cli(run, __doc__)
