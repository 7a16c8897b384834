"""The autonomy report: closures by day, human actions break the streak, and
an idle window reads as under-exercised, never as success."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from conftest import Actors
from drive import fingerprint, sha
from ledger import Kernel
from ledger.report import autonomy_report

# Only SQL on one connection: each test runs in a transaction rolled back after it.
pytestmark = [pytest.mark.anyio, pytest.mark.rollback]


def _midday(days_ago: int) -> datetime:
    today = datetime.now(timezone.utc).replace(hour=12, minute=0, second=0, microsecond=0)
    return today - timedelta(days=days_ago)


async def _close_one(actors: Actors, key: str, day: datetime) -> int:
    """Open, attempt, verify and confirm a campaign, every step at ``day`` (pinned),
    a second apart (well within each lease)."""
    step = iter(range(1, 100))

    async def at(actor: str, fn):
        await actors(actor)
        async with actors.session(actor).transaction(now=day + timedelta(seconds=next(step))) as tx:
            return await fn(Kernel(tx))

    cid = (await at("sensor", lambda k: k.open_campaign("test", key, "t"))).campaign_id
    claim = await at("worker", lambda k: k.claim_campaign("w", ["test"]))
    await at("worker", lambda k: k.record_attempt(cid, claim.generation, base_sha=sha(1),
                                                  candidate_sha=sha(2), fingerprint=fingerprint(1)))
    check = await at("verifier", lambda k: k.claim_verification("v"))
    await at("verifier", lambda k: k.accept(check.verification_id))
    started = day + timedelta(seconds=next(step))
    await at("sensor", lambda k: k.record_observation("s", key, "t", "green", started_at=started))
    return cid


async def test_idle_days_are_under_exercised_and_humans_break_the_streak(actors: Actors, test_class: str) -> None:
    reader = await actors.reads()
    empty = await autonomy_report(reader, 5)
    assert [d.verdict for d in empty.days] == ["under-exercised"] * 5
    assert empty.streak == 0

    await _close_one(actors, "a", _midday(3))
    await _close_one(actors, "b", _midday(2))
    await _close_one(actors, "c", _midday(1))
    # An operator steps in on day 1 (a by-hand campaign, abandoned).
    await actors("operator")
    async with actors.session("sensor").transaction(now=_midday(1) + timedelta(hours=1)) as tx:
        extra = (await Kernel(tx).open_campaign("test", "by-hand", "t")).campaign_id
    async with actors.session("operator").transaction(now=_midday(1) + timedelta(hours=2)) as tx:
        await Kernel(tx).abandon(extra, "a human decided", "cli:alice@host")

    report = await autonomy_report(reader, 5)
    by_age = {(datetime.now(timezone.utc).date() - d.day).days: d for d in report.days}
    assert by_age[4].verdict == "under-exercised"
    assert by_age[3].verdict == by_age[2].verdict == "autonomous"
    assert (by_age[3].opened, by_age[3].attempts, by_age[3].verified, by_age[3].confirmed) == (1, 1, 1, 1)
    assert by_age[1].verdict == "human-assisted" and by_age[1].human_actions == 1
    assert by_age[1].confirmed == 1
    # Today has nothing open: under-exercised, and the human on day 1 ended the streak.
    assert by_age[0].verdict == "under-exercised"
    assert report.streak == 0
    data = report.as_json()
    assert data["days"][1]["verdict"] == "autonomous"
