"""Claiming under real concurrency: 8 connections, 2,000 campaigns."""

from __future__ import annotations

import asyncio

import pytest

from conftest import Actors, Admin
from ledger import Database, Kernel
from ledger.db.database import Transaction
from ledger.db.reads import Reads

pytestmark = pytest.mark.anyio

CAMPAIGNS = 2000
CLAIMERS = 8


def _bulk_open(admin: Admin, class_: str, n: int, prefix: str = "bulk") -> None:
    # The superuser calls the sensor's function for speed; it is the same code path.
    admin.execute(
        "SELECT ledger_api.open_campaign(%s, %s || '-' || i, 'target-' || i) "
        "FROM generate_series(1, %s) AS i", (class_, prefix, n))


async def test_concurrent_claimers_claim_each_campaign_exactly_once(db: Database, admin: Admin, test_class: str) -> None:
    _bulk_open(admin, test_class, CAMPAIGNS)
    claimed: dict[int, list[int]] = {i: [] for i in range(CLAIMERS)}
    lock_waits: list[dict] = []
    done = asyncio.Event()

    async def claimer(i: int) -> None:
        conn = await db.connect("worker")
        kernel = Kernel(Transaction(conn))
        try:
            while (claim := await kernel.claim_campaign(f"claimer-{i}", [test_class])) is not None:
                claimed[i].append(claim.campaign_id)
        finally:
            await conn.close()

    async def watch_locks() -> None:
        # Sample the server while the claimers run: nobody may wait on a
        # row's tuple lock or on a table lock of another claimer. ('extend'
        # is excluded: that is the storage manager growing a file for the
        # journal and attempt rows each claim appends, not contention over
        # campaigns. 'transactionid' is excluded too: PostgreSQL may walk a
        # row's update chain with a short wait SKIP LOCKED does not cover,
        # when a claim that just committed left a newer version of a row
        # another claimer's scan met; how long that lasts depends on the
        # machine's load. That claimers never queue behind one another's
        # claim is shown without a clock below, in
        # test_an_uncommitted_claim_holds_up_no_other_claimer.)
        conn = await db.connect(None)
        try:
            while not done.is_set():
                cur = await conn.execute(
                    "SELECT pid, wait_event_type, wait_event FROM pg_stat_activity "
                    "WHERE datname = current_database() AND application_name = 'ledger:worker' "
                    "AND wait_event_type = 'Lock' AND wait_event NOT IN ('extend', 'transactionid')")
                lock_waits.extend(await cur.fetchall())
                await asyncio.sleep(0.005)
        finally:
            await conn.close()

    watcher = asyncio.create_task(watch_locks())
    await asyncio.gather(*(claimer(i) for i in range(CLAIMERS)))
    done.set()
    await watcher

    everything = [cid for ids in claimed.values() for cid in ids]
    assert len(everything) == CAMPAIGNS
    assert len(set(everything)) == CAMPAIGNS, "a campaign was claimed twice"
    assert sum(1 for ids in claimed.values() if ids) > 1, "claims were not spread across connections"
    assert lock_waits == [], lock_waits
    row = admin.execute(
        "SELECT count(*) FILTER (WHERE state = 'leased') AS leased, count(*) AS total, "
        "count(*) FILTER (WHERE generation = 1) AS gen1 FROM ledger.campaign").fetchone()
    assert row == {"leased": CAMPAIGNS, "total": CAMPAIGNS, "gen1": CAMPAIGNS}
    attempts = admin.execute("SELECT count(*) AS n, count(DISTINCT campaign_id) AS c FROM ledger.attempt").fetchone()
    assert attempts == {"n": CAMPAIGNS, "c": CAMPAIGNS}


async def test_an_uncommitted_claim_holds_up_no_other_claimer(db: Database, admin, test_class) -> None:
    """SKIP LOCKED, deterministically: one claimer's claim stays uncommitted
    (its rows locked) while the others claim everything else. A claimer that
    queued on those locks could only go on once the holder ends, which it
    does only after the others are done: so a queue shows as a claimer
    blocked by the holder (pg_blocking_pids), never as a slow run."""
    _bulk_open(admin, test_class, 200)
    holder = await db.connect("worker", autocommit=False)
    others = [await db.connect("worker") for _ in range(3)]
    try:
        held = await Kernel(Transaction(holder)).claim_campaign("holder", [test_class])
        assert held is not None
        holder_pid = holder.info.backend_pid
        claimed: list[int] = []

        async def claimer(conn) -> None:
            kernel = Kernel(Transaction(conn))
            while (claim := await kernel.claim_campaign("other", [test_class])) is not None:
                claimed.append(claim.campaign_id)

        tasks = asyncio.gather(*(claimer(c) for c in others))
        pids = [c.info.backend_pid for c in others]
        while not tasks.done():
            blocked = admin.execute("SELECT pid, pg_blocking_pids(pid) AS by FROM unnest(%s::int[]) AS pid "
                                    "WHERE %s = ANY (pg_blocking_pids(pid))", (pids, holder_pid)).fetchall()
            assert blocked == [], f"a claimer queued behind the uncommitted claim: {blocked}"
            await asyncio.wait([tasks], timeout=0.01)
        await tasks
        assert sorted(claimed + [held.campaign_id]) == sorted(
            r["id"] for r in admin.execute("SELECT id FROM ledger.campaign").fetchall())
        assert held.campaign_id not in claimed
        await holder.commit()
    finally:
        for conn in [holder, *others]:
            await conn.close()


@pytest.mark.rollback  # only SQL: a transaction rolled back after the test
async def test_claim_order_priority_then_age_and_next_attempt_at(actors: Actors, admin: Admin, test_class: str) -> None:
    sensor, worker, op = await actors("sensor"), await actors("worker"), await actors("operator")
    low = (await sensor.open_campaign(test_class, "low", "t")).campaign_id
    high = (await sensor.open_campaign(test_class, "high", "t", priority=5)).campaign_id
    older_mid = (await sensor.open_campaign(test_class, "mid-1", "t", priority=1)).campaign_id
    newer_mid = (await sensor.open_campaign(test_class, "mid-2", "t", priority=1)).campaign_id
    order = []
    while (claim := await worker.claim_campaign("w", [test_class])) is not None:
        order.append(claim.campaign_id)
        if claim.campaign_id == older_mid:
            # A failure with a delay: not claimable again before next_attempt_at.
            await worker.fail_attempt(claim.campaign_id, claim.generation, "later", retry_after_s=3600)
    assert order == [high, older_mid, newer_mid, low]
    assert await worker.claim_campaign("w", ["some-other-class"]) is None
    assert (await Reads(op.executor).campaign(older_mid)).state == "ready"


@pytest.mark.rollback  # only SQL: a transaction rolled back after the test
async def test_one_leased_campaign_per_seat(actors: Actors, test_class: str) -> None:
    sensor, worker = await actors("sensor"), await actors("worker")
    a = (await sensor.open_campaign(test_class, "seat-a", "t", seat="repo-1")).campaign_id
    b = (await sensor.open_campaign(test_class, "seat-b", "t", seat="repo-1")).campaign_id
    c = (await sensor.open_campaign(test_class, "seat-c", "t")).campaign_id
    first = await worker.claim_campaign("w1", [test_class])
    second = await worker.claim_campaign("w2", [test_class])
    assert first is not None and second is not None
    assert (first.campaign_id, second.campaign_id) == (a, c)  # b waits for seat repo-1
    assert await worker.claim_campaign("w3", [test_class]) is None
    await worker.fail_attempt(first.campaign_id, first.generation, "done with the seat")
    # a is ready again (no backoff) and older than b: a seat frees for one of them.
    third = await worker.claim_campaign("w3", [test_class])
    assert third is not None and third.campaign_id in (a, b)
