"""The operator's controls (README "Operator controls"), in the database and through its API:
pausing a class (claims skip it, in-flight attempts finish, journaled with the
operator's identity; under real concurrent claimers), the registry of live
processes, bulk actions on picked rows, the candidate's diff, finer charts,
leases judged by their class's heartbeat, and a board that does not change on
output. (The browser's side: tests/test_dashboard_browser.py; real worker
processes: tests/test_class_pause_workers.py.)"""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from test_api import Api, api, assert_problem  # noqa: F401 (the api fixture)

from conftest import Actors, Admin
from drive import Driver, fingerprint, new_key, sha
from ledger import Database, Kernel, bulk
from ledger.api.dashboard import board_changes
from ledger.db.database import Transaction
from ledger.db.hub import NullHub
from ledger.db.models import ProcessReport
from ledger.errors import Forbidden, InvalidInput, NotFound
from ledger.report import autonomy_report
from ledger.runtime.registry import Registration, held, utcnow

pytestmark = pytest.mark.anyio


async def _two_classes(actors: Actors, **alpha: Any) -> tuple[str, str]:
    op = await actors("operator")
    await op.register_class("alpha", lease_seconds=30, backoff_base_s=0, backoff_jitter=0, **alpha)
    await op.register_class("beta", lease_seconds=30, backoff_base_s=0, backoff_jitter=0)
    return "alpha", "beta"


# --- pause and resume a class ------------------------------------------------------


@pytest.mark.rollback
async def test_a_paused_class_is_skipped_by_every_claim_and_its_lease_holders_finish(actors: Actors, admin: Admin) -> None:
    alpha, beta = await _two_classes(actors)
    sensor, worker, op = await actors("sensor"), await actors("worker"), await actors("operator")
    held_cid = (await sensor.open_campaign(alpha, new_key("in-flight"), "t")).campaign_id
    in_flight = await worker.claim_campaign("w-1", [alpha])
    assert in_flight is not None and in_flight.campaign_id == held_cid
    waiting = [(await sensor.open_campaign(alpha, new_key("a"), "t")).campaign_id for _ in range(3)]

    paused = await op.pause_class(alpha, "deploying the agent", "cli:bob@host")
    assert paused.changed and paused.paused_at is not None and paused.class_ == alpha
    # One class named (the single-class path), several (the rotation), a batch:
    assert await worker.claim_campaign("w-2", [alpha]) is None
    assert await worker.claim_campaign("w-2") is None  # every class: only alpha has work
    assert await worker.claim_campaigns("w-2", [alpha], limit=5) == []
    assert await worker.claim_campaigns("w-2", limit=5) == []
    beta_cid = (await sensor.open_campaign(beta, new_key("b"), "t")).campaign_id
    other = await worker.claim_campaign("w-2", [alpha, beta])
    assert other is not None and other.campaign_id == beta_cid, "the other class is claimed"
    # The attempt in flight finishes: its holder heartbeats and records.
    await worker.heartbeat(held_cid, in_flight.generation)
    await worker.record_attempt(held_cid, in_flight.generation, base_sha=sha(1),
                                candidate_sha=sha(2), fingerprint=fingerprint(1))
    reads = await actors.reads()
    assert (await reads.campaign(held_cid)).state == "attempted"
    assert {(await reads.campaign(c)).state for c in waiting} == {"ready"}

    again = await op.pause_class(alpha, "twice", "cli:bob@host")
    assert not again.changed and again.paused_at == paused.paused_at
    # Registering the class again (ledger classes sync) keeps it paused.
    await op.register_class(alpha, lease_seconds=30, backoff_base_s=0, backoff_jitter=0)
    assert (await reads.campaign_class(alpha)).paused_at == paused.paused_at

    resumed = await op.resume_class(alpha, "http:ops-tok")
    assert resumed.changed and resumed.paused_at is None
    assert not (await op.resume_class(alpha, "http:ops-tok")).changed
    claims = await worker.claim_campaigns("w-3", [alpha], limit=10)
    assert sorted(c.campaign_id for c in claims) == sorted(waiting)

    journal = await reads.class_events(alpha)
    assert [(e.type, e.actor, e.actor_role, e.reason) for e in journal] == [
        ("class.resumed", "http:ops-tok", "operator", None),
        ("class.paused", "cli:bob@host", "operator", "deploying the agent")]
    with pytest.raises(Exception, match="append-only"):
        admin.execute("DELETE FROM ledger.class_event")


@pytest.mark.rollback
async def test_only_an_operator_pauses_and_bad_input_is_refused(actors: Actors, test_class: str) -> None:
    for role in ("reader", "sensor", "worker", "verifier", "dispatcher", "reaper"):
        kernel = await actors(role)
        with pytest.raises(Forbidden):
            await kernel.pause_class(test_class, "no", "x")
        with pytest.raises(Forbidden):
            await kernel.resume_class(test_class, "x")
    op = await actors("operator")
    with pytest.raises(NotFound):
        await op.pause_class("no-such-class", None, "x")
    with pytest.raises(InvalidInput):
        await op.pause_class(test_class, "x" * 1001, "x")
    assert (await (await actors.reads()).campaign_class(test_class)).paused_at is None


@pytest.mark.rollback
async def test_the_autonomy_report_counts_a_pause_as_a_human_action(actors: Actors, test_class: str) -> None:
    d = Driver(actors, test_class)
    await d.open()
    reads = await actors.reads()
    before = (await autonomy_report(reads, 1)).days[-1].human_actions
    op = await actors("operator")
    await op.pause_class(test_class, "look", "cli:bob@host")
    await op.resume_class(test_class, "cli:bob@host")
    today = (await autonomy_report(reads, 1)).days[-1]
    assert today.human_actions == before + 2 and today.verdict == "human-assisted"


def _bulk_open(admin: Admin, class_: str, n: int) -> None:
    admin.execute("SELECT ledger_api.open_campaign(%s, %s || '-' || i, 'target-' || i) "
                  "FROM generate_series(1, %s) AS i", (class_, f"bulk-{class_}", n))


async def test_concurrent_claimers_skip_a_class_paused_under_them_and_take_it_back_on_resume(
        db: Database, admin: Admin, actors: Actors) -> None:
    """Real connections claim (one class named, both, and in batches) and record
    while the operator pauses alpha: no claim that began after the pause
    returned leases alpha, every lease taken before it is recorded, beta is
    drained; after the resume, alpha is claimed to the last campaign."""
    alpha, beta = await _two_classes(actors)
    per_class = 150
    _bulk_open(admin, alpha, per_class)
    _bulk_open(admin, beta, per_class)
    claimed = 0
    some_claimed = asyncio.Event()

    async def claimer(i: int, classes: list[str] | None, batch: int) -> None:
        nonlocal claimed
        conn = await db.connect("worker")
        kernel = Kernel(Transaction(conn))
        try:
            while True:
                if batch > 1:
                    claims = await kernel.claim_campaigns(f"claimer-{i}", classes, limit=batch)
                else:
                    one = await kernel.claim_campaign(f"claimer-{i}", classes)
                    claims = [one] if one is not None else []
                if not claims:
                    return
                for claim in claims:
                    await kernel.record_attempt(claim.campaign_id, claim.generation,
                                                base_sha=sha(1), candidate_sha=sha(2),
                                                fingerprint=fingerprint(claim.campaign_id))
                claimed += len(claims)
                if claimed >= 40:
                    some_claimed.set()
        finally:
            await conn.close()

    shapes: list[tuple[list[str] | None, int]] = [
        ([alpha], 1), ([alpha, beta], 1), (None, 1), ([alpha, beta], 4), (None, 3)]
    op = await actors("operator")
    run = [asyncio.create_task(claimer(i, c, b)) for i, (c, b) in enumerate(shapes)]
    await some_claimed.wait()
    await op.pause_class(alpha, "mid-run", "cli:test")
    after = admin.execute("SELECT statement_timestamp() AS t").fetchone()["t"]
    await asyncio.gather(*run)

    rows = admin.execute(
        "SELECT c.class, c.state, count(*) AS n, max(a.claimed_at) AS last_claim "
        "FROM ledger.campaign c LEFT JOIN ledger.attempt a ON a.campaign_id = c.id "
        "GROUP BY c.class, c.state ORDER BY 1, 2").fetchall()
    by = {(r["class"], r["state"]): r for r in rows}
    assert by[(beta, "attempted")]["n"] == per_class, rows
    assert (alpha, "leased") not in by, "a lease taken before the pause was left unrecorded"
    left = by[(alpha, "ready")]["n"]
    assert 0 < left < per_class, rows
    assert by.get((alpha, "attempted")) is None or by[(alpha, "attempted")]["last_claim"] <= after, \
        "alpha was claimed by a claim that began after the pause returned"

    await op.resume_class(alpha, "cli:test")
    run = [asyncio.create_task(claimer(10 + i, c, b)) for i, (c, b) in enumerate(shapes)]
    await asyncio.gather(*run)
    states = admin.execute("SELECT class, state, count(*) AS n FROM ledger.campaign "
                           "GROUP BY 1, 2 ORDER BY 1, 2").fetchall()
    assert [(r["class"], r["state"], r["n"]) for r in states] == [
        (alpha, "attempted", per_class), (beta, "attempted", per_class)]


async def test_pause_and_resume_through_the_api(api: Api, actors: Actors, test_class: str) -> None:  # noqa: F811
    r = await api.client.post(f"/classes/{test_class}/pause", json={"reason": "maintenance"},
                              headers=api.auth("operator"))
    assert r.status_code == 200, r.text
    assert r.json()["changed"] is True and r.json()["class"] == test_class
    assert_problem(await api.client.post(f"/classes/{test_class}/resume",
                                         headers=api.auth("reader")), 403)
    assert_problem(await api.client.post("/classes/nope/pause", headers=api.auth("operator")), 404)
    assert_problem(await api.client.post("/classes/BAD NAME/pause", headers=api.auth("operator")), 422)
    assert_problem(await api.client.post(f"/classes/{test_class}/pause", json={"reason": "x" * 1001},
                                         headers=api.auth("operator")), 422)
    journal = (await api.get(f"/classes/{test_class}/events")).json()["items"]
    assert [(e["type"], e["actor"], e["reason"]) for e in journal] == [
        ("class.paused", "http:operator-tok", "maintenance")]
    r = await api.client.post(f"/classes/{test_class}/resume", headers=api.auth("operator"))
    assert r.status_code == 200 and r.json()["changed"] is True
    assert (await (await actors.reads()).campaign_class(test_class)).paused_at is None


# --- the registry of processes -----------------------------------------------------


def _report(**overrides: Any) -> ProcessReport:
    fields: dict[str, Any] = {"host": "host-a", "pid": 4242, "started_at": utcnow(),
                              "identity": "worker:host-a:4242:abc", "service": "worker",
                              "interval_s": 1.0}
    return ProcessReport(**{**fields, **overrides})


@pytest.mark.rollback
async def test_each_role_reports_itself_and_only_itself(actors: Actors, admin: Admin) -> None:
    roles = ("sensor", "worker", "reaper", "verifier", "dispatcher", "operator")
    for role in roles:
        kernel = await actors(role)
        seen = await getattr(kernel, f"report_{role}_process")(_report(service=role))
        assert isinstance(seen, datetime)
        for other in roles:
            # (the worker role is a member of the reaper's: a worker process runs a reaper)
            if other != role and (role, other) != ("worker", "reaper"):
                with pytest.raises(Forbidden):
                    await getattr(kernel, f"report_{other}_process")(_report(service=role))
    rows = await (await actors.reads()).processes()
    assert sorted(r.role for r in rows) == sorted(roles)
    assert {r.status for r in rows} == {"live"}


@pytest.mark.rollback
async def test_a_process_reads_live_then_stopped_or_gone(actors: Actors, admin: Admin) -> None:
    worker = await actors("worker")
    started = utcnow()
    holds = [held("campaign", 7, started, attempt=1, generation=1)]
    await worker.report_worker_process(_report(started_at=started, holds=holds))
    await worker.report_worker_process(_report(started_at=started, holds=holds))  # a refresh
    reads = await actors.reads()
    [row] = await reads.processes()
    assert row.status == "live" and row.holds == holds and row.started_at == started
    # Not seen for three intervals and five seconds: gone.
    admin.execute("UPDATE ledger.process SET last_seen = statement_timestamp() - interval '9 s'")
    assert [r.status for r in await reads.processes()] == ["gone"]
    await worker.report_worker_process(_report(started_at=started, stopping=True))
    [row] = await reads.processes()
    assert row.status == "stopped" and row.stopped_at is not None and row.holds == []
    # A day later, the next process to register clears it away.
    admin.execute("UPDATE ledger.process SET last_seen = statement_timestamp() - interval '25 hours'")
    await worker.report_worker_process(_report(pid=4243, identity="worker:host-a:4243:def"))
    assert [r.pid for r in await reads.processes()] == [4243]


@pytest.mark.rollback
async def test_a_process_that_waits_to_start_says_why_until_it_works(actors: Actors) -> None:
    """``not_ready`` (ledger.runtime.startup): kept with the row, listed by
    ``processes_not_ready`` while the process is live, cleared by the next
    report that has none; a stopped one is no longer listed."""
    worker, reads = await actors("worker"), await actors.reads()
    started = utcnow()
    await worker.report_worker_process(_report(started_at=started, not_ready="ledger.toml: not valid TOML"))
    [row] = await reads.processes_not_ready()
    assert row.not_ready == "ledger.toml: not valid TOML" and row.status == "live"
    await worker.report_worker_process(_report(started_at=started))
    assert [r.not_ready for r in await reads.processes()] == [None]
    assert await reads.processes_not_ready() == []
    await worker.report_worker_process(_report(started_at=started, not_ready="again", stopping=True))
    assert await reads.processes_not_ready() == []
    for bad in ("", "x" * 1001):
        with pytest.raises(InvalidInput):
            await worker.report_worker_process(_report(started_at=started, not_ready=bad))


@pytest.mark.rollback
async def test_a_report_is_checked(actors: Actors) -> None:
    worker = await actors("worker")
    deep = [{"kind": "campaign", "id": 1, "more": {"deeper": {"deepest": 1}}}]
    for bad in (_report(host=""), _report(identity="x" * 201), _report(service="Bad Name"),
                _report(started_at=utcnow() + timedelta(hours=1)), _report(holds=deep),
                _report(holds=[{"kind": "x", "blob": "y" * 70_000}])):
        with pytest.raises(InvalidInput):
            await worker.report_worker_process(bad)
    assert await (await actors.reads()).processes() == []


async def test_a_registration_reports_on_its_tick_and_says_it_stopped(db: Database, actors: Actors) -> None:
    worker = await actors("worker")
    holding: list[dict[str, Any]] = []
    registration = Registration(worker, "worker", "worker", "worker:test:1:abc", 0.05,
                                holds=lambda: list(holding))
    reads = await actors.reads()
    stop = asyncio.Event()

    async def seen(check: Any) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 20
        while not check(await reads.processes()):
            assert loop.time() < deadline, await reads.processes()
            await asyncio.sleep(0.02)  # polling interval of the condition

    async with registration.kept(stop):
        await seen(lambda rows: len(rows) == 1 and rows[0].status == "live")
        holding.append(held("campaign", 3, utcnow(), attempt=1, generation=1))
        await seen(lambda rows: rows[0].holds and rows[0].holds[0]["id"] == 3)
        assert registration.reports >= 2
    [row] = await reads.processes()
    assert row.status == "stopped" and row.identity == "worker:test:1:abc"


# --- leases judged by their class's heartbeat ----------------------------------------


@pytest.mark.rollback
async def test_a_short_lease_renewed_on_time_is_not_at_risk(actors: Actors, admin: Admin) -> None:
    op, sensor, worker = await actors("operator"), await actors("sensor"), await actors("worker")
    await op.register_class("short", lease_seconds=30, heartbeat_seconds=5, backoff_base_s=0)
    await op.register_class("unsaid", lease_seconds=30, backoff_base_s=0)  # heartbeat: 10 s
    ids = {}
    for cls in ("short", "unsaid"):
        ids[cls] = (await sensor.open_campaign(cls, new_key(cls), "t")).campaign_id
        assert (await worker.claim_campaign("w", [cls])) is not None
    reads = await actors.reads()
    # Both leases end within 60 s (30 s), and both were just renewed: healthy.
    assert await reads.leases_at_risk() == []
    assert (await reads.matching_summary())[1] == 0

    def renewed_ago(cid: int, seconds: float) -> None:
        admin.execute("UPDATE ledger.campaign SET lease_expires_at = statement_timestamp() "
                      "+ make_interval(secs => 30 - %s) WHERE id = %s", (seconds, cid))

    renewed_ago(ids["short"], 6)  # within 1.5 heartbeats of 5 s
    renewed_ago(ids["unsaid"], 14)  # within 1.5 x (30 / 3)
    assert await reads.leases_at_risk() == []
    renewed_ago(ids["short"], 9)  # overdue
    assert [c.id for c in await reads.leases_at_risk()] == [ids["short"]]
    renewed_ago(ids["unsaid"], 31)  # expired
    assert {c.id for c in await reads.leases_at_risk()} == set(ids.values())
    assert (await reads.matching_summary(classes=["short"]))[1] == 1
    with pytest.raises(InvalidInput, match="shorter than lease"):
        await op.register_class("bad", lease_seconds=10, heartbeat_seconds=10)


# --- the board's change stream ----------------------------------------------------


@pytest.mark.rollback
async def test_output_and_heartbeats_do_not_change_the_board_but_a_step_does(actors: Actors, test_class: str) -> None:
    d = Driver(actors, test_class)
    cid, gen = await d.leased()
    worker, reads = await actors("worker"), await actors.reads()
    stream = board_changes(reads, NullHub(), poll_s=0.01, keepalive_s=0.05, min_gap_s=0)
    try:
        assert (await anext(stream)).event == "hello"
        version = await reads.board_version()
        await worker.append_events(cid, gen, [
            {"type": "output", "delta": True, "payload": {"text": f"line {i}\n"}} for i in range(20)])
        await worker.heartbeat(cid, gen)
        assert await reads.board_version() == version
        quiet = await anext(stream)
        assert quiet.event is None and quiet.comment == "keepalive", \
            f"the board was told it changed by output: {quiet.event} {quiet.data}"
        await worker.record_attempt(cid, gen, base_sha=sha(1), candidate_sha=sha(2),
                                    fingerprint=fingerprint(1))
        while (event := await anext(stream)).comment == "keepalive":
            pass
        assert event.event == "changed"
    finally:
        await stream.aclose()


# --- bulk actions on picked rows, the diff, the finer charts --------------------------


@pytest.mark.rollback
async def test_a_bulk_action_on_picked_ids_acts_on_exactly_those(actors: Actors, test_class: str) -> None:
    d = Driver(actors, test_class)
    ids = [await d.open() for _ in range(4)]
    picked = bulk.Selector(ids=(ids[0], ids[2]))
    reads = await actors.reads()
    op = await actors("operator")
    key = b"k" * 32
    selection = await bulk.select(reads, "abandon", picked, key=key, caller="http:op")
    assert sorted(selection.ids) == sorted([ids[0], ids[2]])
    with pytest.raises(InvalidInput):  # the token is of these ids, not of others
        await bulk.apply(reads, "abandon", bulk.Selector(ids=(ids[0], ids[1])), [ids[0], ids[1]],
                         selection.token, lambda c: op.abandon(c), key=key, caller="http:op")
    done = await bulk.apply(reads, "abandon", picked, list(selection.ids), selection.token,
                            lambda c: op.abandon(c, "picked", "http:op"), key=key, caller="http:op")
    assert sorted(done.acted_on) == sorted([ids[0], ids[2]])
    assert [(await reads.campaign(c)).state for c in ids] == ["abandoned", "ready", "abandoned", "ready"]


@pytest.mark.rollback
async def test_the_diff_is_read_with_a_cap(actors: Actors, admin: Admin, test_class: str) -> None:
    d = Driver(actors, test_class)
    cid, _ = await d.attempted()
    reads = await actors.reads()
    assert await reads.attempt_diff(cid, 1) is None  # none recorded
    text = "diff --git a/x b/x\n+é<script>\n" + "+line\n" * 100
    admin.execute("UPDATE ledger.attempt SET diff = %s WHERE campaign_id = %s", (text.encode(), cid))
    whole = await reads.attempt_diff(cid, 1)
    assert whole is not None and whole.text == text and not whole.truncated
    # Cut inside the two bytes of "é": what remains decodes, marked truncated.
    head = await reads.attempt_diff(cid, 1, cap=len("diff --git a/x b/x\n+") + 1)
    assert head is not None and head.truncated and head.bytes == len(text.encode())
    assert head.text.startswith("diff --git") and head.text.endswith("\ufffd")
    with pytest.raises(InvalidInput):
        await reads.attempt_diff(cid, 1, cap=0)


@pytest.mark.rollback
async def test_activity_by_the_minute_and_the_quarter_hour(actors: Actors, test_class: str) -> None:
    d = Driver(actors, test_class)
    await d.attempted()
    reads = await actors.reads()
    minutes = await reads.activity(60, 60, test_class)
    assert len(minutes) == 60
    assert [(b.hour - a.hour) for a, b in zip(minutes, minutes[1:])] == [timedelta(minutes=1)] * 59
    assert minutes[-1].hour <= datetime.now(timezone.utc) < minutes[-1].hour + timedelta(minutes=1, seconds=5)
    assert minutes[-1].claims == 1 and minutes[-1].opened == 1 and minutes[-1].attempts_ended == 1
    quarters = await reads.activity(96, 900, test_class)
    assert len(quarters) == 96 and quarters[-1].hour.minute % 15 == 0
    assert sum(q.claims for q in quarters) == 1
    assert len(await reads.activity(24, 3600, test_class)) == 24
    for bad in ((0, 60), (1001, 60), (10, 5)):
        with pytest.raises(InvalidInput):
            await reads.activity(*bad)


