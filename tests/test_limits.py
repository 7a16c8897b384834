"""Limits and budgets (docs/limits.md): caps per key held by the claim
statement across connections, rate buckets, usage reported per attempt,
budgets that end a campaign in budget_exhausted until an operator raises it."""

from __future__ import annotations

import asyncio
import math
import time
from datetime import timedelta
from typing import Any

import pytest

from conftest import Actors, Admin
from drive import new_key, now
from ledger import Database, Kernel
from ledger.config import parse_config
from ledger.db.database import Transaction
from ledger.errors import ConfigError, IllegalTransition, InvalidInput, StaleLease

pytestmark = pytest.mark.anyio


async def _limited(actors: Actors, class_: str, *, cap: int | None = None, keys: list[str] | None = None,
                   resources: list[str] | None = None, max_cost: float | None = None) -> Kernel:
    op = await actors("operator")
    await op.set_class_limits(class_, limit_keys=keys if keys is not None else ["class"],
                              resources=resources or [], max_cost=max_cost, operator="alice")
    if cap is not None:
        await op.set_limit(f"class:{class_}", max_leased=cap, operator="alice")
    return op


# --- configuration and range checks -------------------------------------------


def test_the_configuration_declares_keys_buckets_and_budgets() -> None:
    config = parse_config({
        "limits": {"model-a": {"requests_per_minute": 60, "tokens_per_minute": 200000}},
        "keys": {"repo:app": {"max_leased": 8, "max_verifying": 2}, "tenant:acme": {"max_cost_per_day": 50}},
        "classes": {"fix": {"repository": "/srv/app", "attempt_command": ["agent"],
                            "limit_keys": ["class", "repo", "tenant"], "uses": ["model-a"],
                            "max_cost": 5, "max_leased": 4}},
    })
    cls = config.classes["fix"]
    assert cls.limit_templates() == ["class", "repo", "tenant"]
    assert config.key_limits()["class:fix"].max_leased == 4
    assert config.key_limits()["repo:app"].max_verifying == 2
    cases: list[tuple[dict[str, Any], str]] = [
        ({"limits": {"m": {"requests_per_minute": -1}}}, "limits.m.requests_per_minute"),
        ({"keys": {"nokind": {"max_leased": 1}}}, "KIND:VALUE"),
        ({"keys": {"repo:x": {"max_leased": 10**9}}}, "keys.repo:x.max_leased"),
        ({"classes": {"c": {"repository": "/r", "attempt_command": ["a"], "uses": ["nowhere"]}}},
         "has no [limits.RESOURCE] table"),
        ({"classes": {"c": {"repository": "/r", "attempt_command": ["a"], "max_cost": 0}}}, "max_cost"),
    ]
    for bad, said in cases:
        with pytest.raises(ConfigError) as failure:
            parse_config(bad)
        assert said in str(failure.value)


@pytest.mark.rollback
async def test_every_limit_is_range_checked_in_sql_with_its_name(actors: Actors, test_class: str) -> None:
    op = await actors("operator")
    for call, said in [
        (op.set_limit("repo:app", max_leased=-1), "max_leased must be"),
        (op.set_limit("repo:app", max_verifying=2_000_000), "max_verifying must be"),
        (op.set_limit("repo:app", max_cost_per_day=float("nan")), "max_cost_per_day must be"),
        (op.set_limit("repo:app", weight=0), "weight must be"),
        (op.set_limit("no kind", max_leased=1), "a limit key is KIND:VALUE"),
        (op.set_bucket("model-a", requests_per_minute=0), "requests_per_minute must be"),
        (op.set_bucket("model-a", tokens_per_minute=float("inf")), "tokens_per_minute must be"),
        (op.set_bucket("Model A"), "a resource is named"),
        (op.set_class_limits(test_class, max_cost=-5), "max_cost must be"),
        (op.set_class_limits(test_class, limit_keys=["has space:x y"]), "limit_keys are"),
    ]:
        with pytest.raises(InvalidInput, match=said):
            await call


# --- caps ---------------------------------------------------------------------


@pytest.mark.rollback
async def test_a_capped_campaign_waits_visibly_and_is_charged_nothing(actors: Actors, admin: Admin,
                                                                     test_class: str) -> None:
    sensor, worker = await actors("sensor"), await actors("worker")
    await _limited(actors, test_class, keys=["class", "repo"])
    await (await actors("operator")).set_limit("repo:app", max_leased=1, operator="alice")
    first = (await sensor.open_campaign(test_class, new_key(), "/srv/app#main")).campaign_id
    second = (await sensor.open_campaign(test_class, new_key(), "/srv/app.git#main")).campaign_id
    claim = await worker.claim_campaign("w1", [test_class])
    assert claim is not None and claim.campaign_id == first
    assert await worker.claim_campaign("w2", [test_class]) is None
    reads = await actors.reads()
    waiting = await reads.campaign(second)
    assert waiting.state == "ready" and waiting.limit_keys == ["class:test", "repo:app"]
    assert waiting.waiting_for == "limit repo:app 1/1"
    assert waiting.attempt_count == 0 and waiting.generation == 0  # nothing charged, never claimed
    # every ending gives the slot back: here a release
    await worker.release_attempt(first, claim.generation, "the remote is down", retry_after_s=3600)
    again = await worker.claim_campaign("w2", [test_class])
    assert again is not None and again.campaign_id == second
    row = admin.execute("SELECT leased FROM ledger_api.limit_keys WHERE key = 'repo:app'").fetchone()
    assert row["leased"] == 1


@pytest.mark.rollback
async def test_counters_follow_every_ending(actors: Actors, admin: Admin, test_class: str) -> None:
    sensor, worker, op = await actors("sensor"), await actors("worker"), await actors("operator")
    await _limited(actors, test_class, cap=5)
    ids = [(await sensor.open_campaign(test_class, new_key(), "t")).campaign_id for _ in range(4)]
    claims = [await worker.claim_campaign("w", [test_class]) for _ in ids]
    assert all(c is not None for c in claims)

    def leased() -> int:
        return admin.execute("SELECT leased FROM ledger_api.limit_keys WHERE key = 'class:test'").fetchone()["leased"]

    assert leased() == 4
    c0, c1, c2, c3 = claims
    assert c0 and c1 and c2 and c3
    await worker.fail_attempt(c0.campaign_id, c0.generation, "broke")
    await worker.record_attempt(c1.campaign_id, c1.generation, base_sha="a" * 40, candidate_sha="b" * 40,
                                fingerprint="fp:one-two-three")
    await op.abandon(c2.campaign_id, "no longer needed")
    assert leased() == 1
    batch = await worker.claim_campaigns("w", [test_class], limit=10)
    assert [b.campaign_id for b in batch] == [c0.campaign_id]  # the one ready again, under the cap
    assert leased() == 2


@pytest.mark.rollback
async def test_a_batch_claim_takes_no_more_than_the_room_under_a_cap(actors: Actors, admin: Admin,
                                                                     test_class: str) -> None:
    sensor, worker = await actors("sensor"), await actors("worker")
    await _limited(actors, test_class, cap=3)
    for _ in range(10):
        await sensor.open_campaign(test_class, new_key(), "t")
    batch = await worker.claim_campaigns("w", [test_class], limit=10)
    assert len(batch) == 3
    assert await worker.claim_campaigns("w", [test_class], limit=10) == []


async def _blocked_by(admin: Admin, pid: int, holder: int) -> bool:
    row = admin.execute("SELECT %s = ANY (pg_blocking_pids(%s)) AS b", (holder, pid)).fetchone()
    return bool(row["b"])


@pytest.mark.parametrize("holder_commits", [True, False])
async def test_two_claimers_one_slot_never_both(db: Database, actors: Actors, admin: Admin, test_class: str,
                                                holder_commits: bool) -> None:
    """Deterministic: the first claim holds the key's last slot uncommitted;
    the second, on another connection, queues on the key's counter row (not
    on any campaign), and once the first commits it gets nothing -- or, if
    the first rolls back, the slot."""
    await _limited(actors, test_class, cap=1)
    sensor = await actors("sensor")
    for _ in range(2):
        await sensor.open_campaign(test_class, new_key(), "t")
    a = await db.connect("worker", autocommit=False)
    b = await db.connect("worker", autocommit=False)
    try:
        first = await Kernel(Transaction(a)).claim_campaign("a", [test_class])
        assert first is not None
        second = asyncio.create_task(Kernel(Transaction(b)).claim_campaign("b", [test_class]))
        while not await _blocked_by(admin, b.info.backend_pid, a.info.backend_pid):
            assert not second.done(), "the second claim did not queue on the first's slot"
            await asyncio.wait([second], timeout=0.01)
        if holder_commits:
            await a.commit()
            assert await second is None
        else:
            await a.rollback()
            got = await second
            assert got is not None
        await b.commit()
        row = admin.execute("SELECT leased, (SELECT count(*) FROM ledger.campaign WHERE state = 'leased') AS n "
                            "FROM ledger_api.limit_keys WHERE key = 'class:test'").fetchone()
        assert row["leased"] == row["n"] == 1
    finally:
        await a.close()
        await b.close()


async def test_the_cap_race_repeated_on_real_connections(db: Database, actors: Actors, admin: Admin,
                                                        test_class: str) -> None:
    """Two claimers released together by a barrier, one slot, many rounds:
    never both (the journal's claims and the counter agree every time)."""
    await _limited(actors, test_class, cap=1)
    sensor = await actors("sensor")
    for _ in range(2):
        await sensor.open_campaign(test_class, new_key(), "t")
    conns = [await db.connect("worker") for _ in range(2)]
    kernels = [Kernel(Transaction(c)) for c in conns]
    rounds = 60
    try:
        for r in range(rounds):
            barrier = asyncio.Barrier(2)

            async def claim(i: int) -> object:
                await barrier.wait()
                return await kernels[i].claim_campaign(f"w{i}", [test_class])

            got = [c for c in await asyncio.gather(claim(0), claim(1)) if c is not None]
            assert len(got) == 1, f"round {r}: {len(got)} claims under a cap of 1"
            claim_ = got[0]
            await kernels[0].release_attempt(claim_.campaign_id, claim_.generation,  # type: ignore[attr-defined]
                                             "next round", retry_after_s=0)
    finally:
        for c in conns:
            await c.close()
    # from the journal, not the counters: leased at once never above 1
    events = admin.execute(
        "SELECT created_at, payload ->> 'to' AS to_state, payload ->> 'from' AS from_state "
        "FROM ledger.campaign_event WHERE type = 'transition' ORDER BY created_at, campaign_id, seq").fetchall()
    held = peak = 0
    for e in events:
        held += (e["to_state"] == "leased") - (e["from_state"] == "leased")
        peak = max(peak, held)
    assert peak == 1


# --- rate buckets ---------------------------------------------------------------


@pytest.mark.rollback
async def test_a_bucket_makes_claims_wait_until_it_has_room(actors: Actors, test_class: str) -> None:
    sensor = await actors("sensor")
    op = await _limited(actors, test_class, keys=[], resources=["model-a"])
    await op.set_bucket("model-a", requests_per_minute=60, tokens_per_minute=6000, operator="alice")
    for _ in range(3):
        await sensor.open_campaign(test_class, new_key(), "t")
    await actors("worker")
    session = actors.session("worker")
    start = now() + timedelta(seconds=5)  # the database's clock, pinned for each call

    async def claim_at(offset_s: float) -> object:
        async with session.transaction(now=start + timedelta(seconds=offset_s)) as tx:
            return await Kernel(tx).claim_campaign("w", [test_class])

    first = await claim_at(0)
    assert first is not None
    assert await claim_at(0.5) is None  # one request a second
    second = await claim_at(1.0)
    assert second is not None
    # tokens reported push the bucket: 3000 tokens at 6000 a minute is 30 s
    async with session.transaction(now=start + timedelta(seconds=1.0)) as tx:
        await Kernel(tx).report_usage(second.campaign_id, second.generation,  # type: ignore[attr-defined]
                                      tokens_in=2000, tokens_out=1000, key="r1")
    assert await claim_at(2.0) is None
    assert await claim_at(30.5) is None
    assert await claim_at(31.5) is not None


async def test_a_bucket_is_never_overshot_by_concurrent_claimers(db: Database, actors: Actors, admin: Admin,
                                                                test_class: str) -> None:
    """Four claimers on their own connections for a few seconds against 600
    requests a minute: at most 1 + rate x elapsed claims (GCRA, no burst)."""
    op = await _limited(actors, test_class, keys=[], resources=["model-a"])
    await op.set_bucket("model-a", requests_per_minute=600, operator="alice")
    admin.execute("SELECT ledger_api.open_campaign(%s, 'bucket-' || i, 't') FROM generate_series(1, 400) i",
                  (test_class,))
    conns = [await db.connect("worker") for _ in range(4)]
    deadline = time.monotonic() + 3.0
    claimed: list[int] = []

    async def claimer(conn: object) -> None:
        kernel = Kernel(Transaction(conn))  # type: ignore[arg-type]
        while time.monotonic() < deadline:
            claim = await kernel.claim_campaign("w", [test_class])
            if claim is not None:
                claimed.append(claim.campaign_id)
            else:
                await asyncio.sleep(0.005)  # polling a rate: the condition is the clock itself

    try:
        await asyncio.gather(*(claimer(c) for c in conns))
    finally:
        for c in conns:
            await c.close()
    times = [r["created_at"] for r in admin.execute(
        "SELECT created_at FROM ledger.campaign_event WHERE type = 'transition' AND payload ->> 'to' = 'leased' "
        "ORDER BY created_at").fetchall()]
    assert len(times) == len(claimed) >= 10
    elapsed = (times[-1] - times[0]).total_seconds()
    assert len(times) <= 1 + math.floor(elapsed * 10 + 1e-6) + 1
    gaps = [(b - a).total_seconds() for a, b in zip(times, times[1:])]
    assert min(gaps) >= 0.1 - 0.002, "two claims closer than the emission interval"


# --- usage and budgets -----------------------------------------------------------


@pytest.mark.rollback
async def test_usage_is_fenced_bounded_and_refused_with_a_reason(actors: Actors, admin: Admin,
                                                                test_class: str) -> None:
    sensor, worker = await actors("sensor"), await actors("worker")
    await _limited(actors, test_class, keys=["class", "tenant"])
    cid = (await sensor.open_campaign(test_class, new_key(), "t", labels=["tenant:acme"])).campaign_id
    claim = await worker.claim_campaign("w", [test_class])
    assert claim is not None
    got = await worker.report_usage(cid, claim.generation, tokens_in=100, tokens_out=20, requests=1,
                                    cost=0.25, key="k1")
    assert got.cost_spent == 0.25 and got.max_cost is None and not got.over_budget
    again = await worker.report_usage(cid, claim.generation, tokens_in=100, cost=0.25, key="k1")
    assert again.cost_spent == 0.25  # the same report retried counts once
    for kw, said in [({"tokens_in": -5}, "tokens_in must be"), ({"cost": float("nan")}, "cost must be"),
                     ({"cost": 10**9}, "cost must be"), ({"tokens_out": 10**12}, "tokens_out must be"),
                     ({"requests": -1}, "requests must be")]:
        with pytest.raises(InvalidInput, match=said):
            await worker.report_usage(cid, claim.generation, key="bad", **kw)  # type: ignore[arg-type]
    with pytest.raises(StaleLease):
        await worker.report_usage(cid, claim.generation - 1, cost=1.0, key="k2")
    usage = admin.execute("SELECT tokens_in, tokens_out, requests, cost, reports FROM ledger.attempt_usage").fetchall()
    assert [dict(u) for u in usage] == [{"tokens_in": 100, "tokens_out": 20, "requests": 1, "cost": 0.25,
                                         "reports": 1}]
    keys = {r["key"]: r["cost_today"] for r in admin.execute("SELECT key, cost_today FROM ledger_api.limit_keys")}
    assert keys == {"class:test": 0.25, "tenant:acme": 0.25}


@pytest.mark.rollback
async def test_a_campaign_over_its_budget_ends_budget_exhausted_until_raised(actors: Actors, admin: Admin,
                                                                            test_class: str) -> None:
    sensor, worker = await actors("sensor"), await actors("worker")
    op = await _limited(actors, test_class, keys=[], max_cost=1.0)
    cid = (await sensor.open_campaign(test_class, new_key(), "t")).campaign_id
    claim = await worker.claim_campaign("w", [test_class])
    assert claim is not None
    spent = await worker.report_usage(cid, claim.generation, tokens_in=5000, cost=1.2, key="k")
    assert spent.over_budget
    await worker.fail_attempt(cid, claim.generation, "not yet")
    reads = await actors.reads()
    campaign = await reads.campaign(cid)
    assert campaign.state == "budget_exhausted" and campaign.attempt_count == 1
    assert campaign.waiting_for == "budget 1.2/1 spent"
    ended = [e.payload for e in await reads.events(cid) if e.type == "transition"][-1]
    assert ended["transition"] == "exhaust_budget"
    assert (ended["cost_spent"], ended["max_cost"]) == (1.2, 1.0)
    assert await worker.claim_campaign("w", [test_class]) is None  # never started again
    with pytest.raises(InvalidInput, match="raise it above 1.2"):
        await op.raise_budget(cid, 1.0, operator="alice")
    assert await op.raise_budget(cid, 3.0, operator="alice", reason="worth another try") == "ready"
    raised = [e for e in await reads.events(cid) if e.type == "transition"][-1]
    assert raised.payload["transition"] == "raise_budget" and raised.actor == "alice"
    again = await worker.claim_campaign("w", [test_class])
    assert again is not None and again.campaign_id == cid
    journal = admin.execute("SELECT type, actor FROM ledger.limit_event WHERE subject = %s",
                            (f"campaign:{cid}",)).fetchall()
    assert [(j["type"], j["actor"]) for j in journal] == [("budget.raised", "alice")]
    await worker.fail_attempt(cid, again.generation, "still not")  # over budget again: ends again
    assert (await reads.campaign(cid)).state == "ready"  # 1.2 of 3.0: not yet
    await op.abandon(cid, "done")
    with pytest.raises(IllegalTransition, match="its budget is closed"):
        await op.raise_budget(cid, 9.0, operator="alice")


@pytest.mark.rollback
async def test_a_key_over_its_day_budget_waits(actors: Actors, test_class: str) -> None:
    sensor, worker = await actors("sensor"), await actors("worker")
    op = await _limited(actors, test_class, keys=["tenant"])
    await op.set_limit("tenant:acme", max_cost_per_day=2.0, operator="alice")
    cid = (await sensor.open_campaign(test_class, new_key(), "t", labels=["tenant:acme"])).campaign_id
    other = (await sensor.open_campaign(test_class, new_key(), "t", labels=["tenant:beta"])).campaign_id
    claim = await worker.claim_campaign("w", [test_class])
    assert claim is not None and claim.campaign_id == cid
    await worker.report_usage(cid, claim.generation, cost=2.5, key="k")
    await worker.fail_attempt(cid, claim.generation, "not yet")
    nxt = await worker.claim_campaign("w", [test_class])
    assert nxt is not None and nxt.campaign_id == other  # the light tenant goes on
    waiting = await (await actors.reads()).campaign(cid)
    assert waiting.state == "ready" and waiting.waiting_for == "budget tenant:acme 2.5/2 today"


# --- fair claims across keys ------------------------------------------------------


@pytest.mark.rollback
async def test_a_heavy_tenant_does_not_hold_up_a_light_ones_first_campaign(actors: Actors, admin: Admin,
                                                                          test_class: str) -> None:
    op = await actors("operator")
    await op.set_class_limits(test_class, fair_key="tenant", operator="alice")
    admin.execute("SELECT ledger_api.open_campaign(%s, 'heavy-' || i, 't', p_labels => ARRAY['tenant:heavy']) "
                  "FROM generate_series(1, 200) i", (test_class,))
    light = (await (await actors("sensor")).open_campaign(test_class, new_key(), "t",
                                                          labels=["tenant:light"])).campaign_id
    worker = await actors("worker")
    first = await worker.claim_campaign("w", [test_class])
    second = await worker.claim_campaign("w", [test_class])
    assert first is not None and second is not None
    assert light in (first.campaign_id, second.campaign_id)  # within one claim round
    # the batch path too, and weights: heavy of weight 3 takes three for light's one
    await op.set_limit("tenant:heavy", weight=3, operator="alice")
    for i in range(6):
        await (await actors("sensor")).open_campaign(test_class, new_key(), "t", labels=["tenant:light"])
    batch = await worker.claim_campaigns("w", [test_class], limit=8)
    tenants = [admin.execute("SELECT fair_key FROM ledger.campaign WHERE id = %s", (b.campaign_id,)).fetchone()
               ["fair_key"] for b in batch]
    assert len(batch) == 8
    assert tenants.count("tenant:heavy") == 6 and tenants.count("tenant:light") == 2, tenants  # 3 : 1
    unlabelled = (await (await actors("sensor")).open_campaign(test_class, new_key(), "t")).campaign_id
    assert (await (await actors.reads()).campaign(unlabelled)).fair_key == "tenant:-"


# --- the command line --------------------------------------------------------------


def test_ledger_limits_and_raise_budget_on_the_command_line(db_url: str, admin: Admin) -> None:
    import json as _json
    import subprocess
    import sys as _sys

    from conftest import TEST_PREFIX

    env = {**__import__("os").environ, "LEDGER_DATABASE_URL": db_url, "LEDGER_ROLE_PREFIX": TEST_PREFIX,
           "NO_COLOR": "1"}

    def ledger(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([_sys.executable, "-m", "ledger", *args], env=env, capture_output=True,
                              text=True, timeout=60)

    done = ledger("limits", "set", "repo:app", "--max-leased", "8", "--max-verifying", "2", "--json")
    assert done.returncode == 0, done.stderr
    assert _json.loads(done.stdout)["max_leased"] == 8
    refused = ledger("limits", "set", "repo:app", "--max-leased", "-3")
    assert refused.returncode == 2 and "max_leased must be" in refused.stderr
    done = ledger("limits", "bucket", "model-a", "--requests-per-minute", "60")
    assert done.returncode == 0, done.stderr
    shown = _json.loads(ledger("limits", "show", "--json").stdout)
    assert [k["key"] for k in shown["keys"]] == ["repo:app"]
    assert shown["buckets"][0]["requests_per_minute"] == 60
    assert {e["type"] for e in shown["events"]} == {"limit.set", "bucket.set"}
    assert all(e["actor"].startswith("cli:") for e in shown["events"])
    missing = ledger("raise-budget", "999", "--max-cost", "5")
    assert missing.returncode == 6, missing.stderr


@pytest.mark.rollback
async def test_a_cap_on_verification_holds_the_verifiers_claims(actors: Actors, admin: Admin,
                                                                test_class: str) -> None:
    from drive import Driver

    await _limited(actors, test_class, keys=["repo"])
    await (await actors("operator")).set_limit("repo:target-1", max_verifying=1, operator="alice")
    d = Driver(actors, test_class)
    first, _ = await d.attempted(1)
    second, _ = await d.attempted(2)
    verifier = await actors("verifier")
    claim = await verifier.claim_verification("verifier-1", classes=[test_class])
    assert claim is not None
    assert await verifier.claim_verification("verifier-2", classes=[test_class]) is None  # at its cap
    row = admin.execute("SELECT verifying FROM ledger_api.limit_keys WHERE key = 'repo:target-1'").fetchone()
    assert row is not None and row["verifying"] == 1
    await verifier.accept(claim.verification_id, {"ok": True})
    other = await verifier.claim_verification("verifier-2", classes=[test_class])
    assert other is not None and {claim.campaign_id, other.campaign_id} == {first, second}
