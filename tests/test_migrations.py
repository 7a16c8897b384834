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

from catalog import catalog
from conftest import TEST_PREFIX
from ledger import LedgerError
from ledger.db import migrations
from ledger.db.embedded import create_database, drop_database
from ledger.errors import MigrationFailed, SchemaMismatch

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


def test_every_revision_with_a_down_sql_steps_down_to_what_its_predecessor_built(
        empty_db: str, pg_admin_url: str) -> None:
    """Down one revision at a time, for as long as each has a down.sql: each
    step leaves exactly what a fresh migration to the revision before builds
    (its ALTERs undone, the previous frozen copies of its files put back)."""
    history = migrations.history()
    migrations.upgrade(empty_db, TEST_PREFIX)
    stepped = 0
    for upper, lower in zip(history[::-1], history[::-1][1:]):
        step = migrations.step_of(_module(upper))
        if step is None or not (step.folder / "down.sql").exists():
            break
        migrations.downgrade(empty_db, TEST_PREFIX, lower)
        assert migrations.current(empty_db) == lower
        name = f"ledgertest_mig_{uuid.uuid4().hex[:8]}"
        fresh = create_database(pg_admin_url, name)
        try:
            migrations.upgrade(fresh, TEST_PREFIX, lower)
            assert catalog(empty_db) == catalog(fresh), f"down from {upper}"
        finally:
            drop_database(pg_admin_url, name)
        stepped += 1
    assert stepped >= 1  # 0004 has a down.sql
    migrations.upgrade(empty_db, TEST_PREFIX)
    assert migrations.current(empty_db) == migrations.head()


def test_a_revision_without_a_down_sql_refuses_to_be_undone(empty_db: str) -> None:
    migrations.upgrade(empty_db, TEST_PREFIX, "0003_trace_context")
    with pytest.raises(LedgerError, match="0002_merge_queue cannot be undone.*roll forward"):
        migrations.downgrade(empty_db, TEST_PREFIX, "0001_baseline")
    # 0003 (nothing to undo) went down in a transaction of its own; 0002 stayed
    assert migrations.current(empty_db) == "0002_merge_queue"


def _module(revision: str):
    from alembic.script import ScriptDirectory

    cfg = migrations.alembic_config("unused", TEST_PREFIX)
    script = ScriptDirectory.from_config(cfg).get_revision(revision)
    assert script is not None
    return script.module


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
                                      replace(pg_get_userbyid(a.grantee), m.value, ''), ','
                                      ORDER BY pg_get_userbyid(a.grantee)), '')
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
    with pytest.raises(SchemaMismatch, match="^cannot migrate: the database is at schema "
                       "0007_lean_hot_path, which Ledger .* does not know") as caught:
        migrations.upgrade(db_url, TEST_PREFIX)
    assert caught.value.exit_code == 14 and caught.value.hint


def _history_with(tmp_path: Path, revision: str, before_sql: str) -> Path:
    """A copy of the migrations with one more revision after head whose
    before.sql is ``before_sql``."""
    import shutil

    copy = tmp_path / "migrations"
    shutil.copytree(migrations.migrations_dir(), copy)
    (copy / "sql" / revision).mkdir(parents=True)
    (copy / "sql" / revision / "before.sql").write_text(before_sql)
    (copy / "versions" / f"{revision}.py").write_text(
        "from alembic import op\n"
        "from ledger.db.migrations import Step\n"
        f"revision = {revision!r}\ndown_revision = {migrations.head()!r}\n"
        "branch_labels = None\ndepends_on = None\n"
        "step = Step(revision)\n"
        "def upgrade():\n    step.upgrade(op.get_bind())\n"
        "def downgrade():\n    step.downgrade(op.get_bind())\n")
    return copy


def test_a_failing_revision_leaves_the_last_good_one_and_says_so_in_one_line(
        empty_db: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    head = migrations.head()
    copy = _history_with(tmp_path, "9001_broken",
                         "ALTER TABLE ledger.campaign ADD COLUMN half_done integer;\n"
                         "SELECT 1/0;\n")
    monkeypatch.setattr(migrations, "migrations_dir", lambda: copy)
    with pytest.raises(MigrationFailed) as caught:
        migrations.upgrade(empty_db, TEST_PREFIX)
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith("revision 9001_broken failed: division by zero")
    assert f"the database stays at {head}" in message
    # every earlier revision committed, nothing of the broken one did
    assert migrations.current(empty_db) == head
    with psycopg.connect(empty_db) as conn:
        assert conn.execute("SELECT count(*) FROM pg_attribute WHERE attrelid = 'ledger.campaign'::regclass "
                            "AND attname = 'half_done'").fetchone()[0] == 0


def test_a_revision_gives_way_to_an_open_transaction_instead_of_blocking_everyone(
        db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A long transaction holds a lock the revision needs: the revision waits
    at most its lock timeout (while it waits, the workers behind it wait
    too), gives way, tries again, and finally fails naming the holder; a
    worker's read is never held up longer than the lock timeout; once the
    transaction ends, the same migration goes through."""
    import threading
    import time

    head = migrations.head()
    copy = _history_with(tmp_path, "9002_needs_a_lock",
                         "ALTER TABLE ledger.campaign ADD COLUMN waited_for integer;\n")
    monkeypatch.setattr(migrations, "migrations_dir", lambda: copy)
    holder = psycopg.connect(db_url, application_name="ledgertest:long-report")
    holder.execute("SELECT count(*) FROM ledger.campaign")  # an open transaction: ACCESS SHARE
    waits: list[float] = []
    stop = threading.Event()

    def worker() -> None:  # a writer queued behind the ALTER while it waits
        with psycopg.connect(db_url, autocommit=True) as conn:
            while not stop.is_set():
                started = time.monotonic()
                conn.execute("SELECT count(*) FROM ledger.campaign")
                waits.append(time.monotonic() - started)
                time.sleep(0.02)

    thread = threading.Thread(target=worker)
    thread.start()
    seen: list[str] = []
    try:
        with pytest.raises(MigrationFailed) as caught:
            migrations.upgrade(db_url, TEST_PREFIX, lock_timeout_s=0.5, lock_retries=1,
                               progress=lambda rev, what: seen.append(f"{rev} {what}"))
    finally:
        stop.set()
        thread.join()
    message = str(caught.value)
    assert message.startswith("revision 9002_needs_a_lock waited 0.5s for a lock 2 time(s)")
    assert f"pid {holder.info.backend_pid} (ledgertest:long-report, idle in transaction" in message
    assert f"the database stays at {head}" in message
    assert any("gave way" in line for line in seen)
    assert migrations.current(db_url) == head
    assert waits and max(waits) < 0.5 + 1.0, waits  # never queued behind it for long
    holder.rollback()
    holder.close()
    assert migrations.upgrade(db_url, TEST_PREFIX, lock_timeout_s=0.5) == ["9002_needs_a_lock"]
    assert migrations.current(db_url) == "9002_needs_a_lock"


def test_dry_run_lists_the_revisions_and_their_sql_and_changes_nothing(empty_db: str) -> None:
    migrations.upgrade(empty_db, TEST_PREFIX, "0001_baseline")
    env = {**os.environ, "LEDGER_DATABASE_URL": empty_db, "LEDGER_ROLE_PREFIX": TEST_PREFIX,
           "NO_COLOR": "1"}
    proc = subprocess.run([sys.executable, "-m", "ledger", "migrate", "--dry-run"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    listed = [line.split(":")[0].strip() for line in proc.stderr.splitlines()[1:]]
    assert listed == migrations.history()[1:]
    assert "-- ===== 0002_merge_queue" in proc.stdout
    assert "ALTER TABLE ledger.transition" in proc.stdout  # 0002's before.sql
    assert "CREATE OR REPLACE FUNCTION ledger_api.hello" in proc.stdout  # 0004's frozen copy
    assert migrations.current(empty_db) == "0001_baseline"


def test_an_installed_copy_finds_its_migrations_where_the_wheel_puts_them() -> None:
    """The wheel carries migrations/ inside the package (pyproject's
    package-dir maps it to ledger._migrations); migrations_dir looks exactly
    there. (0.2.0 looked beside ledger/db and an installed 0.2.0 could not
    migrate.)"""
    import tomllib

    import ledger

    config = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    mapped = config["tool"]["setuptools"]["package-dir"]
    assert mapped["ledger._migrations"] == "migrations"
    assert "ledger._migrations" in config["tool"]["setuptools"]["packages"]
    package = Path(ledger.__file__).parent
    packaged = package / "_migrations"
    packaged.mkdir()
    try:
        assert migrations.migrations_dir() == packaged
    finally:
        packaged.rmdir()
    assert migrations.migrations_dir() == Path(__file__).parents[1] / "migrations"
