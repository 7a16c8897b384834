"""What each index, constraint and guarantee of the campaign row costs the hot path.

Wall-clock rates on a shared two-core machine drift by a third; a backend's
own CPU time does not (much). So this section drains campaigns one at a time
(``claim_campaign`` + ``record_attempt``, one connection) and in batches of
100 (``claim_campaigns`` + ``record_attempts``), and reports the backend's CPU
per campaign, read from ``/proc/<pid>/stat`` of the server process serving
the connection (the server must run on this machine). Then the same with one
index (or the CHECK constraints) removed at a time, in a fresh database each:
the difference is what that index or those constraints cost per cycle. The
guarantees are priced the same way: the journal (its row triggers off), the
attempt history's and the journal's foreign keys, the attempt's row guard.

Removing an invariant's index or a guarantee here is a measurement, not a proposal.

usage: python -m bench.rowcost [--quick] [--database-url URL]
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import psycopg

from bench.harness import Context, Section, cli
from ledger import Database

SHA = "a" * 40
# (campaign_one_open_per_objective is not among them: open_campaign's
# ON CONFLICT names it, so nothing opens without it.)
INDEXES = ("campaign_one_lease_per_seat", "campaign_claim_order",
           "campaign_lease_expiry", "campaign_awaiting_verdict", "campaign_recent", "campaign_by_class_state")
TICK = os.sysconf("SC_CLK_TCK")
# What a guarantee costs, priced by turning it off in a throwaway database.
GUARANTEES = {"without the journal (an event per transition)": "journal",
              "without the foreign keys of attempt and journal to campaign": "foreign keys",
              "without attempt_guard (the attempt's row rules)": "attempt guard"}
PRICED = {
    "journal": ("ALTER TABLE ledger.campaign DISABLE TRIGGER campaign_journal_update",
                "ALTER TABLE ledger.campaign DISABLE TRIGGER campaign_journal_batch"),
    "foreign keys": ("ALTER TABLE ledger.attempt DROP CONSTRAINT attempt_campaign_id_fkey",
                     "ALTER TABLE ledger.campaign_event DROP CONSTRAINT campaign_event_campaign_id_fkey"),
    "attempt guard": ("ALTER TABLE ledger.attempt DISABLE TRIGGER attempt_guard",),
}


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime


def _drain(db: Database, batch: int) -> tuple[int, float, float]:
    """(campaigns, backend CPU seconds, wall seconds)."""
    with db.connect_sync("worker") as conn:
        pid = conn.execute("SELECT pg_backend_pid() AS p").fetchone()["p"]
        done, cpu0, wall0 = 0, _cpu_s(pid), time.perf_counter()
        while True:
            if batch == 1:
                rows = conn.execute("SELECT * FROM ledger_api.claim_campaign('w', ARRAY['cost'])").fetchall()
            else:
                rows = conn.execute("SELECT * FROM ledger_api.claim_campaigns('w', ARRAY['cost'], %s)",
                                    (batch,)).fetchall()
            if not rows:
                break
            if batch == 1:
                r = rows[0]
                conn.execute("SELECT ledger_api.record_attempt(%s, %s, %s, %s, %s)",
                             (r["campaign_id"], r["generation"], SHA, SHA, f"cost:{r['campaign_id']:08d}"))
            else:
                conn.execute("SELECT * FROM ledger_api.record_attempts(%s::jsonb)", (json.dumps([
                    {"campaign_id": r["campaign_id"], "generation": r["generation"], "base_sha": SHA,
                     "candidate_sha": SHA, "fingerprint": f"cost:{r['campaign_id']:08d}"} for r in rows]),))
            done += len(rows)
        return done, _cpu_s(pid) - cpu0, time.perf_counter() - wall0


def _checks(admin: psycopg.Connection) -> None:
    for row in admin.execute(
            "SELECT conrelid::regclass::text AS t, conname AS n FROM pg_constraint "
            "WHERE contype = 'c' AND conrelid IN ('ledger.campaign'::regclass, 'ledger.attempt'::regclass, "
            "'ledger.campaign_event'::regclass)").fetchall():
        admin.execute(f'ALTER TABLE {row["t"]} DROP CONSTRAINT "{row["n"]}"')  # noqa: S608 (catalog names)


def _open(db: Database, n: int, tag: str) -> None:
    with db.connect_sync(None) as admin:
        admin.execute("SELECT ledger_api.open_campaign('cost', %s || '-' || i, 't') FROM generate_series(1, %s) i",
                      (tag, n))
        admin.execute("VACUUM ANALYZE")


async def run(ctx: Context) -> Section:
    n = 1000
    rounds = 2 if ctx.quick else 3
    section = Section("rowcost", "What each index, constraint and guarantee of campaign costs a cycle (backend CPU)")
    variants: list[tuple[str, Any]] = [("as is", None)]
    variants += [(f"without {i}", i) for i in (("campaign_by_class_state",) if ctx.quick else INDEXES)]
    variants += [("without CHECK constraints (campaign, attempt, event)", "checks")]
    variants += [(what, change) for what, change in GUARANTEES.items()
                 if not ctx.quick or change == "journal"]
    base: dict[int, float] = {}
    for what, change in variants:
        with ctx.ledger() as db:
            with db.connect_sync(None) as admin:
                admin.execute("SELECT ledger_api.register_class('cost', p_lease_seconds => 60)")
                if change == "checks":
                    _checks(admin)
                elif change in GUARANTEES.values():
                    for statement in PRICED[change]:
                        admin.execute(statement)
                elif change:
                    admin.execute(f"DROP INDEX ledger.{change}")  # noqa: S608 (fixed names)
            _open(db, 200, "warm")
            _drain(db, 1)  # plans, caches
            for batch in (1, 100):
                runs = []
                for r in range(rounds):
                    _open(db, n, f"b{batch}-r{r}")
                    runs.append(_drain(db, batch))
                done, cpu, wall = min(runs, key=lambda x: x[1] / x[0])
                per = cpu / done * 1e6
                if change is None:
                    base[batch] = per
                section.rows.append({"variant": what, "batch": batch, "campaigns": done,
                                     "backend_cpu_us_per_campaign": round(per),
                                     "runs_us": [round(c / d * 1e6) for d, c, _ in runs],
                                     "saved_us": round(base[batch] - per) if change else 0,
                                     "wall_per_s": round(done / wall)})
    section.notes.append("CPU of the worker's backend from /proc/<pid>/stat (10 ms ticks), the least of "
                         f"{rounds} drains of {n} campaigns in one database per variant, after a warm-up drain.")
    return section


if __name__ == "__main__":
    cli(run, __doc__)
