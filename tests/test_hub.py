"""The LISTEN hub on a real server: transactional hints, reconnects, bounded
queues, keys. Every wait below is on a condition (a wake-up, a marker
notification), never a guessed sleep."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from conftest import Actors, Admin
from drive import Driver, fingerprint, sha
from ledger import Database, Kernel
from ledger.db.hub import CHANNELS, Hub, NullHub, Subscription, _Subscriber
from ledger.db.reads import Reads
from ledger.errors import StaleLease, Unavailable

pytestmark = pytest.mark.anyio


class Rollback(Exception):
    """Raised to roll a transaction back."""


def notify(admin: Admin, channel: str, payload: str) -> None:
    """One committed NOTIFY (the admin connection autocommits)."""
    admin.execute("SELECT pg_notify(%s, %s)", (channel, payload))


async def receive(sub: Subscription, count: int, timeout: float = 5.0) -> list[str]:
    """Wait until ``sub`` has delivered ``count`` payloads; return them."""
    got: list[str] = []
    while len(got) < count:
        assert await sub.wait(timeout), f"woken only {len(got)} of {count} times"
        got += sub.drain()
    return got


async def settle(admin: Admin, sub: Subscription, channel: str) -> list[str]:
    """Send a marker and wait for it. NOTIFY delivers in commit order, so once
    the marker is in, everything committed before it has been delivered too."""
    marker = f"marker-{uuid.uuid4().hex}"
    notify(admin, channel, marker)
    got: list[str] = []
    while marker not in got:
        assert await sub.wait(5.0), "the marker never arrived"
        got += sub.drain()
    return got[:got.index(marker)]


async def test_a_rolled_back_notify_wakes_nobody(db: Database, actors: Actors, test_class: str, admin: Admin) -> None:
    d = Driver(actors, test_class)
    rolled, rolled_gen = await d.leased("worker-1")
    kept, kept_gen = await d.leased("worker-2")
    worker = await actors("worker")
    async with Hub(db) as hub:
        with hub.subscribe("ledger_event") as sub:
            await settle(admin, sub, "ledger_event")  # the set-up's own hints are behind us
            # The journal trigger NOTIFYs inside the append's transaction ...
            with pytest.raises(Rollback):
                async with actors.session("worker").transaction() as tx:
                    await worker.within(tx).append_events(
                        rolled, rolled_gen, [{"type": "note", "payload": {"n": 1}}])
                    raise Rollback
            # ... and a later committed append on another campaign NOTIFYs too.
            await worker.append_events(kept, kept_gen, [{"type": "note", "payload": {"n": 2}}])
            assert await sub.wait(5.0)
            # Commit order is delivery order: a leaked hint would have come first.
            assert sub.drain()[0] == str(kept)
            assert await settle(admin, sub, "ledger_event") == []
    assert [e.type for e in await Reads(worker.executor).events(rolled)] == ["transition", "transition"]


async def test_hub_reconnects_and_wakes_everyone_once(db: Database, admin: Admin) -> None:
    async with Hub(db, backoff_base_s=0.05) as hub:
        with hub.subscribe("ledger_ready") as every, hub.subscribe("ledger_cancel", "7") as one:
            assert hub.connected and hub.reconnects == 0
            old_pid = hub.backend_pid
            assert admin.execute("SELECT pg_terminate_backend(%s) AS ok",
                                 (old_pid,)).fetchone()["ok"]
            # The reconnect is the only thing that can wake these two.
            assert await every.wait(10.0) and await one.wait(10.0)
            assert hub.connected and hub.reconnects == 1
            assert hub.backend_pid not in (None, old_pid)
            assert every.drain() == [] and one.drain() == []  # a wake-up, not a notification
            assert not await every.wait(0.05) and not await one.wait(0.0)  # once, not a storm
            # Notifications flow again, through the new connection.
            notify(admin, "ledger_cancel", "8")
            notify(admin, "ledger_ready", "5")
            notify(admin, "ledger_cancel", "7")
            assert await receive(every, 1) == ["5"]
            assert await receive(one, 1) == ["7"]  # "8" is another key
    assert not hub.connected


async def test_a_full_subscriber_never_holds_up_the_others(db: Database, admin: Admin) -> None:
    async with Hub(db, queue_size=2) as hub:
        with hub.subscribe("ledger_outbox") as full, hub.subscribe("ledger_outbox") as reader:

            async def send(payload: str) -> None:
                notify(admin, "ledger_outbox", payload)
                # One at a time, so only the subscriber that never drains overflows.
                # Both are served by the same dispatch, so when the reader has a
                # payload, the full subscriber has had its turn too.
                assert await receive(reader, 1) == [payload]

            await send("1")
            await send("2")
            assert await full.wait(0.0)  # consume the wake-up; leave the queue full
            for payload in ("3", "4", "5"):
                await send(payload)
                # Dropped, yet woken: it must re-read the rows.
                assert await full.wait(0.0), f"no wake-up for dropped {payload}"
            assert isinstance(full, _Subscriber)  # its drop count is what is checked
            assert full.drain() == ["1", "2"] and full.dropped == 3 and hub.dropped == 3
            assert hub.connected and hub.reconnects == 0
            await send("6")  # drained, it receives again
            assert await full.wait(0.0) and full.drain() == ["6"]
    assert hub.dropped == 3  # still counted after the subscriber left


async def test_keys_narrow_a_channel(db: Database, admin: Admin) -> None:
    async with Hub(db) as hub:
        with (hub.subscribe("ledger_event", "1") as one, hub.subscribe("ledger_event", "2") as two,
              hub.subscribe("ledger_event") as every, hub.subscribe("ledger_ready", "1") as other):
            for payload in ("1", "2", "3", "1"):
                notify(admin, "ledger_event", payload)
            # One dispatch serves every subscriber of a notification, so once the
            # channel-wide subscriber has all four, the keyed ones have theirs.
            assert await receive(every, 4) == ["1", "2", "3", "1"]
            assert one.drain() == ["1", "1"] and two.drain() == ["2"]
            assert other.drain() == [] and not await other.wait(0.0)


async def test_notifications_during_pings_arrive_once_in_order(db: Database, admin: Admin) -> None:
    # A tiny ping interval interleaves health checks with delivery: what arrives
    # during a ping waits in the backlog and is delivered once, in order.
    async with Hub(db, ping_s=0.005) as hub:
        with hub.subscribe("ledger_attempted") as sub:
            sent = [str(i) for i in range(40)]
            for payload in sent:
                notify(admin, "ledger_attempted", payload)
            assert await receive(sub, len(sent)) == sent
            assert await settle(admin, sub, "ledger_attempted") == []
            assert hub.reconnects == 0


async def test_start_fails_fast_without_a_server_and_stop_closes_the_backend(db: Database, admin: Admin) -> None:
    nowhere = Database("host=127.0.0.1 port=1 user=nobody dbname=none connect_timeout=1")
    hub = Hub(nowhere, backoff_base_s=0.01, backoff_cap_s=0.05)
    with pytest.raises(Unavailable, match="could not LISTEN"):
        await hub.start(timeout=0.5)
    assert not hub.connected

    hub = await Hub(db).start()
    pid = hub.backend_pid
    listening = admin.execute(
        "SELECT count(*) AS n FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()["n"]
    assert listening == 1
    await hub.stop()
    assert not hub.connected and hub.backend_pid is None
    deadline = asyncio.get_running_loop().time() + 5.0
    while admin.execute("SELECT count(*) AS n FROM pg_stat_activity WHERE pid = %s",
                        (pid,)).fetchone()["n"]:
        assert asyncio.get_running_loop().time() < deadline, "the LISTEN backend outlived stop()"
        await asyncio.sleep(0.01)  # polling a condition, not synchronising


async def test_unknown_channels_are_refused(db: Database) -> None:
    hub = Hub(db)
    for source in (hub, NullHub()):
        with pytest.raises(ValueError):
            with source.subscribe("ledger_nonsense"):
                pass
    assert "ledger_event" in CHANNELS


async def test_recorded_attempts_hint_verifiers_and_tails_after_commit_once_each(db: Database, actors: Actors, test_class: str, admin: Admin) -> None:
    """A recorded attempt's hints leave its transaction (NOTIFY would serialise
    concurrent records) but still follow every committed record, once per
    campaign and channel, and never a refused one."""
    d = Driver(actors, test_class)
    leases = [await d.leased(f"worker-{i}") for i in range(3)]
    worker = await actors("worker")
    async with Hub(db) as hub:
        with hub.subscribe("ledger_attempted") as verifiers, hub.subscribe("ledger_event") as tails:
            await settle(admin, verifiers, "ledger_attempted")
            await settle(admin, tails, "ledger_event")
            for n, (cid, gen) in enumerate(leases):
                await worker.record_attempt(cid, gen, base_sha=sha(1), candidate_sha=sha(2 + n),
                                            fingerprint=fingerprint(n))
            # A stale record (the lease was already used) changes nothing and hints nothing.
            with pytest.raises(StaleLease):
                await worker.record_attempt(leases[0][0], leases[0][1], base_sha=sha(1),
                                            candidate_sha=sha(9), fingerprint=fingerprint(9))
            expected = [str(cid) for cid, _ in leases]
            assert await receive(verifiers, 3) == expected  # gathered, sent together, in order
            assert await receive(tails, 3) == expected
            assert await settle(admin, verifiers, "ledger_attempted") == []
            assert await settle(admin, tails, "ledger_event") == []


async def test_closing_a_session_sends_the_hints_it_gathered(db: Database, test_class: str, admin: Admin) -> None:
    async with db.session("sensor") as s:
        cid = (await Kernel(s).open_campaign(test_class, "hinted", "t")).campaign_id
    async with Hub(db) as hub:
        with hub.subscribe("ledger_attempted") as verifiers:
            await settle(admin, verifiers, "ledger_attempted")
            session = await db.session("worker").open()
            await session.hint([("ledger_attempted", str(cid))])
            await session.close()  # well inside the gathering window: close must send it
            assert await settle(admin, verifiers, "ledger_attempted") == [str(cid)]


async def test_a_busy_sessions_next_call_carries_its_hints_and_a_bad_hint_costs_the_call_nothing(
        db: Database, actors: Actors, test_class: str, admin: Admin, monkeypatch: pytest.MonkeyPatch) -> None:
    """Hints gathered after a commit, once their window is over, ride with
    the session's next call, in a transaction of their own after the call's
    (no round trip of their own); the call's result, or its
    error, is its own. (A zero window ends while the next call is under
    way; sending hints on their own would fail this test: it is replaced.)"""
    monkeypatch.setattr("ledger.db.database.HINT_WINDOW_S", 0.0)
    sent_alone: list[object] = []

    async def no_flush(self: object) -> None:
        sent_alone.append(self)
    d = Driver(actors, test_class)
    (cid, gen), (other, other_gen) = await d.leased("worker-1"), await d.leased("worker-2")
    async with Hub(db) as hub, db.session("worker") as session:
        worker = Kernel(session)
        with hub.subscribe("ledger_attempted") as verifiers:
            await settle(admin, verifiers, "ledger_attempted")
            monkeypatch.setattr("ledger.db.database.Session.flush_hints", no_flush)
            await worker.record_attempt(cid, gen, base_sha=sha(1), candidate_sha=sha(2),
                                        fingerprint=fingerprint(1))
            await worker.heartbeat(other, other_gen)  # the window ends while this one is under way
            assert await worker.claim_campaign("worker-3", ["no-such-class"]) is None  # carries them
            assert await receive(verifiers, 1) == [str(cid)]
            # a call that fails still carries them, and fails with its own error
            await session.hint([("ledger_attempted", "carried-by-a-failure")])
            await worker.heartbeat(other, other_gen)
            with pytest.raises(StaleLease):
                await worker.heartbeat(cid, gen)
            assert await receive(verifiers, 1) == ["carried-by-a-failure"]
            # a hint the server refuses (a payload over 8000 bytes) costs the call nothing
            await session.hint([("ledger_attempted", "x" * 9000), ("ledger_attempted", "after")])
            await worker.heartbeat(other, other_gen)
            lease = await worker.heartbeat(other, other_gen)
            assert lease.lease_remaining_s > 0
            assert await worker.heartbeat(other, other_gen)  # and the connection serves the next
            assert await settle(admin, verifiers, "ledger_attempted") == []  # that batch is lost whole
            assert sent_alone == []
            monkeypatch.undo()


async def test_tails_wake_on_every_journal_event_but_a_claims_and_a_records_transition(
        db: Database, actors: Actors, test_class: str, admin: Admin) -> None:
    """Which journal events hint ledger_event inside their transaction, one
    campaign and one batch at a time: every event but the transitions into
    leased and attempted (claims never NOTIFY; records hint after commit)."""
    d = Driver(actors, test_class)
    worker, reaper = await actors("worker"), await actors("reaper")
    async with Hub(db) as hub:
        with hub.subscribe("ledger_event") as tails:
            await settle(admin, tails, "ledger_event")
            cid = await d.open()
            assert await settle(admin, tails, "ledger_event") == [str(cid)]  # open: into ready
            claim = await worker.claim_campaign("worker-1", [test_class])
            assert claim is not None and await settle(admin, tails, "ledger_event") == []
            await worker.append_events(cid, claim.generation, [{"type": "note", "payload": {}}])
            assert await settle(admin, tails, "ledger_event") == [str(cid)]
            await worker.fail_attempt(cid, claim.generation, "red")
            assert await settle(admin, tails, "ledger_event") == [str(cid)]  # back into ready
            # the batch writers: claims notify nothing, a lease expired back into ready does
            more = [await d.open() for _ in range(2)]
            await settle(admin, tails, "ledger_event")
            batch = await worker.claim_campaigns("worker-2", [test_class], limit=3)
            assert {c.campaign_id for c in batch} == {cid, *more}
            assert await settle(admin, tails, "ledger_event") == []
            admin.execute("UPDATE ledger.campaign SET lease_expires_at = now() - interval '1 hour' "
                          "WHERE id = ANY(%s)", (more,))
            assert {r.campaign_id for r in await reaper.expire_leases()} == set(more)
            assert sorted(await settle(admin, tails, "ledger_event")) == sorted(map(str, more))
