"""Every state change writes exactly one journal event in its transaction; the
journal is append-only for everyone, owner included."""

from __future__ import annotations

import psycopg
import pytest
from psycopg import sql

from conftest import TEST_PREFIX, Actors, Admin, AsRole
from drive import PROMOTING_CLASS, Driver, eventually, fingerprint, now, sha
from ledger import Database, Kernel
from ledger.db.reads import Reads
from ledger.roles.journal import JournalWriter

pytestmark = pytest.mark.anyio

RUNTIME = ("reader", "sensor", "worker", "reaper", "verifier", "dispatcher", "operator")


@pytest.mark.rollback  # only SQL: a transaction rolled back after the test
async def test_every_state_change_has_one_event_with_gap_free_seqs(actors: Actors, admin: Admin) -> None:
    op = await actors("operator")
    await op.register_class(PROMOTING_CLASS, max_attempts=5, lease_seconds=30, backoff_base_s=0,
                            promotion={"ref": "refs/heads/main", "repository": "/r"})
    d = Driver(actors, PROMOTING_CLASS)
    worker, verifier, sensor = await d.k("worker"), await d.k("verifier"), await d.k("sensor")

    cid, gen = await d.leased()
    await worker.fail_attempt(cid, gen, "first try failed", fingerprint=fingerprint(1))
    claim = await worker.claim_campaign("w2", [PROMOTING_CLASS])
    await worker.append_events(cid, claim.generation, [
        {"type": "output", "payload": {"text": "hello"}, "delta": True},
        {"type": "attempt.started", "payload": {}},
    ])
    await worker.record_attempt(cid, claim.generation, base_sha=sha(1), candidate_sha=sha(2),
                                fingerprint=fingerprint(2))
    vclaim = await verifier.claim_verification("v1")
    await verifier.reject(vclaim.verification_id, "tests fail")
    claim = await worker.claim_campaign("w3", [PROMOTING_CLASS])
    await worker.record_attempt(cid, claim.generation, base_sha=sha(1), candidate_sha=sha(3),
                                fingerprint=fingerprint(3))
    vclaim = await verifier.claim_verification("v1")
    await verifier.accept(vclaim.verification_id)
    dispatcher = await d.k("dispatcher")
    effect = await dispatcher.claim_side_effect("d1")
    await dispatcher.complete_side_effect(effect.side_effect_id, effect.claim_token, "done")
    key = (await Reads(sensor.executor).campaign(cid)).objective_key
    await sensor.record_observation("s", key, "target-1", "green", started_at=now())

    events = await (await actors.reads("reader")).events(cid)
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    transitions = [e.payload["transition"] for e in events if e.type == "transition"]
    assert transitions == ["open", "claim", "fail_attempt", "claim", "record_attempt", "reject",
                           "claim", "record_attempt", "accept", "confirm"]
    # One event per state change, counted from the other side: generations and
    # (from, to) pairs chain without a hole.
    chain = [(e.payload["from"], e.payload["to"]) for e in events if e.type == "transition"]
    for (_, to), (frm, _) in zip(chain, chain[1:]):
        assert to == frm
    assert events[-1].payload["to"] == "confirmed"


@pytest.mark.rollback  # only SQL: a transaction rolled back after the test
async def test_a_rolled_back_change_leaves_no_event(actors: Actors, admin: Admin, test_class: str) -> None:
    d = Driver(actors, test_class)
    cid = await d.open()
    before = admin.execute("SELECT count(*) AS n FROM ledger.campaign_event").fetchone()["n"]
    await actors("worker")
    await actors("sensor")

    class Rollback(Exception):
        pass

    with pytest.raises(Rollback):
        async with actors.session("worker").transaction() as tx:
            claim = await Kernel(tx).claim_campaign("w", [test_class])
            assert claim is not None and claim.campaign_id == cid
            raise Rollback
    with pytest.raises(Rollback):
        async with actors.session("sensor").transaction() as tx:
            await Kernel(tx).open_campaign(test_class, "never", "t")
            raise Rollback
    after = admin.execute("SELECT count(*) AS n FROM ledger.campaign_event").fetchone()["n"]
    assert after == before
    assert admin.execute("SELECT state, event_seq FROM ledger.campaign WHERE id = %s",
                         (cid,)).fetchone() == {"state": "ready", "event_seq": 1}
    assert admin.execute("SELECT count(*) AS n FROM ledger.campaign WHERE objective_key = 'never'"
                         ).fetchone()["n"] == 0


@pytest.mark.rollback  # only SQL: a transaction rolled back after the test
@pytest.mark.parametrize("role", RUNTIME)
def test_runtime_roles_cannot_rewrite_the_journal(as_role: AsRole, role: str) -> None:
    with as_role(role) as conn:
        for stmt in ("UPDATE ledger.campaign_event SET type = 'x'", "DELETE FROM ledger.campaign_event",
                     "TRUNCATE ledger.campaign_event",
                     "UPDATE ledger_api.events SET type = 'x'", "DELETE FROM ledger_api.events"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(stmt)


@pytest.mark.rollback  # only SQL: a transaction rolled back after the test
async def test_even_the_owner_cannot_rewrite_the_journal(actors: Actors, admin: Admin, test_class: str) -> None:
    await Driver(actors, test_class).open()
    admin.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(f"{TEST_PREFIX}owner")))
    for stmt in ("UPDATE ledger.campaign_event SET type = 'x'", "DELETE FROM ledger.campaign_event",
                 "TRUNCATE ledger.campaign_event"):
        with pytest.raises(psycopg.Error) as err:
            admin.execute(stmt)
        assert err.value.sqlstate == "LG009"
    admin.execute("RESET ROLE")
    assert admin.execute("SELECT count(*) AS n FROM ledger.campaign_event").fetchone()["n"] == 1


@pytest.mark.rollback  # only SQL: a transaction rolled back after the test
async def test_trim_removes_only_deltas_of_closed_campaigns(actors: Actors, admin: Admin, test_class: str) -> None:
    d = Driver(actors, test_class)
    worker, op = await d.k("worker"), await d.k("operator")
    closed, gen = await d.leased()
    await worker.append_events(closed, gen, [{"type": "output", "payload": {"t": "a"}, "delta": True},
                                             {"type": "command.started", "payload": {}}])
    await op.abandon(closed)
    open_cid = await d.open()
    claim = await worker.claim_campaign("w", [test_class])
    assert claim.campaign_id == open_cid
    await worker.append_events(open_cid, claim.generation,
                               [{"type": "output", "payload": {"t": "b"}, "delta": True}])
    assert await op.trim_journal(0) == 1
    kinds = admin.execute("SELECT campaign_id, type, delta FROM ledger.campaign_event ORDER BY campaign_id, seq").fetchall()
    assert {"campaign_id": closed, "type": "output", "delta": True} not in kinds
    assert {"campaign_id": closed, "type": "command.started", "delta": False} in kinds
    assert {"campaign_id": open_cid, "type": "output", "delta": True} in kinds


async def test_output_arriving_during_a_flush_is_flushed_without_more_output(actors: Actors, admin: Admin, test_class: str, db: Database) -> None:
    """The coalescing timer must outlive a slow append: output buffered while a
    flush is in flight reaches the journal within the window even if the
    command then falls silent (before the fix it waited for close())."""
    sensor, worker = await actors("sensor"), await actors("worker")
    cid = (await sensor.open_campaign(test_class, "slow-flush", "t")).campaign_id
    claim = await worker.claim_campaign("w", [test_class])
    journal = JournalWriter(worker, cid, claim.generation, flush_s=0.05)

    def texts() -> str:
        rows = admin.execute("SELECT payload ->> 'text' AS t FROM ledger.campaign_event "
                             "WHERE campaign_id = %s AND type = 'output' ORDER BY seq", (cid,)).fetchall()
        return "".join(r["t"] for r in rows)

    # Hold the campaign row: the first flush's append waits on this lock.
    blocker = db.connect_sync(None, autocommit=False)
    blocker.execute("SELECT 1 FROM ledger.campaign WHERE id = %s FOR UPDATE", (cid,))
    journal.output(b"first\n")
    await eventually(lambda: admin.execute(
        "SELECT count(*) AS n FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
        "AND application_name = 'ledger:worker' AND datname = current_database()").fetchone()["n"] == 1,
        what="the flush to wait on the lock")
    journal.output(b"second\n")  # arrives while the first flush is in flight
    blocker.rollback()
    blocker.close()
    await eventually(lambda: texts() == "first\nsecond\n", timeout=5, what="both lines journaled")
    await journal.close()
    assert texts() == "first\nsecond\n"


@pytest.mark.rollback  # only SQL: a transaction rolled back after the test
async def test_output_limit_counts_bytes_not_characters(actors: Actors, admin: Admin, test_class: str) -> None:
    sensor, worker = await actors("sensor"), await actors("worker")
    cid = (await sensor.open_campaign(test_class, "limit", "t")).campaign_id
    claim = await worker.claim_campaign("w", [test_class])
    journal = JournalWriter(worker, cid, claim.generation, limit_bytes=10)
    journal.output("ééééééé".encode())  # 7 characters, 14 bytes
    await journal.close()
    text = admin.execute("SELECT string_agg(payload ->> 'text', '' ORDER BY seq) AS t FROM ledger.campaign_event "
                         "WHERE campaign_id = %s AND type = 'output'", (cid,)).fetchone()["t"]
    kept, _, notice = text.partition("\n")
    assert kept == "ééééé" and len(kept.encode()) == 10
    assert "output beyond 10 bytes not journaled" in notice
