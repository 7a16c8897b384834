"""A guard on the hot query: with 100,000 closed campaigns present, the claim
statement inside claim_campaign stays on its partial index. The plan is the
real one of the statement inside the function, captured with auto_explain."""

from __future__ import annotations

import json

import pytest
from psycopg import sql

from conftest import TEST_PREFIX, Admin

CLOSED = 100_000
pytestmark = pytest.mark.anyio


def _plans(conn: Admin, call: str, params: tuple, analyze: bool = False) -> list[dict]:
    notices: list[str] = []
    conn.add_notice_handler(lambda diag: notices.append(diag.message_primary or ""))
    conn.execute("LOAD 'auto_explain'")
    conn.execute("SET auto_explain.log_min_duration = 0")
    conn.execute("SET auto_explain.log_nested_statements = on")
    conn.execute("SET auto_explain.log_format = 'json'")
    conn.execute("SET auto_explain.log_level = 'notice'")
    conn.execute("SET auto_explain.log_analyze = %s" % ("on" if analyze else "off"))
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


async def test_the_fair_claim_probes_each_class_on_its_index(admin, actors, test_class) -> None:
    # A worker serving every class: the rotation probes each class's head
    # (claim_turns) and the claim takes the head of the class whose turn it
    # is, both on campaign_claim_order, with a million-row history's worth of
    # closed campaigns in one class and a large ready backlog in it too.
    await (await actors("operator")).register_class("other", lease_seconds=30)
    admin.execute("SET session_replication_role = replica")
    admin.execute(
        "INSERT INTO ledger.campaign (class, objective_key, target, state, max_attempts, "
        "next_attempt_at, created_at, updated_at, closed_at) "
        "SELECT %s, 'closed-' || i, 't', 'confirmed', 3, now(), now(), now(), now() "
        "FROM generate_series(1, %s) i", (test_class, CLOSED))
    admin.execute("SET session_replication_role = origin")
    admin.execute("SELECT ledger_api.open_campaign(%s, 'ready-' || i, 't') FROM generate_series(1, 2000) i",
                  (test_class,))
    admin.execute("SELECT ledger_api.open_campaign('other', 'other-' || i, 't') FROM generate_series(1, 5) i")
    admin.execute("ANALYZE ledger.campaign")

    plans = _plans(admin, "SELECT * FROM ledger_api.claim_campaign(%s)", ("w",), analyze=True)
    texts = [p.get("Query Text", "") for p in plans]
    probes = [p for p in plans if "array_agg(cc.name" in p.get("Query Text", "")]
    claims = [p for p in plans if "UPDATE ledger.campaign c" in p.get("Query Text", "")
              and "SKIP LOCKED" in p.get("Query Text", "")]
    assert probes and claims, texts
    for plan in probes + claims:
        nodes = list(_nodes(plan["Plan"]))
        on_campaign = [n for n in nodes if n.get("Relation Name") == "campaign" and "Scan" in n["Node Type"]]
        assert on_campaign, nodes
        assert all(n["Node Type"] != "Seq Scan" for n in on_campaign), \
            [(n["Node Type"], n.get("Index Name")) for n in on_campaign]
    assert ("campaign_claim_order" in {n.get("Index Name") for p in claims for n in _nodes(p["Plan"])})
    # Each class's head costs one probe: the probe read a handful of rows.
    probe_rows = sum(n["Actual Rows"] * n["Actual Loops"] for p in probes for n in _nodes(p["Plan"])
                     if n.get("Relation Name") == "campaign")
    assert probe_rows == 2, json.dumps([p["Plan"] for p in probes], indent=1)
