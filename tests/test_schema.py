"""The schema files are the source: the migrations build exactly what they
define, every function is defined once, privileges are checked at head, and
Python's copies of the schema (view columns, state names) match the database."""

from __future__ import annotations

import ast
import inspect
import re
import textwrap
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import get_args

import psycopg
import pytest
from pydantic import BaseModel

from catalog import catalog
from conftest import TEST_PREFIX, Admin
from ledger import Kernel, LedgerError, Reads, bulk, machine
from ledger.api.dashboard import board, render
from ledger.db import migrations, models, reads
from ledger.db.embedded import create_database, drop_database
from ledger.db.kernel import IDEMPOTENT
from ledger.db.named_queries import QUERIES, Query, load, parse

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "ledger"


@pytest.fixture
def empty_url(pg_admin_url: str) -> Iterator[str]:
    name = f"ledgertest_schema_{uuid.uuid4().hex[:8]}"
    yield create_database(pg_admin_url, name)
    drop_database(pg_admin_url, name)


@pytest.fixture
def second_empty_url(pg_admin_url: str) -> Iterator[str]:
    name = f"ledgertest_schema_{uuid.uuid4().hex[:8]}"
    yield create_database(pg_admin_url, name)
    drop_database(pg_admin_url, name)


def apply_files(url: str, *names: str) -> None:
    """Apply schema files without Alembic, as the migration runner would."""
    with psycopg.connect(url) as conn:
        migrations.prepare(conn, TEST_PREFIX)
        migrations.apply_schema(conn, *names)
    migrations.secure_database(url)


def test_upgrade_head_builds_what_the_schema_files_define(empty_url: str,
                                                          second_empty_url: str) -> None:
    migrations.upgrade(empty_url, TEST_PREFIX)
    apply_files(second_empty_url)
    migrated, direct = catalog(empty_url), catalog(second_empty_url)
    assert migrated.keys() == direct.keys()
    for kind in migrated:
        assert migrated[kind] == direct[kind], kind
    # The listing is not vacuous.
    assert len(migrated["function"]) > 40 and len(migrated["view"]) >= 11
    assert len(migrated["transition"]) >= 18


def test_every_schema_file_can_be_applied_again(db_url: str) -> None:
    """A later revision re-applies the files it changes: doing so on a database
    at head changes nothing (and rows already there stay)."""
    before = catalog(db_url)
    apply_files(db_url)
    assert catalog(db_url) == before


def test_apply_schema_refuses_unknown_files(db_url: str) -> None:
    with pytest.raises(ValueError, match="not schema files: nope.sql"):
        apply_files(db_url, "nope.sql")


def test_the_manifest_lists_every_schema_file() -> None:
    on_disk = sorted(p.name for p in migrations.schema_dir().glob("*.sql"))
    assert sorted(migrations.SCHEMA_FILES) == on_disk
    assert len(set(migrations.SCHEMA_FILES)) == len(migrations.SCHEMA_FILES)
    assert migrations.SCHEMA_FILES[0] == "roles.sql" and migrations.SCHEMA_FILES[-1] == "grants.sql"


FUNCTION_DEF = re.compile(r"\bCREATE\s+(?:OR\s+REPLACE\s+)?FUNCTION\s+([\w.]+)\s*\(", re.IGNORECASE)


@pytest.mark.rollback  # only SQL: a transaction rolled back after the test
def test_each_function_is_defined_once_in_the_tree(admin: Admin) -> None:
    """One body per function in the live files. The revisions hold frozen
    copies of the files they changed (migrations/sql/<revision>/schema/),
    and define no function anywhere else: before.sql, after.sql and down.sql
    alter tables and drop what goes."""
    found: Counter[str] = Counter()
    for path in (SRC / "db" / "sql").rglob("*.sql"):
        found.update(FUNCTION_DEF.findall(path.read_text()))
    for path in (ROOT / "migrations").rglob("*"):
        if path.suffix in (".sql", ".py") and "schema" not in path.relative_to(ROOT / "migrations").parts:
            assert not FUNCTION_DEF.findall(path.read_text()), path
    repeated = {name: n for name, n in found.items() if n > 1}
    assert repeated == {}
    in_database = {r["name"] for r in admin.execute(
        "SELECT n.nspname || '.' || p.proname AS name FROM pg_proc p "
        "JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname IN ('ledger', 'ledger_api')")}
    assert set(found) == in_database


@pytest.mark.rollback  # only SQL: a transaction rolled back after the test
def test_no_function_is_executable_by_public(admin: Admin) -> None:
    """The global default lets PUBLIC execute a new function;
    a per-schema default cannot revoke that."""
    public = [r["fn"] for r in admin.execute(
        "SELECT p.oid::regprocedure::text AS fn FROM pg_proc p "
        "JOIN pg_namespace n ON n.oid = p.pronamespace "
        "WHERE n.nspname IN ('ledger', 'ledger_api') AND has_function_privilege('public', p.oid, 'EXECUTE')")]
    assert public == []
    # ...and a function the owner creates later is not PUBLIC's either.
    admin.execute(f"SET ROLE {TEST_PREFIX}owner")
    admin.execute("CREATE FUNCTION ledger.later() RETURNS int LANGUAGE sql AS 'SELECT 1'")
    admin.execute("RESET ROLE")
    assert not admin.execute(
        "SELECT has_function_privilege('public', 'ledger.later()', 'EXECUTE') AS ok").fetchone()["ok"]


@pytest.mark.parametrize(("breach", "said"), [
    ("GRANT EXECUTE ON FUNCTION ledger.now() TO PUBLIC", "executable by PUBLIC: ledger.now()"),
    ("GRANT EXECUTE ON FUNCTION ledger.backoff(text, integer) TO {prefix}worker",
     "executable by a role other than the owner: ledger.backoff(text,integer)"),
    ("GRANT EXECUTE ON FUNCTION ledger_api.heartbeat(bigint, bigint) TO {prefix}operator",
     "not granted to exactly one runtime role: ledger_api.heartbeat(bigint,bigint)"),
    ("REVOKE EXECUTE ON FUNCTION ledger_api.heartbeat(bigint, bigint) FROM {prefix}worker",
     "not granted to exactly one runtime role: ledger_api.heartbeat(bigint,bigint)"),
    ("ALTER FUNCTION ledger_api.heartbeat(bigint, bigint) RESET search_path",
     "pinned search_path: ledger_api.heartbeat(bigint,bigint)"),
    ("ALTER FUNCTION ledger_api.heartbeat(bigint, bigint) SECURITY INVOKER",
     "pinned search_path: ledger_api.heartbeat(bigint,bigint)"),
])
def test_every_upgrade_ends_with_the_privilege_check(db_url: str, breach: str, said: str) -> None:
    """At head no revision runs, yet the check does: a breach made by hand (or
    by a revision that forgot grants.sql) fails ``ledger migrate``, naming it."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(breach.format(prefix=TEST_PREFIX))
    with pytest.raises(LedgerError, match="^migration failed: privilege check failed: ") as failure:
        migrations.upgrade(db_url, TEST_PREFIX)
    assert failure.value.sqlstate == "LG009"
    assert said in failure.value.message


# --- Python's copies of the schema -----------------------------------------

#: Each read view and the model its rows become.
VIEW_MODELS: dict[str, type[BaseModel]] = {
    "campaigns": models.Campaign, "attempts": models.Attempt, "events": models.Event,
    "observations": models.Observation, "verifications": models.Verification,
    "side_effects": models.SideEffect, "security_events": models.SecurityEvent,
    "classes": models.CampaignClass, "states": models.StateRow,
    "transitions": models.TransitionRow, "class_events": models.ClassEvent,
    "processes": models.ProcessRow, "approvals": models.Approval,
    "limit_keys": models.LimitKey, "limit_buckets": models.LimitBucket,
    "attempt_usage": models.AttemptUsage, "limit_events": models.LimitEvent,
}


def _view_columns(admin: Admin, view: str) -> list[str]:
    return [r["attname"] for r in admin.execute(
        "SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0 "
        "AND NOT attisdropped ORDER BY attnum", (f"ledger_api.{view}",))]


@pytest.mark.rollback  # only SQL: a transaction rolled back after the test
def test_read_models_list_the_views_columns(admin: Admin) -> None:
    for view, model in VIEW_MODELS.items():
        columns = _view_columns(admin, view)
        fields = [f.alias or name for name, f in model.model_fields.items()]
        assert fields == columns, f"models.{model.__name__} vs ledger_api.{view}"


# --- the two mirrors: Kernel of ledger_api, Reads of the named queries --------


def _public_methods(cls: type) -> set[str]:
    return {name for name, _ in inspect.getmembers(cls, inspect.isfunction)
            if not name.startswith("_")}


@pytest.mark.rollback  # only SQL: a transaction rolled back after the test
def test_kernel_has_one_method_per_api_function_and_the_idempotent_ones_exist(admin: Admin) -> None:
    functions = {r["proname"] for r in admin.execute(
        "SELECT p.proname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
        "WHERE n.nspname = 'ledger_api'")}
    assert len(functions) > 40
    # hello is every connection's greeting (database.GREETING), not a call of one role
    assert _public_methods(Kernel) - {"within"} == functions - {"hello"}
    assert IDEMPOTENT <= functions
    assert "open_campaign" in IDEMPOTENT and "claim_campaign" in functions - IDEMPOTENT


def test_reads_has_one_method_per_named_query_and_each_runs_its_own() -> None:
    assert len(QUERIES) >= 40
    assert _public_methods(Reads) == set(QUERIES) | reads.COMPOSED
    assert reads.COMPOSED.isdisjoint(QUERIES)
    texts = [q.text for q in QUERIES.values()]
    assert len(set(texts)) == len(texts)  # no query pasted under a second name
    for name in QUERIES:
        # the method runs the query of its name (directly, or through a helper)
        assert f'"{name}"' in inspect.getsource(getattr(Reads, name)), name
    for name in reads.COMPOSED:
        # a composed read calls named reads, and runs no query itself
        source = textwrap.dedent(inspect.getsource(getattr(Reads, name)))
        called = {node.func.attr for node in ast.walk(ast.parse(source))
                  if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                  and isinstance(node.func.value, ast.Name) and node.func.value.id == "self"}
        assert called and called <= set(QUERIES), (name, called)
        assert "Q[" not in source and "executor" not in source, name


def _positional(query: Query) -> tuple[str, list[str]]:
    """``query`` with its ``%(name)s`` parameters as ``$n``, for PREPARE."""
    names: list[str] = []

    def number(m: re.Match[str]) -> str:
        if m.group(1) not in names:
            names.append(m.group(1))
        return f"${names.index(m.group(1)) + 1}"
    text = re.sub(r"%\((\w+)\)s", number, query.text).replace("%%", "%")
    return text, names


@pytest.mark.rollback  # only SQL: a transaction rolled back after the test
def test_every_named_query_prepares_and_runs_as_the_reader(admin: Admin) -> None:
    """Each parameter's type is said in the SQL (PREPARE infers the rest or
    fails), and the reader may run each one (every parameter NULL)."""
    admin.execute(f"SET ROLE {TEST_PREFIX}reader")
    for name, query in QUERIES.items():
        text, params = _positional(query)
        admin.execute(f"PREPARE named_{name} AS {text}")
        types = admin.execute("SELECT parameter_types::text[] AS types FROM pg_prepared_statements "
                              "WHERE name = %s", (f"named_{name}",)).fetchone()
        assert types is not None and "unknown" not in types["types"], name
        admin.execute(f"DEALLOCATE named_{name}")
        admin.execute(query.text, dict.fromkeys(params)).fetchall()
    admin.execute("RESET ROLE")


def _filter(name: str) -> str:
    text = QUERIES[name].text
    start = text.index("\n WHERE ")  # the statement's own, not a FILTER's
    ends = [i for i in (text.find("\n GROUP BY", start), text.find("\n ORDER BY", start)) if i > 0]
    return text[start:min(ends) if ends else len(text)]


def test_the_campaign_filter_is_the_same_in_every_query_of_it() -> None:
    page = _filter("campaigns")
    assert "%(search)s" in page and "%(cursor_id)s" in page
    assert _filter("matching_state_counts") == page
    assert _filter("matching_summary") == page


def test_named_queries_load_by_name_and_refuse_a_name_twice(tmp_path: Path) -> None:
    loaded = parse("-- header\n-- name: one\n-- why\nSELECT 1;\n\n-- name: two\nSELECT\n  2\n")
    assert loaded == {"one": Query("SELECT 1", name="one"), "two": Query("SELECT\n  2", name="two")}
    with pytest.raises(ValueError, match="two is named twice"):
        parse("-- name: two\nSELECT 1\n-- name: two\nSELECT 2\n")
    with pytest.raises(ValueError, match="one is empty"):
        parse("-- name: one\n-- only a comment\n")
    (tmp_path / "a.sql").write_text("-- name: one\nSELECT 1\n")
    (tmp_path / "b.sql").write_text("-- name: one\nSELECT 2\n")
    with pytest.raises(ValueError, match="b.sql: query one is also named in another file"):
        load(tmp_path)


@pytest.mark.rollback  # only SQL: a transaction rolled back after the test
def test_state_names_in_python_are_the_databases(admin: Admin) -> None:
    rows = admin.execute("SELECT name, is_terminal FROM ledger.state ORDER BY position").fetchall()
    assert models.STATES == tuple(r["name"] for r in rows) == get_args(models.State)
    assert models.TERMINAL_STATES == {r["name"] for r in rows if r["is_terminal"]}
    assert models.OPEN_STATES == tuple(r["name"] for r in rows if not r["is_terminal"])
    assert bulk.ACTION_STATES["abandon"] == models.OPEN_STATES
    assert render.STATES == models.STATES
    opened = admin.execute("SELECT to_state FROM ledger.transition WHERE from_state IS NULL").fetchall()
    assert [r["to_state"] for r in opened] == [machine.INITIAL]
    # The board's lanes show every state once.
    laned = [s for _, _, states in board.LANES for s in states]
    assert sorted(laned) == sorted(models.STATES)


def _state_literals() -> Iterator[tuple[str, int, str]]:
    """String literals compared with a campaign's ``state`` anywhere in the package."""
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Compare):
                continue
            sides = [node.left, *node.comparators]
            if not any(isinstance(s, ast.Attribute) and s.attr == "state"
                       and "side_effect" not in ast.unparse(s) for s in sides):
                continue
            for side in sides:
                items = side.elts if isinstance(side, (ast.Tuple, ast.List, ast.Set)) else [side]
                for const in items:
                    if isinstance(const, ast.Constant) and isinstance(const.value, str):
                        yield str(path.relative_to(SRC)), node.lineno, const.value


def test_states_compared_in_python_exist() -> None:
    found = list(_state_literals())
    assert len(found) >= 3  # dispatcher, demo ...: the scan sees them
    unknown = [f for f in found if f[2] not in models.STATES]
    assert unknown == []
