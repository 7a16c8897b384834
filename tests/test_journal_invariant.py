"""Every state change, by any writer, has exactly one journal event, written
in the same transaction; a change rolled back leaves none.

The state changes are counted by a witness the test installs, independent
of Ledger's journal: a plain row trigger on ``ledger.campaign`` that logs
each change with the id of the (sub)transaction that made it (the ``xmin``
of its log row). The journal's transition events, with their own ``xmin``,
must be the same multiset: one event per change, none without a change,
none in another transaction. Single-row writers (per-row journal trigger)
and batch writers (statement trigger over transition tables) alike.
"""

from __future__ import annotations

import json
from collections import Counter
from datetime import timedelta

import psycopg
import pytest

from drive import Driver, fingerprint, sha
from ledger import Kernel

pytestmark = pytest.mark.anyio

WITNESS = """
CREATE TABLE public.witness (campaign_id bigint, from_state text, to_state text);
CREATE FUNCTION public.witness() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    INSERT INTO public.witness VALUES (NEW.id, CASE WHEN TG_OP = 'UPDATE' THEN OLD.state END, NEW.state);
    RETURN NULL;
END $$;
CREATE TRIGGER witness_insert AFTER INSERT ON ledger.campaign
    FOR EACH ROW EXECUTE FUNCTION public.witness();
CREATE TRIGGER witness_update AFTER UPDATE ON ledger.campaign
    FOR EACH ROW WHEN (OLD.state IS DISTINCT FROM NEW.state) EXECUTE FUNCTION public.witness();
"""


def _changes(admin: psycopg.Connection) -> Counter:
    rows = admin.execute("SELECT campaign_id, from_state, to_state, xmin::text AS x FROM public.witness").fetchall()
    return Counter((r["campaign_id"], r["from_state"], r["to_state"], r["x"]) for r in rows)


def _events(admin: psycopg.Connection) -> Counter:
    rows = admin.execute("SELECT campaign_id, payload ->> 'from' AS f, payload ->> 'to' AS t, xmin::text AS x "
                         "FROM ledger.campaign_event WHERE type = 'transition'").fetchall()
    return Counter((r["campaign_id"], r["f"], r["t"], r["x"]) for r in rows)


def _check(admin: psycopg.Connection) -> int:
    changes, events = _changes(admin), _events(admin)
    assert events == changes, {"without event": changes - events, "without change": events - changes}
    return sum(changes.values())


async def test_one_event_per_state_change_for_single_and_batch_writers(actors, admin) -> None:
    admin.execute(WITNESS)
    op = await actors("operator")
    await op.register_class("inv", lease_seconds=30, max_attempts=2, backoff_base_s=0, backoff_jitter=0)
    d = Driver(actors, "inv")
    worker, verifier = await actors("worker"), await actors("verifier")
    await actors("reaper")

    # single-row writers: open, claim, record, verify (accept, reject), fail, abandon
    for _ in range(12):
        await d.open()
    one = await worker.claim_campaign("w1", ["inv"])
    assert one is not None
    await worker.record_attempt(one.campaign_id, one.generation, base_sha=sha(1), candidate_sha=sha(2),
                                fingerprint=fingerprint(1))
    v = await verifier.claim_verification("v1", classes=["inv"])
    assert v is not None
    assert await verifier.reject(v.verification_id, "no") == "ready"
    two = await worker.claim_campaign("w1", ["inv"])
    assert two is not None
    # the rejected campaign again: its second attempt spends the budget
    assert await worker.fail_attempt(two.campaign_id, two.generation, "boom") == "exhausted"
    three = await worker.claim_campaign("w1", ["inv"])
    assert three is not None
    await op.abandon(three.campaign_id, reason="test")
    single = _check(admin)
    assert single >= 12 + 7

    # batch writers: claim_campaigns, record_attempts, expire_leases
    batch = await worker.claim_campaigns("w2", ["inv"], limit=6)
    assert len(batch) == 6
    assert _check(admin) == single + 6
    recorded = await worker.record_attempts([
        {"campaign_id": c.campaign_id, "generation": c.generation, "candidate_sha": sha(10 + i),
         "fingerprint": fingerprint(10 + i), "base_sha": sha(1)} for i, c in enumerate(batch[:3])])
    assert [r.status for r in recorded] == ["recorded"] * 3
    assert _check(admin) == single + 9
    # the rest of the batch expires, in one reaper statement: back to ready,
    # and the campaigns whose budget that spends are exhausted after it
    later = admin.execute("SELECT max(lease_expires_at) AS t FROM ledger.campaign").fetchone()["t"]
    async with actors.session("reaper").transaction(now=later + timedelta(minutes=5)) as tx:
        reaped = await Kernel(tx).expire_leases()
    assert len(reaped) == 3 + 0
    total = _check(admin)
    assert total == single + 12
    # leases whose loss spends the budget: reaped and exhausted, both in batches
    await op.register_class("inv1", lease_seconds=30, max_attempts=1)
    for _ in range(3):
        await Driver(actors, "inv1").open()
    assert len(await worker.claim_campaigns("w3", ["inv1"], limit=3)) == 3
    later = admin.execute("SELECT max(lease_expires_at) AS t FROM ledger.campaign").fetchone()["t"]
    async with actors.session("reaper").transaction(now=later + timedelta(minutes=5)) as tx:
        reaped = await Kernel(tx).expire_leases()
    assert sorted(r.state for r in reaped) == ["exhausted"] * 3
    assert _check(admin) == total + 3 + 3 + 3 + 3  # open, claim, expire, exhaust
    # and the per-event details of a batch match the per-row path's
    rec = admin.execute("SELECT actor, payload FROM ledger.campaign_event WHERE campaign_id = %s "
                        "AND payload ->> 'transition' = 'record_attempt'", (batch[0].campaign_id,)).fetchone()
    assert rec["actor"] == "w2"
    assert rec["payload"]["candidate_sha"] == sha(10) and rec["payload"]["attempt_no"] == 1
    assert rec["payload"]["from"] == "leased" and rec["payload"]["to"] == "attempted"
    # the single record names its attempt and holder as the batch's do
    # (record_attempt passes them in its detail; the trigger reads nothing back)
    rec = admin.execute("SELECT actor, payload FROM ledger.campaign_event WHERE campaign_id = %s "
                        "AND payload ->> 'transition' = 'record_attempt'", (one.campaign_id,)).fetchone()
    assert rec["actor"] == "w1"
    assert {k: rec["payload"][k] for k in ("attempt_no", "fingerprint", "candidate_sha", "base_sha")} == {
        "attempt_no": 1, "fingerprint": fingerprint(1), "candidate_sha": sha(2), "base_sha": sha(1)}


async def test_a_rolled_back_change_leaves_no_event(actors, admin) -> None:
    admin.execute(WITNESS)
    op = await actors("operator")
    await op.register_class("inv", lease_seconds=30, backoff_base_s=0, backoff_jitter=0)
    d = Driver(actors, "inv")
    for _ in range(8):
        await d.open()
    before = _check(admin)
    state = admin.execute("SELECT id, state, generation, event_seq FROM ledger.campaign ORDER BY id").fetchall()

    # a whole transaction rolled back, batch and single writers in it
    with pytest.raises(RuntimeError):
        with admin.transaction():
            admin.execute("SELECT * FROM ledger_api.claim_campaigns('w', ARRAY['inv'], 5)")
            admin.execute("SELECT * FROM ledger_api.claim_campaign('w', ARRAY['inv'])")
            raise RuntimeError("roll back")
    assert _check(admin) == before
    assert admin.execute("SELECT id, state, generation, event_seq FROM ledger.campaign ORDER BY id").fetchall() == state

    # a savepoint rolled back inside a transaction that commits
    with admin.transaction():
        with pytest.raises(RuntimeError):
            with admin.transaction():
                admin.execute("SELECT * FROM ledger_api.claim_campaigns('w', ARRAY['inv'], 3)")
                raise RuntimeError("roll back to the savepoint")
        kept = admin.execute("SELECT * FROM ledger_api.claim_campaigns('w', ARRAY['inv'], 2)").fetchall()
    assert len(kept) == 2
    assert _check(admin) == before + 2

    # a batch that fails part way (an item's approach already failed) writes nothing
    one = admin.execute("SELECT * FROM ledger_api.claim_campaign('w', ARRAY['inv'])").fetchone()
    admin.execute("SELECT ledger_api.fail_attempt(%s, %s, 'boom', %s)",
                  (one["campaign_id"], one["generation"], fingerprint(7)))
    again = admin.execute("SELECT * FROM ledger_api.claim_campaigns('w', ARRAY['inv'], 10)").fetchall()
    mark = _check(admin)
    items = [{"campaign_id": c["campaign_id"], "generation": c["generation"], "candidate_sha": sha(50 + i),
              "fingerprint": fingerprint(7 if c["campaign_id"] == one["campaign_id"] else 60 + i)}
             for i, c in enumerate(again)]
    assert one["campaign_id"] in [c["campaign_id"] for c in again]
    with pytest.raises(psycopg.Error):
        admin.execute("SELECT * FROM ledger_api.record_attempts(%s::jsonb)", (json.dumps(items),))
    assert _check(admin) == mark
