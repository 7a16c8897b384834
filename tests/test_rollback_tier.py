"""The rolled-back tier runs the production executor (``ledger.db.database``'s
``Session`` and ``Transaction``) inside the test's transaction, not a twin of
it: a change to retries, adaptation or role-taking is tested in both tiers."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest

from conftest import TEST_PREFIX, Actors, Admin
from ledger import Forbidden
from ledger.db.database import Session, Transaction
from ledger.db.named_queries import Query

pytestmark = [pytest.mark.anyio, pytest.mark.rollback]

WHO = Query("SELECT current_user AS role, current_setting('ledger.now', true) AS now")


async def test_the_actors_are_production_sessions_and_transactions(actors: Actors,
                                                                   admin: Admin) -> None:
    await actors("operator")
    session = actors.session("operator")
    assert type(session) is Session
    pinned = datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)
    async with session.transaction(now=pinned) as tx:
        assert type(tx) is Transaction
        [row] = await tx.fetch(WHO)
        assert row["role"] == f"{TEST_PREFIX}operator"
        assert datetime.fromisoformat(row["now"]) == pinned
    # What the transaction set ends with it, as it would on its own connection.
    after = admin.execute("SELECT current_user AS role, "
                          "current_setting('ledger.now', true) AS now").fetchone()
    assert after is not None
    assert after["role"] != f"{TEST_PREFIX}operator" and not after["now"]
    [row] = await session.fetch(WHO)
    assert row["role"] == f"{TEST_PREFIX}operator" and not row["now"]


async def test_a_refused_call_undoes_only_itself(actors: Actors, admin: Admin,
                                                 test_class: str) -> None:
    sensor, worker = await actors("sensor"), await actors("worker")
    opened = await sensor.open_campaign(test_class, "tier-kept", "t")
    with pytest.raises(Forbidden):  # the worker's role may not register classes
        await worker.register_class("tier-refused", max_attempts=1, lease_seconds=30)
    again = await sensor.open_campaign(test_class, "tier-after", "t")
    rows = admin.execute("SELECT objective_key FROM ledger.campaign WHERE id = ANY(%s) "
                         "ORDER BY id", ([opened.campaign_id, again.campaign_id],)).fetchall()
    assert [r["objective_key"] for r in rows] == ["tier-kept", "tier-after"]
    assert admin.execute("SELECT count(*) AS n FROM ledger.campaign_class "
                         "WHERE name = 'tier-refused'").fetchone() == {"n": 0}


async def test_sessions_in_tasks_take_turns_on_the_one_connection(actors: Actors,
                                                                  test_class: str) -> None:
    """Calls of several roles at once (a service beside the test) wait for
    each other's loan instead of interleaving on the connection."""
    sensor = await actors("sensor")
    reads = await actors.reads("reader")
    opened = await asyncio.gather(*(sensor.open_campaign(test_class, f"turn-{i}", "t")
                                    for i in range(5)))
    seen = await asyncio.gather(*(reads.campaign(o.campaign_id) for o in opened))
    assert [c.objective_key for c in seen] == [f"turn-{i}" for i in range(5)]
