"""Invariants as indexes (README "How it works"): one open campaign per objective, even under concurrent intake."""

from __future__ import annotations

import asyncio

import pytest

from conftest import Actors, Admin
from drive import wait_for_lock_waiters
from ledger import Database, DuplicateObjective, Kernel, NotFound
from ledger.db.database import Transaction
from ledger.db.reads import Reads
from ledger.errors import InvalidInput

pytestmark = pytest.mark.anyio


@pytest.mark.rollback  # only SQL: a transaction rolled back after the test
async def test_opening_twice_returns_the_open_campaign(actors: Actors, admin: Admin, test_class: str) -> None:
    sensor = await actors("sensor")
    first = await sensor.open_campaign(test_class, "obj", "t")
    again = await sensor.open_campaign(test_class, "obj", "t")
    assert first.created and not again.created
    assert again.campaign_id == first.campaign_id
    # Once it is closed, the objective may open again.
    await (await actors("operator")).abandon(first.campaign_id)
    third = await sensor.open_campaign(test_class, "obj", "t")
    assert third.created and third.campaign_id != first.campaign_id
    assert admin.execute("SELECT count(*) AS n FROM ledger.campaign WHERE objective_key = 'obj' "
                         "AND state NOT IN ('confirmed','dismissed','abandoned')").fetchone()["n"] == 1


async def test_concurrent_opens_yield_one_campaign(db: Database, admin: Admin, test_class: str) -> None:
    conns = [await db.connect("sensor", autocommit=False) for _ in range(8)]
    try:
        # Every connection inserts inside an open transaction, then all commit
        # together: the partial unique index, not luck, keeps one.
        results = await asyncio.gather(*(
            Kernel(Transaction(c)).open_campaign(test_class, "race", "t") for c in conns[:1]))
        pending = [asyncio.create_task(Kernel(Transaction(c)).open_campaign(test_class, "race", "t"))
                   for c in conns[1:]]
        await wait_for_lock_waiters(db, "ledger:sensor", count=len(pending))
        await conns[0].commit()
        results += await asyncio.gather(*pending)
        for c in conns[1:]:
            await c.commit()
    finally:
        for c in conns:
            await c.close()
    assert sum(r.created for r in results) == 1
    assert len({r.campaign_id for r in results}) == 1
    assert admin.execute("SELECT count(*) AS n FROM ledger.campaign WHERE objective_key = 'race'"
                         ).fetchone()["n"] == 1
    assert admin.execute("SELECT count(*) AS n FROM ledger.campaign_event").fetchone()["n"] == 1


@pytest.mark.rollback  # only SQL: a transaction rolled back after the test
async def test_same_objective_under_another_class_is_a_duplicate(actors: Actors, test_class: str) -> None:
    op, sensor = await actors("operator"), await actors("sensor")
    await op.register_class("other")
    await sensor.open_campaign(test_class, "obj", "t")
    with pytest.raises(DuplicateObjective):
        await sensor.open_campaign("other", "obj", "t")
    with pytest.raises(DuplicateObjective):
        await sensor.open_campaign(test_class, "obj", "another-target")


@pytest.mark.rollback  # only SQL: a transaction rolled back after the test
async def test_bad_input_is_refused_clearly(actors: Actors, test_class: str) -> None:
    sensor = await actors("sensor")
    with pytest.raises(NotFound, match="not registered"):
        await sensor.open_campaign("no-such-class", "obj", "t")
    with pytest.raises(InvalidInput):
        await sensor.open_campaign(test_class, "", "t")
    with pytest.raises(InvalidInput):
        await sensor.record_observation("s", "obj", "t", "purple", started_at=__import__("datetime").datetime.now().astimezone())


@pytest.mark.rollback  # only SQL: a transaction rolled back after the test
async def test_a_nul_character_is_invalid_input_not_a_crash(actors: Actors, test_class: str) -> None:
    sensor = await actors("sensor")
    with pytest.raises(InvalidInput):
        await sensor.open_campaign(test_class, "bad\x00key", "t")
    assert await Reads(sensor.executor).campaigns(objective_key="bad") == []
