"""Dashboard pages with many campaigns: server-side render time of the board
(unfiltered, filtered, searched, a later page), a campaign page, the autonomy
page, and the board stream's change probe (``board_version``), in process
(httpx over ASGI, so the figures are the server's, not a browser's).

The ledger is filled through the kernel's own functions, as their roles, in
set-based statements: sensors' red observations open the campaigns, workers
claim and record, verifiers accept and reject, operators abandon, so the rows,
journals and indexes look like a real ledger's.

usage: python -m bench.board [--campaigns 10000] [--runs 20]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import httpx

from bench.harness import bench_database, server_version
from ledger import Database
from ledger.api import ApiOptions, TokenTable, create_app, hash_token, new_token

CLASSES = ("fix-tests", "bump-deps", "lint")
SENSORS = 20

# Each statement runs as one role (SET ROLE), as the runtimes would.
FILL = (
    ("sensor", """
SELECT ledger_api.record_observation(
           p_sensor => 'sensor-' || (i % {sensors}), p_objective_key => 'tests-pass:repo-' || i,
           p_target => 'repo-' || (i % 500) || '#main', p_status => 'red',
           p_started_at => now() - make_interval(secs => {n} - i),
           p_class => (ARRAY['fix-tests', 'bump-deps', 'lint'])[1 + i % 3],
           p_labels => ARRAY['team-' || (i % 7)])
  FROM generate_series(1, {n}) i"""),
    ("worker", """
SELECT ledger_api.claim_campaign(p_worker => 'worker-' || (i % 40))
  FROM generate_series(1, {claimed}) i"""),
    ("worker", """
SELECT ledger_api.record_attempt(p_campaign_id => c.id, p_generation => c.generation,
           p_base_sha => repeat('a', 40), p_candidate_sha => lpad(to_hex(c.id), 40, '0'),
           p_fingerprint => 'sha256:' || lpad(to_hex(c.id), 16, '0'),
           p_log_tail => 'ran the tests')
  FROM (SELECT id, generation FROM ledger_api.campaigns WHERE state = 'leased'
         ORDER BY id LIMIT {attempted}) c"""),
    ("verifier", """
SELECT ledger_api.claim_verification(p_verifier => 'verifier-' || (i % 8))
  FROM generate_series(1, {verified}) i"""),
    ("verifier", """
SELECT CASE WHEN v.id % 3 = 0 THEN ledger_api.reject(p_verification_id => v.id, p_reason => 'tests fail')::text
            ELSE ledger_api.accept(p_verification_id => v.id)::text END
  FROM ledger_api.verifications v WHERE v.status = 'running'"""),
    ("operator", """
SELECT ledger_api.abandon(p_campaign_id => c.id, p_reason => 'bench', p_operator => 'bench')
  FROM (SELECT id FROM ledger_api.campaigns WHERE state = 'ready'
         ORDER BY id LIMIT {abandoned}) c"""),
)


def fill(db: Database, n: int) -> None:
    sizes = {"n": n, "sensors": SENSORS, "claimed": n * 3 // 10, "attempted": n * 2 // 10,
             "verified": n // 10, "abandoned": n // 10}
    for role, statement in FILL:
        with db.connect_sync(role) as conn:
            conn.execute(statement.format(**sizes))
    with db.connect_sync(None) as conn:
        conn.execute("VACUUM ANALYZE")


async def timed(client: httpx.AsyncClient, url: str, runs: int) -> tuple[float, float, int]:
    """Median and worst milliseconds of ``runs`` GETs (after one warm-up), and the size."""
    r = await client.get(url)
    assert r.status_code == 200, (url, r.status_code, r.text[:300])
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        r = await client.get(url)
        times.append((time.perf_counter() - start) * 1000)
        assert r.status_code == 200
    return statistics.median(times), max(times), len(r.content)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--campaigns", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    with bench_database() as db:
        with db.connect_sync(None) as admin:
            for name in CLASSES:
                admin.execute("SELECT ledger_api.register_class(%s, p_max_attempts => 5)", (name,))
        start = time.perf_counter()
        fill(db, args.campaigns)
        filled_s = time.perf_counter() - start
        token = new_token()
        app = create_app(db, TokenTable.parse(f"bench:reader:{hash_token(token)}"), ApiOptions())
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://bench",
                                         headers={"Authorization": f"Bearer {token}"}) as client:
                reader = await app.state.ledger.pools.reads("reader")
                counts = await reader.state_counts()
                print(f"PostgreSQL {server_version(db)}; {sum(counts.values())} campaigns "
                      f"(filled in {filled_s:.1f} s): "
                      + ", ".join(f"{s} {n}" for s, n in counts.items() if n))
                first = (await client.get("/ui/?state=ready")).text
                cursor = first.split('cursor=')[1].split('"')[0].replace("&amp;", "&")
                busy = (await reader.campaigns(states=["attempted"], limit=1))[0].id
                pages = [
                    ("board", "/ui/"),
                    ("board state=ready", "/ui/?state=ready"),
                    ("board class+label", "/ui/?class=lint&label=team-3"),
                    ("board search", "/ui/?q=repo-99"),
                    ("board page 2", f"/ui/?state=ready&cursor={cursor}"),
                    ("campaign page", f"/ui/campaigns/{busy}"),
                    ("autonomy (30 days)", "/ui/autonomy?days=30"),
                ]
                print(f"{'page':<22} {'median ms':>10} {'worst ms':>10} {'KiB':>7}   ({args.runs} runs)")
                for name, url in pages:
                    median, worst, size = await timed(client, url, args.runs)
                    print(f"{name:<22} {median:10.1f} {worst:10.1f} {size / 1024:7.1f}")
                probe = []
                for _ in range(args.runs):
                    start = time.perf_counter()
                    await reader.board_version()
                    probe.append((time.perf_counter() - start) * 1000)
                print(f"{'board_version probe':<22} {statistics.median(probe):10.1f} "
                      f"{max(probe):10.1f}")


if __name__ == "__main__":
    asyncio.run(main())
