"""Fencing: a superseded generation changes nothing, and the reaper never
reaps a lease renewed after it read it."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

from conftest import Actors, Admin
from drive import Driver, fingerprint, now, sha, wait_for_lock_waiters
from ledger import Database, Kernel, StaleLease

pytestmark = pytest.mark.anyio


def _state(admin: Admin, cid: int) -> tuple:
    return (
        admin.execute("SELECT * FROM ledger.campaign WHERE id = %s", (cid,)).fetchone(),
        admin.execute("SELECT * FROM ledger.campaign_event WHERE campaign_id = %s ORDER BY seq", (cid,)).fetchall(),
        admin.execute("SELECT * FROM ledger.attempt WHERE campaign_id = %s ORDER BY id", (cid,)).fetchall(),
        admin.execute("SELECT * FROM ledger.side_effect WHERE campaign_id = %s", (cid,)).fetchall(),
    )


async def _stale_writes_change_nothing(worker: Kernel, admin: Admin, cid: int, gen: int) -> None:
    before = _state(admin, cid)
    with pytest.raises(StaleLease):
        await worker.heartbeat(cid, gen)
    with pytest.raises(StaleLease):
        await worker.record_attempt(cid, gen, base_sha=sha(1), candidate_sha=sha(2),
                                    fingerprint=fingerprint(1))
    with pytest.raises(StaleLease):
        await worker.fail_attempt(cid, gen, "late")
    with pytest.raises(StaleLease):
        await worker.append_events(cid, gen, [{"type": "output", "payload": {"line": "x"}, "delta": True}])
    with pytest.raises(StaleLease):
        await worker.request_side_effect(cid, gen, kind="git.update_ref", target="refs/heads/ledger/x",
                                         precondition={}, idempotency_key="k-late")
    assert _state(admin, cid) == before


@pytest.mark.rollback  # only SQL: a transaction rolled back after the test
async def test_reaped_generation_is_fenced_out(actors: Actors, admin: Admin, test_class: str) -> None:
    d = Driver(actors, test_class)
    cid, gen = await d.leased()
    reaper = await actors("reaper")
    async with actors.session("reaper").transaction(now=now() + timedelta(minutes=5)) as tx:
        reaped = await Kernel(tx).expire_leases()
    assert [(r.campaign_id, r.generation, r.state) for r in reaped] == [(cid, gen + 1, "ready")]
    assert reaper is not None
    await _stale_writes_change_nothing(await actors("worker"), admin, cid, gen)
    attempt = admin.execute("SELECT outcome, failure_reason FROM ledger.attempt WHERE campaign_id = %s", (cid,)).fetchone()
    assert attempt == {"outcome": "lost", "failure_reason": "lease expired"}
    row = admin.execute("SELECT state, attempt_count FROM ledger.campaign WHERE id = %s", (cid,)).fetchone()
    assert row == {"state": "ready", "attempt_count": 1}


@pytest.mark.rollback  # only SQL: a transaction rolled back after the test
async def test_abandoned_generation_is_fenced_out(actors: Actors, admin: Admin, test_class: str) -> None:
    d = Driver(actors, test_class)
    cid, gen = await d.leased()
    assert await (await actors("operator")).abandon(cid, "stop") == gen + 1
    await _stale_writes_change_nothing(await actors("worker"), admin, cid, gen)


@pytest.mark.rollback  # only SQL: a transaction rolled back after the test
async def test_reclaimed_campaign_fences_the_previous_holder(actors: Actors, admin: Admin, test_class: str) -> None:
    d = Driver(actors, test_class)
    worker = await actors("worker")
    cid, gen = await d.leased("first")
    await worker.fail_attempt(cid, gen, "try again")
    again = await worker.claim_campaign("second", [test_class])
    assert again is not None and again.campaign_id == cid and again.generation == gen + 1
    await _stale_writes_change_nothing(worker, admin, cid, gen)
    await worker.heartbeat(cid, again.generation)  # the current holder still can


@pytest.mark.parametrize("heartbeat", [True, False], ids=["renewed", "not-renewed"])
async def test_reaper_retests_expiry_inside_its_update(db: Database, actors: Actors, admin: Admin, test_class: str,
                                                       heartbeat: bool) -> None:
    """The reaper reads the lease as expired, then the worker renews it, then
    the reaper writes: the renewed lease must survive. Forced deterministically:
    the worker's heartbeat holds the row lock (uncommitted) while the reaper's
    UPDATE, which already selected the row as expired, waits for it."""
    d = Driver(actors, test_class)
    cid, gen = await d.leased()
    claimed_at = admin.execute("SELECT leased_at FROM ledger.campaign WHERE id = %s", (cid,)).fetchone()["leased_at"]
    reaper_now = claimed_at + timedelta(seconds=45)  # lease is 30 s: expired
    worker_now = claimed_at + timedelta(seconds=25)  # renewal while live -> expires at +55 s

    await actors("worker")
    await actors("reaper")
    async with actors.session("worker").transaction(now=worker_now) as wtx:
        if heartbeat:
            await Kernel(wtx).heartbeat(cid, gen)  # row locked until commit

        async def reap() -> list:
            async with actors.session("reaper").transaction(now=reaper_now) as rtx:
                return await Kernel(rtx).expire_leases()

        reaping = asyncio.create_task(reap())
        if heartbeat:
            await wait_for_lock_waiters(db, "ledger:reaper")
        else:
            await asyncio.wait_for(asyncio.shield(reaping), 10)
    reaped = await reaping

    row = admin.execute("SELECT state, generation FROM ledger.campaign WHERE id = %s", (cid,)).fetchone()
    if heartbeat:
        assert reaped == []
        assert row == {"state": "leased", "generation": gen}
    else:
        assert [r.campaign_id for r in reaped] == [cid]
        assert row == {"state": "ready", "generation": gen + 1}


@pytest.mark.rollback  # only SQL: a transaction rolled back after the test
async def test_grace_window_delays_reaping(actors: Actors, admin: Admin, test_class: str) -> None:
    d = Driver(actors, test_class)
    cid, _ = await d.leased()
    await actors("reaper")
    expires = admin.execute("SELECT lease_expires_at FROM ledger.campaign WHERE id = %s", (cid,)).fetchone()["lease_expires_at"]
    async with actors.session("reaper").transaction(now=expires + timedelta(seconds=5)) as tx:
        assert await Kernel(tx).expire_leases(grace_s=10) == []
    async with actors.session("reaper").transaction(now=expires + timedelta(seconds=11)) as tx:
        assert [r.campaign_id for r in await Kernel(tx).expire_leases(grace_s=10)] == [cid]


@pytest.mark.rollback  # only SQL: a transaction rolled back after the test
async def test_an_allowed_target_cannot_smuggle_another_host_in_its_payload(actors: Actors, admin: Admin) -> None:
    from ledger import Forbidden

    op = await actors("operator")
    await op.register_class("hooks", lease_seconds=30, authority={"worker": {"hosts": ["hooks.internal"]}})
    d = Driver(actors, "hooks")
    cid, gen = await d.leased()
    worker = await actors("worker")
    ok = await worker.request_side_effect(cid, gen, kind="http.request", target="https://hooks.internal/x",
                                          precondition={}, idempotency_key="fine",
                                          payload={"url": "https://hooks.internal/x",
                                                   "read_back": {"url": "https://hooks.internal/x/1"}})
    assert ok.status == "requested"
    for payload in ({"url": "https://elsewhere.example/x"},
                    {"url": "https://hooks.internal/x", "read_back": {"url": "http://elsewhere.example/"}}):
        with pytest.raises(Forbidden):
            await worker.request_side_effect(cid, gen, kind="http.request", target="https://hooks.internal/x",
                                             precondition={}, idempotency_key=f"smuggle-{len(payload)}",
                                             payload=payload)
    assert admin.execute("SELECT count(*) AS n FROM ledger.security_event").fetchone()["n"] == 2
    assert admin.execute("SELECT count(*) AS n FROM ledger.side_effect").fetchone()["n"] == 1
