"""Limits: what caps and a rate bucket cost the work cycle (docs/limits.md).

The claim cycle (``claim_campaign`` + ``record_attempt``) at N = 8 workers,
draining fresh campaigns of a class without limits, and of a class counted
under three capped keys (the class, the repository, a tenant label) whose
attempts use one rate-limited resource. The caps and the rate are set far
above what the run reaches, so nothing waits: the figure is the price of
keeping the counters (a row per key, updated by every claim and every
ending) and the bucket (a row per resource, taken by every claim) in the
claim's transaction. Interleaved rounds; each figure is the best of them.

usage: python -m bench.limits [--quick] [--database-url URL]
"""

from __future__ import annotations

from typing import Any

from bench.cycle import SHA, timed
from bench.harness import Context, Section, Target, cli
from ledger import Database, Kernel

N = int(__import__("os").environ.get("BENCH_LIMITS_N", "8"))


def fill(db: Database, n: int, limited: bool) -> str:
    with db.connect_sync(None) as admin:
        class_ = f"limits-{admin.execute('SELECT count(*) FROM ledger.campaign_class').fetchone()['count']}"
        admin.execute("SELECT ledger_api.register_class(%s, p_lease_seconds => 60)", (class_,))
        if limited:
            admin.execute("SELECT ledger_api.set_bucket('bench-model', p_requests_per_minute => 1000000)")
            admin.execute("SELECT ledger_api.set_class_limits(%s, ARRAY['class', 'repo', 'tenant'], "
                          "ARRAY['bench-model'])", (class_,))
            for key in (f"class:{class_}", "repo:app", "tenant:acme"):
                admin.execute("SELECT ledger_api.set_limit(%s, p_max_leased => 1000000)", (key,))
    with db.connect_sync("sensor") as sensor:
        sensor.execute("SELECT ledger_api.open_campaign(%s, %s || '-' || i, '/srv/app#main', "
                       "p_labels => ARRAY['tenant:acme']) FROM generate_series(1, %s) i", (class_, class_, n))
    with db.connect_sync(None) as admin:
        admin.execute("VACUUM ANALYZE")
    return class_


async def drain(db: Database, n: int, limited: bool) -> tuple[int, float]:
    class_ = fill(db, n, limited)
    async with db.session("worker", min_size=N, max_size=N) as session:
        kernel = Kernel(session)

        async def loop(i: int) -> int:
            done = 0
            while (c := await kernel.claim_campaign(f"bench-{i}", [class_])) is not None:
                await kernel.record_attempt(c.campaign_id, c.generation, base_sha=SHA, candidate_sha=SHA,
                                            fingerprint=f"bench:{c.campaign_id:08d}")
                done += 1
            return done
        return await timed(N, loop)


async def run(ctx: Context) -> Section:
    n = 2000 if ctx.quick else 6000
    rounds = 1 if ctx.quick else 3
    section = Section("limits", "Limits: the claim cycle without limits and with three caps and a bucket")
    runs: dict[bool, list[tuple[int, float]]] = {False: [], True: []}
    with ctx.database() as url:
        db = ctx.as_ledger(url)
        await drain(db, min(n, 1000), False)  # untimed: statistics on the attempt and journal tables
        for _ in range(rounds):
            for limited in (False, True):
                runs[limited].append(await drain(db, n, limited))
        with db.connect_sync(None) as admin:
            over = admin.execute("SELECT max(leased) AS m FROM ledger_api.limit_keys").fetchone()["m"]
    best = {k: max(r[0] / r[1] for r in v) for k, v in runs.items()}
    for limited in (False, True):
        row: dict[str, Any] = {"what": "three caps + one bucket" if limited else "no limits", "concurrency": N,
                               "campaigns": n, "per_s": round(best[limited]),
                               "runs_per_s": [round(r[0] / r[1]) for r in runs[limited]]}
        section.rows.append(row)
    cost = 1 - best[True] / best[False]
    section.notes.append(f"counters after the runs: at most {over} leased under a key (0: every ending gave "
                         "its slot back)")
    section.targets.append(Target(f"throughput lost to three caps and a bucket, N={N}", "≤ 10 %",
                                  f"{cost * 100:.1f} % ({best[True]:.0f}/s against {best[False]:.0f}/s)",
                                  cost <= 0.10))
    return section


if __name__ == "__main__":
    cli(run, __doc__)
