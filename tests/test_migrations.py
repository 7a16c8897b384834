"""Migrations tested as code: round trips, repeats, concurrent runs, and a
normalised snapshot of the schema kept in the repository (schema changes show
up in review, a changed function body as a changed digest). Regenerate it with
LEDGER_UPDATE_SNAPSHOT=1."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import psycopg
import pytest

from conftest import TEST_PREFIX
from ledger import LedgerError
from ledger.db import migrations
from ledger.db.embedded import create_database, drop_database

SNAPSHOT = Path(__file__).parent / "schema.snapshot"


@pytest.fixture
def empty_db(pg_admin_url: str):
    name = f"ledgertest_mig_{uuid.uuid4().hex[:8]}"
    url = create_database(pg_admin_url, name)
    yield url
    drop_database(pg_admin_url, name)


def _objects(url: str) -> list[str]:
    with psycopg.connect(url) as conn:
        return [r[0] for r in conn.execute(
            "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname IN ('ledger', 'ledger_api') UNION ALL "
            "SELECT nspname FROM pg_namespace WHERE nspname IN ('ledger', 'ledger_api') ORDER BY 1")]


def test_upgrade_downgrade_upgrade(empty_db: str) -> None:
    migrations.upgrade(empty_db, TEST_PREFIX)
    assert migrations.current(empty_db) == migrations.head()
    first = snapshot(empty_db)
    migrations.downgrade(empty_db, TEST_PREFIX, "base")
    assert migrations.current(empty_db) is None
    assert _objects(empty_db) == []
    migrations.upgrade(empty_db, TEST_PREFIX)
    assert snapshot(empty_db) == first
    migrations.upgrade(empty_db, TEST_PREFIX)  # at head: nothing to do, no error
    assert snapshot(empty_db) == first


def test_every_revision_steps_down_and_up(empty_db: str) -> None:
    from alembic.script import ScriptDirectory

    cfg = migrations.alembic_config(empty_db, TEST_PREFIX)
    revisions = [r.revision for r in ScriptDirectory.from_config(cfg).walk_revisions()][::-1]
    migrations.upgrade(empty_db, TEST_PREFIX)
    for rev in reversed(revisions[:-1]):
        migrations.downgrade(empty_db, TEST_PREFIX, rev)
        assert migrations.current(empty_db) == rev
    migrations.upgrade(empty_db, TEST_PREFIX)
    assert migrations.current(empty_db) == migrations.head()


def test_two_processes_migrating_at_once(empty_db: str) -> None:
    code = "import sys; from ledger.db import migrations; migrations.upgrade(sys.argv[1], sys.argv[2])"
    procs = [subprocess.Popen([sys.executable, "-c", code, empty_db, TEST_PREFIX],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for _ in range(2)]
    outputs = [p.communicate(timeout=120)[0].decode() for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    assert migrations.current(empty_db) == migrations.head()


def test_schema_matches_the_snapshot(db_url: str) -> None:
    actual = snapshot(db_url)
    if os.environ.get("LEDGER_UPDATE_SNAPSHOT"):
        SNAPSHOT.write_text(actual)
    assert actual == SNAPSHOT.read_text(), (
        "the schema changed; review it and regenerate tests/schema.snapshot with\n"
        "  LEDGER_UPDATE_SNAPSHOT=1 LEDGER_TEST_DATABASE_URL=... "
        ".venv/bin/python -m pytest tests/test_migrations.py -k snapshot")


def body_digest(body: str) -> str:
    """A short digest of a function body, blind to trailing spaces and blank edges."""
    normal = re.sub(r"[ \t]+$", "", body.replace("\r\n", "\n"), flags=re.M).strip("\n")
    return "sha256:" + hashlib.sha256(normal.encode()).hexdigest()[:16]


def snapshot(url: str) -> str:
    """A normalised, server-version-independent listing of Ledger's schema."""
    queries = {
        "column": """
            SELECT format('%s.%s.%s %s%s%s', n.nspname, c.relname, a.attname,
                          format_type(a.atttypid, a.atttypmod),
                          CASE WHEN a.attnotnull THEN ' not null' ELSE '' END,
                          CASE WHEN a.attidentity <> '' THEN ' identity' ELSE '' END)
              FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
              JOIN pg_namespace n ON n.oid = c.relnamespace
             WHERE n.nspname IN ('ledger', 'ledger_api') AND c.relkind IN ('r', 'v')
               AND a.attnum > 0 AND NOT a.attisdropped""",
        "constraint": """
            SELECT format('%s %s', conname, pg_get_constraintdef(co.oid))
              FROM pg_constraint co JOIN pg_namespace n ON n.oid = co.connamespace
             WHERE n.nspname = 'ledger' AND co.contype <> 'n'  -- PG 18 lists NOT NULL here""",
        "index": """
            SELECT indexname || ' ' || regexp_replace(indexdef, '^.* USING ', '')
              FROM pg_indexes WHERE schemaname = 'ledger'""",
        "function": """
            SELECT format('%s.%s(%s) -> %s%s%s%s', n.nspname, p.proname,
                          pg_get_function_identity_arguments(p.oid),
                          pg_get_function_result(p.oid),
                          CASE WHEN p.prosecdef THEN ' definer' ELSE '' END,
                          CASE WHEN p.proconfig IS NOT NULL
                               THEN ' set ' || array_to_string(p.proconfig, ' ') ELSE '' END,
                          (SELECT coalesce(' to ' || string_agg(
                                      replace(pg_get_userbyid(a.grantee), m.value, ''), ',' ORDER BY 1), '')
                             FROM aclexplode(p.proacl) a, ledger.meta m
                            WHERE a.grantee <> p.proowner AND m.key = 'role_prefix')),
                   p.prosrc
              FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
             WHERE n.nspname IN ('ledger', 'ledger_api')""",
        "trigger": """
            SELECT format('%s on %s', t.tgname, c.relname)
              FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
              JOIN pg_namespace n ON n.oid = c.relnamespace
             WHERE n.nspname = 'ledger' AND NOT t.tgisinternal""",
        "transition": "SELECT format('%s: %s -> %s by %s', name, coalesce(from_state, '-'), to_state, owner_role) FROM ledger.transition",
    }
    lines: list[str] = []
    with psycopg.connect(url) as conn:
        for kind, query in queries.items():
            lines += sorted(f"{kind} {r[0]}" + (f" {body_digest(r[1])}" if len(r) > 1 else "")
                            for r in conn.execute(query))
    return "\n".join(lines) + "\n"


def test_a_database_at_an_unknown_revision_is_one_readable_error(db_url: str) -> None:
    """E.g. a database migrated before 0001-0007 were folded into the baseline."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("UPDATE alembic_version SET version_num = '0007_lean_hot_path'")
    with pytest.raises(LedgerError, match="^cannot migrate: .*'0007_lean_hot_path'"):
        migrations.upgrade(db_url, TEST_PREFIX)
