"""A guard on the hot query: with 100,000 closed campaigns present, the claim
statement inside claim_campaign stays on its partial index. The plan is the
real one of the statement inside the function, captured with auto_explain."""

from __future__ import annotations

import json

import psycopg
import pytest
from psycopg import sql

from conftest import TEST_PREFIX, Admin

CLOSED = 100_000
pytestmark = pytest.mark.anyio


def _plans(conn: Admin, call: str, params: tuple) -> list[dict]:
    notices: list[str] = []
    conn.add_notice_handler(lambda diag: notices.append(diag.message_primary or ""))
    conn.execute("LOAD 'auto_explain'")
    conn.execute("SET auto_explain.log_min_duration = 0")
    conn.execute("SET auto_explain.log_nested_statements = on")
    conn.execute("SET auto_explain.log_format = 'json'")
    conn.execute("SET auto_explain.log_level = 'notice'")
    conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(f"{TEST_PREFIX}worker")))
    conn.execute(call, params)
    conn.execute("RESET ROLE")
    plans = []
    for text in notices:
        if "{" in text:
            plans.append(json.loads(text[text.index("{"):]))
    return plans


def _nodes(plan: dict):
    yield plan
    for child in plan.get("Plans", []):
        yield from _nodes(child)


async def test_claim_stays_on_its_index(admin: Admin, test_class: str) -> None:
    # Bulk history: closed campaigns, written with triggers off for speed.
    admin.execute("SET session_replication_role = replica")
    admin.execute(
        "INSERT INTO ledger.campaign (class, objective_key, target, state, max_attempts, "
        "next_attempt_at, created_at, updated_at, closed_at) "
        "SELECT %s, 'closed-' || i, 't', (ARRAY['confirmed','dismissed','abandoned'])[1 + i %% 3], 3, "
        "now(), now(), now(), now() FROM generate_series(1, %s) i", (test_class, CLOSED))
    admin.execute("SET session_replication_role = origin")
    admin.execute("SELECT ledger_api.open_campaign(%s, 'ready-' || i, 't') FROM generate_series(1, 20) i",
                  (test_class,))
    admin.execute("ANALYZE ledger.campaign")

    plans = _plans(admin, "SELECT * FROM ledger_api.claim_campaign(%s, ARRAY[%s])", ("w", test_class))
    claim_plans = [p for p in plans if "UPDATE ledger.campaign c" in p.get("Query Text", "")
                   and "SKIP LOCKED" in p.get("Query Text", "")]
    assert claim_plans, f"the claim statement was not captured: {[p.get('Query Text') for p in plans]}"
    nodes = list(_nodes(claim_plans[0]["Plan"]))
    scans = {(n["Node Type"], n.get("Index Name")) for n in nodes if "Scan" in n["Node Type"]}
    assert ("Index Scan", "campaign_claim_order") in scans, scans
    assert not any(n["Node Type"] == "Seq Scan" and n.get("Relation Name") == "campaign" for n in nodes), scans
    # And it touched a handful of rows, not the history.
    assert admin.execute("SELECT count(*) AS n FROM ledger.campaign WHERE state = 'leased'").fetchone()["n"] == 1
