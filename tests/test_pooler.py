"""Ledger through a real PgBouncer in transaction mode (README "Behind a connection pooler").

Every test here connects its runtime roles through the harness's PgBouncer
(``pgbouncer`` in conftest: ``pool_mode=transaction``, two server connections
per database and user), so clients really take turns on server connections.
Behind such a pooler nothing set for a session survives: the role must be taken
on inside every transaction, prepared statements must not be used, and LISTEN
must have a direct connection.

The role check is an audit installed in the test's database: every
``ledger_api`` function first records which role it was called as
(``current_setting('role')``, the role the transaction took on; a SECURITY
DEFINER function's ``current_user`` is its owner) and the session's login. The
test then asserts that each call ran as the one role the function is granted
to. On a session-level ``SET ROLE`` (before this issue), a worker's call ran on
server connections that another client had set to the sensor (refused) or that
nobody had set (the superuser: recorded as ``none``).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any

import httpx
import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from conftest import TEST_CLASS, TEST_PREFIX, Actors, release_pooled, through
from drive import Driver, fingerprint, new_key, now, sha
from ledger import Database, Kernel, Reads, StaleLease
from ledger.api import ApiOptions, TokenTable, create_app, hash_token, new_token
from ledger.db.hub import Hub

pytestmark = pytest.mark.anyio


@pytest.fixture
def pooled_url(db_url: str, pgbouncer: dict[str, str]) -> Iterator[str]:
    """The test's database through the pooler (whose server connections to it
    are closed afterwards, before the database is checked and dropped)."""
    yield through(db_url, pgbouncer)
    release_pooled(pgbouncer, str(conninfo_to_dict(db_url)["dbname"]))


@pytest.fixture
def pooled_db(pooled_url: str, db_url: str) -> Database:
    """The test's database, every role through the pooler, LISTEN direct."""
    return Database(pooled_url, role_prefix=TEST_PREFIX, listen_url=db_url)


@pytest.fixture
async def actors(pooled_db: Database) -> AsyncIterator[Actors]:
    """Kernels acting as each role, through the pooler (overrides conftest's)."""
    a = Actors(pooled_db)
    yield a
    await a.close()


# --- the audit -------------------------------------------------------------

AUDIT = """
CREATE SCHEMA ledger_audit;
CREATE TABLE ledger_audit.calls (
    id       bigserial PRIMARY KEY,
    fn       text NOT NULL,
    ran_as   text NOT NULL,   -- the role the transaction took on ('none': none)
    login    text NOT NULL,   -- session_user
    backend  integer NOT NULL
);
CREATE FUNCTION ledger_audit.note(p_fn text) RETURNS void LANGUAGE sql AS $$
    INSERT INTO ledger_audit.calls (fn, ran_as, login, backend)
    VALUES (p_fn, pg_catalog.current_setting('role'), session_user, pg_catalog.pg_backend_pid())
$$;
GRANT USAGE ON SCHEMA ledger_audit TO {owner};
GRANT INSERT ON ledger_audit.calls TO {owner};
GRANT USAGE ON SEQUENCE ledger_audit.calls_id_seq TO {owner};
GRANT EXECUTE ON FUNCTION ledger_audit.note(text) TO {owner};
"""


def _audited_body(name: str, language: str, body: str) -> str:
    note = f"PERFORM ledger_audit.note('{name}');"
    if language == "sql":
        return f"SELECT ledger_audit.note('{name}');\n{body}"
    # plpgsql: keep the compiler directives first, then the original block
    # nested in one that notes the call (a nested block is transparent).
    directives = re.match(r"(\s*#[^\n]*\n)*", body)
    head = directives.group(0) if directives else ""
    rest = body[len(head):].rstrip().rstrip(";")
    return f"{head}BEGIN\n{note}\n{rest};\nEND"


def install_audit(admin: psycopg.Connection) -> dict[str, str]:
    """Make every ``ledger_api`` function record the role it runs for; return
    each function's one granted runtime role."""
    owner = sql.Identifier(f"{TEST_PREFIX}owner")
    admin.execute(sql.SQL(AUDIT).format(owner=owner))
    rows = admin.execute("""
        SELECT p.oid, p.proname, l.lanname, p.prosrc, pg_catalog.pg_get_functiondef(p.oid) AS def,
               (SELECT a.grantee::regrole::text FROM pg_catalog.aclexplode(p.proacl) a
                 WHERE a.privilege_type = 'EXECUTE' AND a.grantee <> p.proowner) AS granted
          FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_language l ON l.oid = p.prolang
         WHERE p.pronamespace = 'ledger_api'::regnamespace""").fetchall()
    assert len(rows) > 20
    granted: dict[str, str] = {}
    admin.execute(sql.SQL("SET ROLE {}").format(owner))
    try:
        for row in rows:
            body = row["prosrc"]
            assert row["def"].count(body) == 1, row["proname"]
            admin.execute(row["def"].replace(body, _audited_body(row["proname"], row["lanname"], body)))
            granted[row["proname"]] = row["granted"]
    finally:
        admin.execute("RESET ROLE")
    return granted


# --- tests -----------------------------------------------------------------


async def test_connections_go_through_the_pooler(pooled_db: Database, admin: psycopg.Connection,
                                                 actors: Actors) -> None:
    """The harness really pools: clients share PgBouncer's few server
    connections, and Ledger notices it is pooled (the server's process id is
    not the one the connection was given)."""
    sessions = [await pooled_db.session("reader", max_size=1).open() for _ in range(6)]
    try:
        conns = [await pooled_db.connect(None, setup=False) for _ in range(2)]
        assert all([await pooled_db.is_pooled(c) for c in conns])
        for c in conns:
            await c.close()
        reader = await actors.reads()
        await asyncio.gather(*(Reads(s).state_counts() for s in sessions), reader.state_counts())
        name = admin.execute("SELECT current_database() AS d").fetchone()["d"]
        servers = admin.execute(
            "SELECT count(*) AS n FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
            (name,)).fetchone()["n"]
        assert servers <= 2 < len(sessions)  # PGBOUNCER_POOL_SIZE
    finally:
        for s in sessions:
            await s.close()


async def test_every_call_runs_as_its_own_role(actors: Actors, admin: psycopg.Connection,
                                               pooled_db: Database) -> None:
    """Through the pooler, with every role (and the administrator) busy at
    once, each API call ran as the role it is granted to."""
    granted = install_audit(admin)
    op = await actors("operator")
    await op.register_class(TEST_CLASS, max_attempts=3, lease_seconds=30, backoff_base_s=0,
                            backoff_jitter=0)
    driver = Driver(actors, TEST_CLASS)
    admin_session = await pooled_db.session(None, max_size=2).open()

    async def flow(n: int) -> None:
        # sensor opens, worker claims, heartbeats, records; verifier decides
        await driver.open()
        worker = await actors("worker")
        claim = await worker.claim_campaign(f"worker-{n}", [TEST_CLASS])
        assert claim is not None  # one opened per flow: there is one for each
        cid, gen = claim.campaign_id, claim.generation
        await worker.heartbeat(cid, gen)
        await worker.append_events(cid, gen, [{"type": "note", "payload": {"n": n}}])
        await worker.record_attempt(cid, gen, base_sha=sha(1), candidate_sha=sha(1000 + n),
                                    fingerprint=fingerprint(1000 + n))
        verifier = await actors("verifier")
        checking = await verifier.claim_verification(f"verifier-{n}", classes=[TEST_CLASS])
        if checking is not None:
            await verifier.accept(checking.verification_id, {"ok": True})

    async def others() -> None:
        for _ in range(5):
            await (await actors("reaper")).expire_leases()
            await (await actors("dispatcher")).claim_side_effect("dispatcher-1")
            await (await actors.reads()).state_counts()
            await Reads(admin_session).state_counts()  # the superuser, on the same pool

    try:
        # Six flows at once (each waits for its own verification claim in turn,
        # so they are serialised where they must be) and the other roles.
        for batch in range(2):
            await asyncio.gather(*(flow(batch * 3 + i) for i in range(3)), others())
        await op.register_class("remote", authority={"worker": {"hosts": ["127.0.0.1"]}})
        cid, gen = await Driver(actors, "remote").leased(worker="worker-x")
        await (await actors("worker")).request_side_effect(
            cid, gen, kind="http.request", target="http://127.0.0.1:9/hook", precondition={},
            idempotency_key=f"k-{cid}", payload={"method": "POST", "url": "http://127.0.0.1:9/hook"})
        await op.abandon(cid, "done with it")
    finally:
        await admin_session.close()

    calls = admin.execute("SELECT fn, ran_as, login FROM ledger_audit.calls ORDER BY id").fetchall()
    called = {c["fn"] for c in calls}
    assert {"open_campaign", "claim_campaign", "heartbeat", "append_events", "record_attempt",
            "claim_verification", "accept", "expire_leases", "claim_side_effect",
            "register_class", "request_side_effect", "abandon"} <= called
    # (the greeting is granted to the reader role, of which every role is a member: it
    # runs as whichever role greets)
    assert {c["ran_as"] for c in calls if c["fn"] == "hello"} >= {
        f"{TEST_PREFIX}{r}" for r in ("sensor", "worker", "reaper", "verifier", "dispatcher", "operator")}
    wrong = [c for c in calls if c["fn"] != "hello" and c["ran_as"] != granted[c["fn"]]]
    assert wrong == [], f"{len(wrong)} of {len(calls)} calls ran as another role: {wrong[:5]}"


async def test_concurrent_claims_through_the_pooler(actors: Actors, pooled_db: Database,
                                                    test_class: str) -> None:
    """Twelve workers, each with its own client connection, share two server
    connections: every campaign is claimed exactly once."""
    driver = Driver(actors, test_class)
    opened = {await driver.open() for _ in range(30)}
    sessions = [await pooled_db.session("worker", max_size=1).open() for _ in range(12)]
    claimed: list[tuple[int, int, str]] = []

    async def work(i: int) -> None:
        kernel = Kernel(sessions[i])
        while (claim := await kernel.claim_campaign(f"w{i}", [test_class])) is not None:
            claimed.append((claim.campaign_id, claim.generation, f"w{i}"))

    try:
        await asyncio.gather(*(work(i) for i in range(len(sessions))))
    finally:
        for s in sessions:
            await s.close()
    assert sorted(c for c, _, _ in claimed) == sorted(opened)
    assert {g for _, g, _ in claimed} == {1}
    assert len({w for _, _, w in claimed}) > 1  # they really raced


async def test_fencing_through_the_pooler(actors: Actors, test_class: str) -> None:
    """A lease the reaper expired (in a multi-call transaction with a pinned
    clock) fences its old holder out, through the pooler."""
    driver = Driver(actors, test_class)
    cid, gen = await driver.leased("worker-old")
    await actors("reaper")
    async with actors.session("reaper").transaction(now=now() + timedelta(minutes=5)) as tx:
        reaped = await Kernel(tx).expire_leases()
    assert [(r.campaign_id, r.generation) for r in reaped] == [(cid, gen + 1)]
    worker = await actors("worker")
    with pytest.raises(StaleLease):
        await worker.heartbeat(cid, gen)
    with pytest.raises(StaleLease):
        await worker.record_attempt(cid, gen, base_sha=sha(1), candidate_sha=sha(2),
                                    fingerprint=fingerprint(2))
    campaign = await (await actors.reads()).campaign(cid)
    assert (campaign.state, campaign.generation) == ("ready", gen + 1)


async def test_journal_is_gap_free_through_the_pooler(actors: Actors, test_class: str) -> None:
    """Concurrent appends by the holder, through the pooler: one gap-free journal."""
    driver = Driver(actors, test_class)
    cid, gen = await driver.leased()
    worker = await actors("worker")
    await asyncio.gather(*(worker.append_events(cid, gen, [{"type": "note", "payload": {"i": i}}])
                           for i in range(40)))
    events = await (await actors.reads()).events(cid)
    seqs = [e.seq for e in events]
    assert seqs == list(range(1, len(seqs) + 1))
    assert sum(1 for e in events if e.type == "note") == 40


async def test_outbox_through_the_pooler(actors: Actors, pooled_db: Database) -> None:
    """A side effect requested through the pooler is handed to exactly one of
    two racing dispatchers, and completed once."""
    await (await actors("operator")).register_class(
        "remote", authority={"worker": {"hosts": ["127.0.0.1"]}})
    cid, gen = await Driver(actors, "remote").leased()
    await (await actors("worker")).request_side_effect(
        cid, gen, kind="http.request", target="http://127.0.0.1:9/hook", precondition={},
        idempotency_key=new_key("effect"),
        payload={"method": "POST", "url": "http://127.0.0.1:9/hook", "body": {}})
    dispatchers = [await pooled_db.session("dispatcher", max_size=1).open() for _ in range(2)]
    try:
        claims = await asyncio.gather(*(Kernel(s).claim_side_effect(f"d{i}")
                                        for i, s in enumerate(dispatchers)))
        got = [c for c in claims if c is not None]
        assert len(got) == 1
        await Kernel(dispatchers[0]).complete_side_effect(got[0].side_effect_id, got[0].claim_token,
                                                          "done", result={"status": 200})
    finally:
        for s in dispatchers:
            await s.close()
    effects = await (await actors.reads()).side_effects_of(cid)
    assert [e.state for e in effects] == ["done"]


async def test_a_hub_behind_the_pooler_is_deaf_and_says_so(pooled_url: str) -> None:
    """A hub whose LISTEN goes through the pooler never hears another session's
    NOTIFY (its own, sent on the same connection, would come back): it starts
    anyway, warns once however often it misses, and waits fall back to their
    poll tick."""
    from structlog.testing import capture_logs

    db = Database(pooled_url, role_prefix=TEST_PREFIX)  # no direct LISTEN URL
    hub = Hub(db, ping_s=0.3, ping_timeout_s=0.5)
    with capture_logs() as logs:
        await hub.start(timeout=10)
        try:
            assert hub.deaf and not hub.hearing and hub.misses >= 1
            with hub.subscribe("ledger_ready") as sub:
                assert await sub.wait(0.2) is False  # polls: the tick passes
            misses = hub.misses
            while hub.misses < misses + 2:  # keeps trying, stays deaf
                await asyncio.sleep(0.1)
            assert hub.deaf
        finally:
            await hub.stop()
    warnings = [e for e in logs if e["log_level"] == "warning"]
    assert [e["event"] for e in warnings] == ["hub connected but deaf"]
    assert "LEDGER_LISTEN_DATABASE_URL" in warnings[0]["fix"]


async def test_a_hub_with_a_direct_listen_url_hears_through_a_pooled_setup(
        pooled_db: Database, actors: Actors, test_class: str) -> None:
    """The same setup with ``listen_url`` direct: the hub hears, and a campaign
    opened through the pooler wakes a waiter."""
    hub = await Hub(pooled_db, ping_s=5).start(timeout=10)
    try:
        assert hub.hearing and not hub.deaf
        with hub.subscribe("ledger_ready") as sub:
            await Driver(actors, test_class).open()
            assert await sub.wait(10) is True
    finally:
        await hub.stop()


def test_session_limits_match_the_roles_settings(admin: psycopg.Connection) -> None:
    """roles.sql's per-role ALTER ROLE ... SET equals database.SESSION_LIMITS,
    so logins get the limits pooled transactions take on."""
    from ledger.db.database import DEFAULT_SESSION_LIMITS, SESSION_LIMITS
    from ledger.settings import ACTORS

    for actor in ACTORS:
        rows = admin.execute(
            "SELECT unnest(s.setconfig) AS setting FROM pg_db_role_setting s "
            "JOIN pg_roles r ON r.oid = s.setrole WHERE r.rolname = %s AND s.setdatabase = 0",
            (f"{TEST_PREFIX}{actor}",)).fetchall()
        settings = dict(r["setting"].split("=", 1) for r in rows)
        statement, idle = SESSION_LIMITS.get(actor, DEFAULT_SESSION_LIMITS)
        assert settings.get("statement_timeout") == statement, actor
        assert settings.get("idle_in_transaction_session_timeout") == idle, actor




# --- what /readyz and /metrics say ---------------------------------------------


def _metrics(text: str) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    return {sample.name: sample.value for family in text_string_to_metric_families(text)
            for sample in family.samples if not sample.labels}


@asynccontextmanager
async def _served(db: Database, options: ApiOptions) -> AsyncIterator[tuple[httpx.AsyncClient, str, Any]]:
    token = new_token()
    tokens = TokenTable.parse(f"r:reader:{hash_token(token)}")
    app = create_app(db, tokens, options)
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://ledger") as client:
            yield client, token, app.state.ledger


async def _until(what: str, condition: Callable[[], Awaitable[bool]], timeout: float = 20.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not await condition():
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.05)


async def test_readyz_and_metrics_report_a_deaf_hub(pooled_url: str) -> None:
    """A server whose hub LISTENs through the pooler is ready but degraded,
    says why, and ``ledger_hub_deaf`` is 1."""
    db = Database(pooled_url, role_prefix=TEST_PREFIX)  # no direct LISTEN URL
    async with _served(db, ApiOptions()) as (client, token, state):
        state.hub.ping_timeout_s = 0.5  # not 5 s: the test waits for the first miss

        async def deaf() -> bool:
            return bool(state.hub.deaf)
        await _until("the hub to find itself deaf", deaf)
        r = await client.get("/readyz")
        assert r.status_code == 200 and r.json()["status"] == "degraded"
        assert any("LEDGER_LISTEN_DATABASE_URL" in why for why in r.json()["degraded"])
        got = _metrics((await client.get("/metrics", headers={"Authorization": f"Bearer {token}"})).text)
        assert got["ledger_hub_deaf"] == 1 and got["ledger_hub_missed_round_trips_total"] >= 1


async def test_a_filling_notification_queue_degrades_readyz(db: Database, db_url: str) -> None:
    """A listener stalled inside a transaction makes the server keep every
    notification: past the alarm /readyz is degraded and the gauge shows the
    queue's use; once the listener reads again, ready. (Filling half of the
    real 8 GB queue would take minutes: the alarm is set just under what 50
    pages of notifications take, measured on this server.)"""
    sender = await psycopg.AsyncConnection.connect(db_url, autocommit=True)
    listener = await psycopg.AsyncConnection.connect(db_url, autocommit=True)

    async def usage() -> float:
        return float((await (await sender.execute("SELECT pg_notification_queue_usage()")).fetchone())[0])

    try:
        before = await usage()
        await listener.execute("LISTEN ledger_stalled")
        await listener.execute("BEGIN")
        await listener.execute("SELECT 1")  # held open: it reads nothing from here on
        for _ in range(50):
            await sender.execute("SELECT pg_notify('ledger_stalled', repeat('x', 7900))")
        filled = await usage()
        assert filled > before
        alarm = (before + filled) / 2
        async with _served(db, ApiOptions(hub=False, notify_queue_alarm=alarm)) as (client, token, _):
            r = await client.get("/readyz")
            assert r.status_code == 200 and r.json()["status"] == "degraded", r.json()
            assert any("notification queue" in why for why in r.json()["degraded"])
            got = _metrics((await client.get("/metrics",
                                             headers={"Authorization": f"Bearer {token}"})).text)
            assert got["ledger_notify_queue_usage"] > alarm
            await listener.execute("COMMIT")  # the listener reads again

            async def ready() -> bool:
                return bool((await client.get("/readyz")).json()["status"] == "ready")
            await _until("the queue to drain", ready)
    finally:
        await listener.close()
        await sender.close()


def test_the_queue_alarm_is_above_half() -> None:
    from ledger.db.hub import NOTIFY_QUEUE_ALARM, queue_alarm

    assert NOTIFY_QUEUE_ALARM == 0.5
    assert not queue_alarm(None) and not queue_alarm(0.0) and not queue_alarm(0.5)
    assert queue_alarm(0.5001) and queue_alarm(1.0)


@pytest.mark.parametrize("through_pooler", [False, True], ids=["direct", "pooled"])
async def test_failed_calls_leave_the_connection_usable(db: Database, pooled_db: Database,
                                                        test_class: str, through_pooler: bool) -> None:
    """On one connection per role, calls that fail alternate with calls that
    succeed, directly (statements prepared after five uses, the role set once)
    and through the pooler (the role per transaction, pipelined; a COMMIT
    behind a failed call once broke the next call: "prepared statement ...
    does not exist")."""
    from ledger.errors import InvalidInput

    where = pooled_db if through_pooler else db
    session = await where.session("reader", max_size=1).open()
    operator = await where.session("operator", max_size=1).open()
    try:
        for _ in range(12):
            with pytest.raises(InvalidInput):
                await Kernel(operator).register_class("bad", lease_seconds=float("nan"))
            await Kernel(operator).register_class(test_class, lease_seconds=30)
            assert await Reads(session).state_counts()
    finally:
        await session.close()
        await operator.close()
