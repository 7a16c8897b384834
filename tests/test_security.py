"""A narrow write API (README "How it works"): runtime roles write only through their own functions, and
nothing on a caller's search_path can change what a kernel function does."""

from __future__ import annotations

import psycopg
import pytest
from psycopg import sql

from conftest import TEST_PREFIX, Actors, Admin, AsRole
from drive import Driver
from ledger import Forbidden

# Only SQL on one connection: each test runs in a transaction rolled back after it.
pytestmark = [pytest.mark.anyio, pytest.mark.rollback]

RUNTIME = ("reader", "sensor", "worker", "reaper", "verifier", "dispatcher", "operator")
TABLES = ("campaign", "campaign_event", "attempt", "observation", "verification", "side_effect",
          "security_event", "campaign_class", "transition", "state", "actor", "meta")
VIEWS = ("campaigns", "events", "attempts", "observations", "verifications", "side_effects",
         "security_events", "classes", "states", "transitions")


@pytest.mark.parametrize("role", RUNTIME)
def test_no_runtime_role_can_write_a_table_or_view(as_role: AsRole, role: str) -> None:
    with as_role(role) as conn:
        for table in TABLES:
            for stmt in ("INSERT INTO {} DEFAULT VALUES", "UPDATE {} SET id = id",
                         "DELETE FROM {}", "TRUNCATE {}"):
                name = sql.Identifier("ledger", table)
                with pytest.raises(psycopg.errors.InsufficientPrivilege):
                    conn.execute(sql.SQL(stmt).format(name))
        for view in VIEWS:
            # Simple views are auto-updatable: only the missing privilege stops a write.
            column = conn.execute(
                "SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0 "
                "AND attname <> 'id' ORDER BY attnum LIMIT 1", (f"ledger_api.{view}",)).fetchone()["attname"]
            for stmt in ("INSERT INTO {view} DEFAULT VALUES", "UPDATE {view} SET {col} = {col}",
                         "DELETE FROM {view}"):
                with pytest.raises((psycopg.errors.InsufficientPrivilege,
                                    psycopg.errors.ObjectNotInPrerequisiteState)):  # join views
                    conn.execute(sql.SQL(stmt).format(view=sql.Identifier("ledger_api", view),
                                                      col=sql.Identifier(column)))
        # ...and reading the raw tables is refused too: reads go through views.
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("SELECT * FROM ledger.campaign")


@pytest.mark.parametrize("role", RUNTIME)
def test_runtime_roles_create_nothing_and_own_nothing(as_role: AsRole, admin: Admin, role: str) -> None:
    name = f"{TEST_PREFIX}{role}"
    schemas = [r["nspname"] for r in admin.execute(
        "SELECT nspname FROM pg_namespace WHERE nspname NOT LIKE 'pg_toast%' AND nspname NOT LIKE 'pg_temp%'")]
    for schema in schemas:
        assert not admin.execute("SELECT has_schema_privilege(%s, %s, 'CREATE') AS ok",
                                 (name, schema)).fetchone()["ok"], schema
    can = admin.execute(
        "SELECT has_database_privilege(%s, current_database(), 'CREATE') AS c, "
        "has_database_privilege(%s, current_database(), 'TEMPORARY') AS t, "
        "(SELECT rolname FROM pg_roles WHERE oid = d.datdba) AS owner "
        "FROM pg_database d WHERE datname = current_database()", (name, name)).fetchone()
    assert can == {"c": False, "t": False, "owner": can["owner"]}
    assert not can["owner"].startswith(TEST_PREFIX)
    with as_role(role) as conn:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("CREATE TEMP TABLE campaign (id int)")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("CREATE TABLE public.campaign (id int)")


def test_owner_is_a_plain_nologin_role_owning_everything(admin: Admin) -> None:
    owner = admin.execute(
        "SELECT rolcanlogin, rolsuper, rolbypassrls, rolcreaterole, rolcreatedb FROM pg_roles "
        "WHERE rolname = %s", (f"{TEST_PREFIX}owner",)).fetchone()
    assert owner == {"rolcanlogin": False, "rolsuper": False, "rolbypassrls": False,
                     "rolcreaterole": False, "rolcreatedb": False}
    foreign = admin.execute(
        "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname IN ('ledger', 'ledger_api') AND pg_get_userbyid(c.relowner) <> %s "
        "UNION ALL SELECT p.proname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
        "WHERE n.nspname IN ('ledger', 'ledger_api') AND pg_get_userbyid(p.proowner) <> %s",
        (f"{TEST_PREFIX}owner", f"{TEST_PREFIX}owner")).fetchall()
    assert foreign == []
    for role in RUNTIME:
        flags = admin.execute("SELECT rolsuper, rolbypassrls, rolcreaterole FROM pg_roles WHERE rolname = %s",
                              (f"{TEST_PREFIX}{role}",)).fetchone()
        assert flags == {"rolsuper": False, "rolbypassrls": False, "rolcreaterole": False}


def test_every_api_function_is_definer_pinned_and_granted_to_one_role(admin: Admin) -> None:
    rows = admin.execute("""
        SELECT p.proname, p.prosecdef, p.proconfig,
               array(SELECT pg_get_userbyid(a.grantee) FROM aclexplode(p.proacl) a
                      WHERE a.privilege_type = 'EXECUTE' AND a.grantee <> p.proowner
                      ORDER BY 1) AS grantees
          FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
         WHERE n.nspname = 'ledger_api' ORDER BY p.proname""").fetchall()
    assert len(rows) >= 19
    for r in rows:
        assert r["prosecdef"], r["proname"]
        assert "search_path=pg_catalog, pg_temp" in r["proconfig"], r["proname"]
        assert len(r["grantees"]) == 1 and r["grantees"][0].startswith(TEST_PREFIX), r
        assert "public" not in r["grantees"]


@pytest.mark.parametrize(("role", "call"), [
    ("worker", "SELECT ledger_api.accept(1)"),
    ("worker", "SELECT ledger_api.reject(1, 'x')"),
    ("worker", "SELECT ledger_api.open_campaign('test', 'k', 't')"),
    ("worker", "SELECT ledger_api.record_observation('s', 'k', 't', 'red', now())"),
    ("worker", "SELECT ledger_api.abandon(1)"),
    ("worker", "SELECT ledger_api.complete_side_effect(1, 1, 'done')"),
    ("verifier", "SELECT ledger_api.claim_campaign('v')"),
    ("verifier", "SELECT ledger_api.record_attempt(1, 1, 'a', 'b', 'c')"),
    ("sensor", "SELECT ledger_api.heartbeat(1, 1)"),
    ("reader", "SELECT ledger_api.expire_leases()"),
    ("dispatcher", "SELECT ledger_api.register_class('x')"),
])
def test_functions_of_other_roles_are_refused(as_role: AsRole, role: str, call: str) -> None:
    with as_role(role) as conn:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute(call)


async def test_forbidden_is_the_python_error_for_another_roles_function(actors: Actors, test_class: str) -> None:
    worker = await actors("worker")
    with pytest.raises(Forbidden):
        await worker.open_campaign(test_class, "k", "t")


async def test_shadowing_through_search_path_changes_nothing(as_role: AsRole, admin: Admin, actors: Actors, test_class: str) -> None:
    """A user schema full of look-alikes (tables, now(), random(), pg_notify())
    first on the caller's search_path: the kernel uses none of them."""
    worker_role = f"{TEST_PREFIX}worker"
    admin.execute("CREATE SCHEMA evil")
    admin.execute("CREATE TABLE evil.calls (what text)")
    admin.execute("CREATE TABLE evil.campaign (LIKE ledger.campaign)")
    for fn, ret in [("now", "timestamptz"), ("statement_timestamp", "timestamptz"),
                    ("random", "double precision")]:
        value = {"timestamptz": "'2001-01-01'::timestamptz", "double precision": "0.5"}[ret]
        admin.execute(sql.SQL(
            "CREATE FUNCTION evil.{}() RETURNS {} LANGUAGE sql AS "
            "$$ INSERT INTO evil.calls VALUES ({}) RETURNING {} $$").format(
                sql.Identifier(fn), sql.SQL(ret), sql.Literal(fn), sql.SQL(value)))
    admin.execute("CREATE FUNCTION evil.pg_notify(text, text) RETURNS void LANGUAGE sql AS "
                  "$$ INSERT INTO evil.calls VALUES ('pg_notify') $$")
    admin.execute(sql.SQL("GRANT USAGE ON SCHEMA evil TO {}").format(sql.Identifier(worker_role)))
    admin.execute(sql.SQL("GRANT ALL ON ALL TABLES IN SCHEMA evil TO {}").format(sql.Identifier(worker_role)))

    sensor = await actors("sensor")
    cid = (await sensor.open_campaign(test_class, "shadowed", "t")).campaign_id
    with as_role("worker") as conn:
        conn.execute("SET search_path = evil, pg_temp, public, pg_catalog")
        claim = conn.execute("SELECT * FROM ledger_api.claim_campaign('w', ARRAY[%s])", (test_class,)).fetchone()
        assert claim["campaign_id"] == cid
        expires = conn.execute("SELECT lease_expires_at AS e FROM ledger_api.heartbeat(%s, %s)",
                               (cid, claim["generation"])).fetchone()["e"]
        conn.execute("SELECT ledger_api.fail_attempt(%s, %s, 'x')", (cid, claim["generation"]))
    assert admin.execute("SELECT count(*) AS n FROM evil.calls").fetchone()["n"] == 0
    assert admin.execute("SELECT count(*) AS n FROM evil.campaign").fetchone()["n"] == 0
    assert expires.year > 2001
    row = admin.execute("SELECT state, generation FROM ledger.campaign WHERE id = %s", (cid,)).fetchone()
    assert row == {"state": "ready", "generation": 1}


async def test_a_worker_cannot_move_the_clock(as_role: AsRole, admin: Admin, actors: Actors, test_class: str) -> None:
    """ledger.now() honours a pinned time only where the owner allowed it (tests);
    elsewhere a worker setting ledger.now cannot extend its own lease."""
    admin.execute("UPDATE ledger.meta SET value = 'false' WHERE key = 'clock_pinnable'")
    d = Driver(actors, test_class)
    cid, gen = await d.leased()
    with as_role("worker") as conn:
        with conn.transaction():
            conn.execute("SET LOCAL ledger.now = '2999-01-01'")
            expires = conn.execute("SELECT lease_expires_at AS e FROM ledger_api.heartbeat(%s, %s)",
                                   (cid, gen)).fetchone()["e"]
    assert expires.year < 2999
