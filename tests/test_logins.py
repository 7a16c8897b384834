"""``ledger logins create``: one login per runtime role."""

from __future__ import annotations

import os
import subprocess
import sys

import psycopg
import pytest

from conftest import TEST_PREFIX
from drive import Driver
from ledger import Database, Kernel
from ledger.db.database import DEFAULT_SESSION_LIMITS, SESSION_LIMITS
from ledger.db.logins import create_logins, login_url
from ledger.db.named_queries import Query
from ledger.settings import ACTORS

pytestmark = pytest.mark.anyio

WHO = Query("SELECT session_user AS login, current_user AS role")


async def test_logins_act_as_their_roles_and_nothing_more(db: Database, db_url: str,
                                                          admin: psycopg.Connection) -> None:
    made = create_logins(db, rotate=True)  # roles are cluster-wide: they may exist already
    assert [m.actor for m in made] == list(ACTORS)
    assert all(m.url and m.login == f"{TEST_PREFIX}{m.actor}_login" for m in made)
    for m in made:
        row = admin.execute(
            "SELECT rolcanlogin, rolsuper, rolcreaterole, rolbypassrls, "
            "pg_has_role(rolname, %s, 'MEMBER') AS member, "
            "(SELECT setconfig FROM pg_db_role_setting WHERE setrole = r.oid AND setdatabase = 0) AS config "
            "FROM pg_roles r WHERE rolname = %s", (f"{TEST_PREFIX}{m.actor}", m.login)).fetchone()
        assert row is not None
        statement, idle = SESSION_LIMITS.get(m.actor, DEFAULT_SESSION_LIMITS)
        assert (row["rolcanlogin"], row["rolsuper"], row["rolcreaterole"], row["rolbypassrls"],
                row["member"]) == (True, False, False, False, True)
        assert set(row["config"]) == {f"statement_timeout={statement}",
                                      f"idle_in_transaction_session_timeout={idle}"}

    # A second run changes nothing and keeps the passwords.
    again = create_logins(db)
    assert [(m.created, m.url) for m in again] == [(False, None)] * len(ACTORS)

    # Processes given those URLs act as their roles through their own logins.
    logins = Database(db.url, role_prefix=TEST_PREFIX,
                      role_urls={m.actor: m.url for m in made if m.url})
    sessions = {a: await logins.session(a).open() for a in ("operator", "sensor", "worker")}
    try:
        for actor, session in sessions.items():
            assert await session.fetch(WHO) == [{"login": f"{TEST_PREFIX}{actor}_login",
                                                 "role": f"{TEST_PREFIX}{actor}"}]
        await Kernel(sessions["operator"]).register_class("via-logins", lease_seconds=30)

        async def kernel(actor: str) -> Kernel:
            return Kernel(sessions[actor])
        _, generation = await Driver(kernel, "via-logins").leased()  # type: ignore[arg-type]  # a bare kernel factory is enough
        assert generation == 1
        # The login cannot take on another role than its own.
        with pytest.raises(Exception, match="permission denied"):
            assert made[2].url is not None  # made just now: its URL is known
            with psycopg.connect(made[2].url, autocommit=True) as conn:  # the worker's
                conn.execute(f"SET ROLE {TEST_PREFIX}owner")
    finally:
        for session in sessions.values():
            await session.close()


def test_the_command_prints_one_entry_per_role(db_url: str) -> None:
    env = {**os.environ, "LEDGER_DATABASE_URL": db_url, "LEDGER_ROLE_PREFIX": TEST_PREFIX}
    out = subprocess.run([sys.executable, "-m", "ledger", "logins", "create", "--cert"], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    entries = dict(line.split("=", 1) for line in out.stdout.splitlines())
    assert sorted(entries) == sorted(f"LEDGER_{a.upper()}_DATABASE_URL" for a in ACTORS)
    worker = entries["LEDGER_WORKER_DATABASE_URL"]
    assert f"{TEST_PREFIX}worker_login@" in worker and "sslmode=verify-full" in worker
    assert "sslcert=" in worker and ":" not in worker.split("//", 1)[1].split("@")[0]


def test_login_urls_keep_the_servers_settings() -> None:
    assert login_url("postgresql://admin:pw@db.example:6432/ledger?connect_timeout=3", "w", "p/q") \
        == "postgresql://w:p%2Fq@db.example:6432/ledger?connect_timeout=3"
    assert login_url("host=/run/pg port=5433 dbname=ledger user=admin", "w", None) \
        == "postgresql://w@/ledger?host=%2Frun%2Fpg&port=5433"
    assert login_url("postgresql://admin@a:5432,b:5432/ledger?target_session_attrs=read-write",
                     "w", "p").startswith("postgresql://w:p@/ledger?")


async def test_a_service_on_the_administrators_login_says_so_once(db: Database) -> None:
    from structlog.testing import capture_logs

    from ledger.db import database

    database._admin_warned.discard("reader")
    database._admin_warned.discard("sensor")
    service = Database(db.url, role_prefix=TEST_PREFIX, role_urls={"sensor": db.url})
    service.service = True
    with capture_logs() as logs:
        for _ in range(2):
            for actor in ("reader", "sensor"):
                session = await service.session(actor).open()
                await session.close()
    warnings = [entry for entry in logs if entry["log_level"] == "warning"]
    assert len(warnings) == 1 and warnings[0]["actor"] == "reader"
    assert "administrator rights" in warnings[0]["event"]
