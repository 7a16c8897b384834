"""The load drill's time-out verdict explains itself (README "Load"): what was left
by state, the oldest open campaign's last events, and whether the fleet was
still bringing campaigns to rest -- read from a real database."""

from __future__ import annotations

from pathlib import Path

import pytest
from rich.console import Console

from ledger import Database
from ledger.ops.drill import DrillContext

pytestmark = pytest.mark.anyio


async def test_a_stalled_fleet_is_told_apart_from_a_slow_one(db: Database, actors, test_class: str,
                                                             tmp_path: Path) -> None:
    import ledger.drills.load as load

    ctx = DrillContext(load.Load(), db, tmp_path, Console(quiet=True), 1.0)
    sensor, worker = await actors("sensor"), await actors("worker")
    ids = [(await sensor.open_campaign(test_class, f"objective-{i}", "repo")).campaign_id for i in range(3)]
    claim = await worker.claim_campaign("drill-worker", [test_class])
    assert claim is not None and claim.campaign_id == ids[0]

    stalled = load.Load.explain(ctx)
    assert "left: leased=1, ready=2" in stalled
    assert "NOT making progress: no campaign came to rest in the last 30 s" in stalled
    assert f"the oldest open campaign {ids[0]} is leased after 0 attempt(s)" in stalled
    assert "claim by drill-worker" in stalled  # its last events, with who wrote them
    assert "0 campaigns came to rest, 0 in the last 30 s" in load.Load.progress(ctx)

    # one campaign comes to rest (its only attempt used up): the fleet is moving
    op = await actors("operator")
    await op.register_class("once", max_attempts=1, lease_seconds=30, backoff_base_s=0, backoff_jitter=0)
    once = (await sensor.open_campaign("once", "objective-once", "repo")).campaign_id
    got = await worker.claim_campaign("drill-worker", ["once"])
    assert got is not None and got.campaign_id == once
    await worker.fail_attempt(once, got.generation, "no luck")
    moving = load.Load.explain(ctx)
    assert "still making progress: 1 campaign(s) came to rest in the last 30 s" in moving
    assert "exhausted=1" in moving
    assert "1 campaigns came to rest, 1 in the last 30 s" in load.Load.progress(ctx)
