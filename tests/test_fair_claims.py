"""Fair claims across classes: a backlog in one class does not starve another.

The issue's case is 100,000 ready campaigns in one class and 50 in another:
all 50 claimed within the first ~100 claims of a fleet serving both. Here
the backlog is 4,000, opened first (so older): under the old order
(priority, then age, across classes) the small class's first claim came
only after the whole backlog, at claim 4,001, so the test fails on it just as
it would with 100,000; the rotation never looks past each class's head, so
the backlog's size does not change which claim serves the small class
(bench/scale.py and `python -m bench --only fair` time it at 100,000 and 1M).
"""

from __future__ import annotations

import asyncio

import pytest

from ledger import Database, Kernel
from ledger.db.database import Transaction
from ledger.errors import LedgerError

pytestmark = pytest.mark.anyio

BACKLOG = 4000
SMALL = 50
FLEET = 4


def _open(admin, class_: str, n: int, prefix: str) -> None:
    # The superuser calls the sensor's function for speed; it is the same code path.
    admin.execute(
        "SELECT ledger_api.open_campaign(%s, %s || '-' || i, 't') FROM generate_series(1, %s) AS i",
        (class_, prefix, n))


async def _classes(actors, **weights: int) -> None:
    op = await actors("operator")
    for name, weight in weights.items():
        await op.register_class(name, lease_seconds=60, backoff_base_s=0, backoff_jitter=0, weight=weight)


def _claim_order(admin) -> list[str]:
    # The order in which the claims committed their attempt rows.
    rows = admin.execute("SELECT c.class FROM ledger.attempt a JOIN ledger.campaign c ON c.id = a.campaign_id "
                         "ORDER BY a.id").fetchall()
    return [r["class"] for r in rows]


async def test_a_fleet_serving_both_classes_drains_the_small_one_within_twice_its_size(
        db: Database, actors, admin) -> None:
    await _classes(actors, big=1, small=1)
    _open(admin, "big", BACKLOG, "big")
    _open(admin, "small", SMALL, "small")
    small_left = SMALL
    stop = asyncio.Event()

    async def claimer(i: int) -> None:
        nonlocal small_left
        conn = await db.connect("worker")
        kernel = Kernel(Transaction(conn))
        try:
            while not stop.is_set():
                claim = await kernel.claim_campaign(f"fleet-{i}")  # every class
                assert claim is not None
                if claim.class_ == "small":
                    small_left -= 1
                    if small_left == 0:
                        stop.set()
        finally:
            await conn.close()

    await asyncio.gather(*(claimer(i) for i in range(FLEET)))
    order = _claim_order(admin)
    assert order.count("small") == SMALL
    last_small = max(i for i, c in enumerate(order) if c == "small") + 1
    # Turns alternate between the two classes; concurrent claimers may commit
    # their attempt rows in a different order from the turns they took, by
    # at most one claim per other member of the fleet.
    assert last_small <= 2 * SMALL + FLEET - 1, (last_small, order[:120])
    # and the backlog was served all along, not pushed back
    assert order[:2 * SMALL].count("big") >= SMALL - FLEET


async def test_weights_share_the_claims(actors, admin) -> None:
    await _classes(actors, heavy=3, light=1)
    _open(admin, "heavy", 200, "h")
    _open(admin, "light", 200, "l")
    worker = await actors("worker")
    order = []
    for _ in range(80):
        claim = await worker.claim_campaign("w")
        assert claim is not None
        order.append(claim.class_)
    # one claimer: the rotation is exact, three heavy turns for one light
    assert order.count("heavy") == 60 and order.count("light") == 20, order
    assert all(order[i:i + 4].count("light") == 1 for i in range(0, 80, 4)), order


async def test_an_empty_class_takes_no_turns_and_a_named_class_is_served_alone(
        actors, admin) -> None:
    await _classes(actors, a=1, b=1, empty=5)
    _open(admin, "a", 30, "a")
    _open(admin, "b", 30, "b")
    worker = await actors("worker")
    order = [(await worker.claim_campaign("w")).class_ for _ in range(20)]
    assert order.count("a") == order.count("b") == 10, order
    only_b = [(await worker.claim_campaign("w", ["b"])).class_ for _ in range(5)]
    assert only_b == ["b"] * 5


async def test_a_batch_is_shared_by_weight(actors, admin) -> None:
    await _classes(actors, big=1, small=1, other=2)
    _open(admin, "big", 300, "big")
    _open(admin, "small", 3, "small")
    worker = await actors("worker")
    first = await worker.claim_campaigns("w", ["big", "small"], limit=10)
    # the small class's three heads are in the first batch, the rest fill it
    assert sorted(c.class_ for c in first) == ["big"] * 7 + ["small"] * 3
    _open(admin, "other", 100, "other")
    second = await worker.claim_campaigns("w", limit=12)
    assert sorted(c.class_ for c in second) == ["big"] * 4 + ["other"] * 8
    assert len({c.campaign_id for c in first + second}) == 22


async def test_weight_is_range_checked(actors) -> None:
    op = await actors("operator")
    for bad in (0, -1, 1001):
        with pytest.raises(LedgerError, match="weight"):
            await op.register_class("w", weight=bad)
    await op.register_class("w", weight=1000)
    assert {c.name: c.weight for c in await (await actors.reads()).classes()}["w"] == 1000
