"""Lost replies and silent paths, through a real TCP proxy in front of the
test server (ledger.faultproxy): a reply dropped after the server committed
is a distinct ``OutcomeUnknown``; idempotent calls are retried and return
their first result; the worker's own successful attempt is recorded as such;
a call on a silent path gives up within its deadline, not minutes later."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from conftest import TEST_PREFIX, Actors, Admin
from drive import Driver, fingerprint, sha
from ledger import Database, Kernel, OutcomeUnknown, Unavailable
from ledger.config import load_config
from ledger.ops.faultproxy import FaultProxy
from ledger.roles.attempt import AttemptRun

pytestmark = pytest.mark.anyio


@pytest.fixture
def proxy(db_url: str) -> Iterator[FaultProxy]:
    with FaultProxy.before(db_url) as p:
        yield p


@pytest.fixture
async def proxied(proxy: FaultProxy, db_url: str) -> AsyncIterator[dict[str, Kernel]]:
    """Kernels acting as the worker and the sensor through the proxy."""
    db = Database(proxy.url(db_url), role_prefix=TEST_PREFIX)
    sessions = {actor: await db.session(actor).open() for actor in ("worker", "sensor")}
    yield {actor: Kernel(s) for actor, s in sessions.items()}
    for s in sessions.values():
        await s.close()


def _count(admin: Admin, sql: str, *params: object) -> int:
    return admin.execute(sql, params).fetchone()["n"]


async def test_a_record_whose_reply_is_lost_after_commit_is_retried_and_returns_its_result(
        actors: Actors, admin: Admin, test_class: str, proxy: FaultProxy, proxied: dict[str, Kernel]) -> None:
    cid, gen = await Driver(actors, test_class).leased()
    proxy.drop_reply(b"record_attempt")
    attempt_no = await proxied["worker"].record_attempt(
        cid, gen, base_sha=sha(1), candidate_sha=sha(2), fingerprint=fingerprint(1))
    assert proxy.dropped.is_set(), "the proxy never dropped a reply"
    assert attempt_no == 1
    assert admin.execute("SELECT state FROM ledger.campaign WHERE id = %s", (cid,)).fetchone()["state"] == "attempted"
    assert _count(admin, "SELECT count(*) AS n FROM ledger.campaign_event WHERE campaign_id = %s "
                         "AND payload->>'transition' = 'record_attempt'", cid) == 1


async def test_a_failure_whose_reply_is_lost_is_retried_not_turned_into_a_lost_lease(
        actors: Actors, admin: Admin, test_class: str, proxy: FaultProxy, proxied: dict[str, Kernel]) -> None:
    cid, gen = await Driver(actors, test_class).leased()
    proxy.drop_reply(b"fail_attempt")
    assert await proxied["worker"].fail_attempt(cid, gen, "it broke") == "ready"
    assert proxy.dropped.is_set()
    assert _count(admin, "SELECT count(*) AS n FROM ledger.campaign_event WHERE campaign_id = %s "
                         "AND payload->>'transition' = 'fail_attempt'", cid) == 1
    # a different ending for the same generation is still refused
    from ledger import StaleLease

    with pytest.raises(StaleLease):
        await proxied["worker"].fail_attempt(cid, gen, "another reason")


async def test_a_keyed_journal_batch_whose_reply_is_lost_is_appended_once(
        actors: Actors, admin: Admin, test_class: str, proxy: FaultProxy, proxied: dict[str, Kernel]) -> None:
    cid, gen = await Driver(actors, test_class).leased()
    proxy.drop_reply(b"append_events")
    seq = await proxied["worker"].append_events(
        cid, gen, [{"type": "output", "payload": {"text": "once"}, "delta": True}], key="batch-1")
    assert proxy.dropped.is_set()
    rows = admin.execute("SELECT seq FROM ledger.campaign_event WHERE campaign_id = %s AND type = 'output'",
                         (cid,)).fetchall()
    assert [r["seq"] for r in rows] == [seq]


async def test_a_claim_whose_reply_is_lost_is_an_unknown_outcome_the_worker_can_read_back(
        actors: Actors, admin: Admin, test_class: str, proxy: FaultProxy, proxied: dict[str, Kernel]) -> None:
    cid = await Driver(actors, test_class).open()
    proxy.drop_reply(b"claim_campaign")
    with pytest.raises(OutcomeUnknown):
        await proxied["worker"].claim_campaign("worker-x", [test_class])
    assert proxy.dropped.is_set()
    # The claim committed; the worker finds it by reading back what it holds.
    held = await (await actors.reads("worker")).running_claims("worker-x")
    assert [c.campaign_id for c in held] == [cid]


async def test_an_unreachable_server_is_unavailable_not_an_unknown_outcome(db_url: str) -> None:
    with FaultProxy.before(db_url) as p:
        url = p.url(db_url)
    # the proxy is gone: nothing listens on its port, nothing was ever sent
    with pytest.raises(Unavailable) as caught:
        await Database(url, role_prefix=TEST_PREFIX).session("worker").open()
    assert not isinstance(caught.value, OutcomeUnknown)


async def test_a_heartbeat_through_a_silent_path_gives_up_within_its_deadline(
        actors: Actors, test_class: str, proxy: FaultProxy, proxied: dict[str, Kernel]) -> None:
    cid, gen = await Driver(actors, test_class).leased()
    worker = proxied["worker"]
    await worker.heartbeat(cid, gen)  # the path works
    proxy.silence()
    started = time.monotonic()
    with pytest.raises(Unavailable):
        await worker.heartbeat(cid, gen, timeout_s=2.0)
    took = time.monotonic() - started
    assert took < 5.0, f"the heartbeat gave up after {took:.1f}s, not within its 2s deadline"
    proxy.heal()
    lease = await worker.heartbeat(cid, gen)  # a fresh connection works again
    assert lease.lease_remaining_s == 30


async def test_a_call_cancelled_on_a_silent_path_ends_at_once_without_a_cancel_request(
        actors: Actors, test_class: str, proxy: FaultProxy, proxied: dict[str, Kernel]) -> None:
    """Cancelling a caller mid-call (a service stopping) aborts its
    connection: psycopg's own way sends a cancel request over the same
    silent path and waits up to 10 s for it. The call runs in its caller's
    task (tests/test_hub.py: no task of its own), so this is the connection's doing."""
    cid, gen = await Driver(actors, test_class).leased()
    worker = proxied["worker"]
    await worker.heartbeat(cid, gen)
    proxy.silence()
    call = asyncio.ensure_future(worker.heartbeat(cid, gen, timeout_s=30.0))
    assert await asyncio.to_thread(proxy.swallowed.wait, 10.0), "the call never left"
    started = time.monotonic()
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    took = time.monotonic() - started
    assert took < 1.0, f"the cancelled call took {took:.1f}s to end"
    proxy.heal()
    lease = await worker.heartbeat(cid, gen)  # the aborted connection was not handed out again
    assert lease.lease_remaining_s == 30


@pytest.mark.cells
async def test_the_worker_records_its_own_attempt_when_the_records_reply_is_lost(
        tmp_path: Path, actors: Actors, admin: Admin, proxy: FaultProxy, proxied: dict[str, Kernel]) -> None:
    """End to end: an attempt whose record committed but whose reply was lost
    ends as ``attempted`` -- it used to be recorded as stood down, its own
    success taken for a lost lease."""
    from test_worker import CLASS, Workshop

    shop = Workshop(tmp_path, "unused")
    shop.plan({"default": [["write", "fix.txt", "fixed\n"], ["exit", 0]]})
    cls = load_config(shop.config).campaign_class(CLASS)
    await (await actors("operator")).register_class(CLASS, **cls.registration())
    cid = (await (await actors("sensor")).open_campaign(CLASS, "lost-reply", "repo")).campaign_id
    worker = proxied["worker"]
    claim = await worker.claim_campaign("worker-p", [CLASS])
    assert claim is not None and claim.campaign_id == cid
    run = AttemptRun(worker, claim, cls, identity="worker-p", data_dir=tmp_path / "data")
    proxy.drop_reply(b"record_attempt")
    assert await run.run() == "attempted"
    assert proxy.dropped.is_set()
    assert admin.execute("SELECT outcome FROM ledger.attempt WHERE campaign_id = %s", (cid,)).fetchone()[
        "outcome"] == "attempted"
