"""Batch claims and batch records: up to K leases in one statement, each with
its own generation, lease and attempt; many candidates recorded in one call,
with a lost lease reported for its item rather than failing the batch."""

from __future__ import annotations

import asyncio

import pytest

from conftest import Actors, Admin
from ledger import Database, Kernel
from ledger.db.database import Transaction
from ledger.db.reads import Reads
from ledger.errors import InvalidInput, RepeatedApproach

pytestmark = pytest.mark.anyio

SHA = "b" * 40


def _bulk_open(admin: Admin, class_: str, n: int, prefix: str = "batch") -> None:
    admin.execute("SELECT ledger_api.open_campaign(%s, %s || '-' || i, 't') FROM generate_series(1, %s) i",
                  (class_, prefix, n))


def _record(claim, fingerprint: str | None = None) -> dict:
    return {"campaign_id": claim.campaign_id, "generation": claim.generation, "base_sha": SHA,
            "candidate_sha": SHA, "fingerprint": fingerprint or f"fp:{claim.campaign_id:08d}"}


async def test_concurrent_batch_claimers_lease_each_campaign_once(db: Database, admin: Admin, test_class: str) -> None:
    _bulk_open(admin, test_class, 1000)
    claimed: list[list[tuple[int, int, int]]] = [[] for _ in range(6)]

    async def claimer(i: int) -> None:
        conn = await db.connect("worker")
        kernel = Kernel(Transaction(conn))
        try:
            while claims := await kernel.claim_campaigns(f"batch-{i}", [test_class], limit=25):
                assert len(claims) <= 25
                claimed[i].extend((c.campaign_id, c.generation, c.attempt_no) for c in claims)
        finally:
            await conn.close()

    await asyncio.gather(*(claimer(i) for i in range(6)))
    ids = [c[0] for batch in claimed for c in batch]
    assert len(ids) == 1000 and len(set(ids)) == 1000, "a campaign was leased twice or not at all"
    assert sum(1 for b in claimed if b) > 1, "claims were not spread across connections"
    assert {(g, n) for b in claimed for (_, g, n) in b} == {(1, 1)}
    rows = admin.execute(
        "SELECT count(*) FILTER (WHERE c.state = 'leased' AND c.lease_owner = a.worker "
        "                          AND c.lease_expires_at = a.lease_expires_at) AS ok, count(*) AS n "
        "FROM ledger.campaign c JOIN ledger.attempt a ON a.campaign_id = c.id").fetchone()
    assert rows == {"ok": 1000, "n": 1000}
    journaled = admin.execute("SELECT count(*) AS n FROM ledger.campaign_event "
                              "WHERE type = 'transition' AND payload ->> 'to' = 'leased'").fetchone()
    assert journaled["n"] == 1000


@pytest.mark.rollback  # only SQL: a transaction rolled back after the test
async def test_batch_claim_honours_order_seats_and_limit(actors: Actors, test_class: str) -> None:
    sensor, worker = await actors("sensor"), await actors("worker")
    low = (await sensor.open_campaign(test_class, "low", "t")).campaign_id
    high = (await sensor.open_campaign(test_class, "high", "t", priority=5)).campaign_id
    seat_a = (await sensor.open_campaign(test_class, "seat-a", "t", seat="repo-1", priority=3)).campaign_id
    seat_b = (await sensor.open_campaign(test_class, "seat-b", "t", seat="repo-1", priority=3)).campaign_id
    first = await worker.claim_campaigns("w", [test_class], limit=3)
    # priority order, and only one campaign of seat repo-1 in the batch
    assert [c.campaign_id for c in first] == [high, seat_a, low]
    assert await worker.claim_campaigns("w", [test_class], limit=10) == [], "seat repo-1 is leased"
    await worker.fail_attempt(seat_a, first[1].generation, "free the seat")
    again = await worker.claim_campaigns("w", [test_class], limit=10)
    assert [c.campaign_id for c in again] == [seat_a]  # older of the two on the seat
    assert again[0].attempt_no == 2 and again[0].generation == 2
    assert seat_b not in [c.campaign_id for c in first + again]
    with pytest.raises(InvalidInput):
        await worker.claim_campaigns("w", [test_class], limit=0)


@pytest.mark.rollback  # only SQL: a transaction rolled back after the test
async def test_batch_record_reports_a_lost_lease_and_keeps_the_rest(actors: Actors, test_class: str) -> None:
    sensor, worker, op = await actors("sensor"), await actors("worker"), await actors("operator")
    for i in range(3):
        await sensor.open_campaign(test_class, f"rec-{i}", "t")
    claims = await worker.claim_campaigns("w", [test_class], limit=3)
    assert len(claims) == 3
    await op.abandon(claims[1].campaign_id, "operator stops it mid-attempt")  # fences the lease out
    results = await worker.record_attempts([_record(c) for c in claims])
    assert [(r.campaign_id, r.status) for r in results] == [
        (claims[0].campaign_id, "recorded"), (claims[1].campaign_id, "stale"), (claims[2].campaign_id, "recorded")]
    assert [(await Reads(op.executor).campaign(c.campaign_id)).state for c in claims] == ["attempted", "abandoned", "attempted"]
    # The identical batch again (a reply lost after the commit) returns the
    # first result, item by item, and writes nothing twice.
    again = await worker.record_attempts([_record(c) for c in claims])
    assert [(r.campaign_id, r.status, r.attempt_no) for r in again] == [
        (r.campaign_id, r.status, r.attempt_no) for r in results]
    events = await Reads(op.executor).events(claims[0].campaign_id)
    assert [e.payload.get("to") for e in events if e.type == "transition"] == ["ready", "leased", "attempted"]


@pytest.mark.rollback  # only SQL: a transaction rolled back after the test
async def test_batch_record_refuses_bad_input_and_repeated_approaches_whole(actors: Actors, admin: Admin, test_class: str) -> None:
    sensor, worker = await actors("sensor"), await actors("worker")
    for i in range(2):
        await sensor.open_campaign(test_class, f"bad-{i}", "t")
    claims = await worker.claim_campaigns("w", [test_class], limit=2)
    with pytest.raises(InvalidInput):
        await worker.record_attempts([_record(claims[0]), {**_record(claims[1]), "candidate_sha": "not-hex"}])
    with pytest.raises(InvalidInput):
        await worker.record_attempts([])
    # Nothing of the refused batch was written: both are still leased.
    states = admin.execute("SELECT state FROM ledger.campaign ORDER BY id").fetchall()
    assert [s["state"] for s in states] == ["leased", "leased"]
    # A failed approach may not come back, in a batch either.
    await worker.fail_attempt(claims[0].campaign_id, claims[0].generation, "wrong", fingerprint="fp:approach-1")
    retry = await worker.claim_campaigns("w", [test_class], limit=1)
    with pytest.raises(RepeatedApproach):
        await worker.record_attempts([_record(retry[0], "fp:approach-1"), _record(claims[1])])
    assert [s["state"] for s in admin.execute("SELECT state FROM ledger.campaign ORDER BY id").fetchall()] \
        == ["leased", "leased"]
