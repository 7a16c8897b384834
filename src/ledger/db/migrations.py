"""Schema migrations: the schema files and the Alembic revisions that apply them.

The current definition of everything is in ``src/ledger/db/sql`` (the package's
``sql`` folder), one file per concern, applied in the order of
``SCHEMA_FILES``. The baseline revision applies them all; a later revision
that changes a function, trigger or view re-applies that file with
``apply_schema`` (see CONTRIBUTING.md, "Working on the schema").

``upgrade``/``downgrade`` run every pending revision in one transaction under an
advisory lock, so running them twice, or from two processes at once, is
harmless: the second waits, then finds nothing to do. Every migration ends with
the privilege self-check (``finish``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, LiteralString

import psycopg
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util import CommandError
from psycopg import sql
from sqlalchemy import create_engine
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.pool import NullPool

from ledger.errors import LedgerError, Unavailable, from_sqlstate

#: Key of the advisory lock that serialises migrations of one database.
MIGRATION_LOCK = 0x4C45444745520001  # "LEDGER" 0001

#: The schema files in apply order. Each may be applied again (every statement
#: in them is idempotent: IF NOT EXISTS, OR REPLACE, ON CONFLICT DO NOTHING).
SCHEMA_FILES: tuple[str, ...] = (
    "roles.sql",            # roles and the two schemas (run as the administrator)
    "meta_and_clock.sql",   # settings, role names, ledger.now()
    "state_machine.sql",    # states, actors, transitions; begin/end_transition
    "campaign.sql",         # classes, campaigns, their indexes, guard and journal triggers
    "journal.sql",          # campaign_event: append-only, notify, append_event
    "attempt.sql",
    "observation.sql",
    "verification.sql",
    "outbox.sql",           # side_effect
    "merge_queue.sql",      # promotions waiting in order per target; merge batches
    "security_event.sql",
    "web.sql",              # browser sessions, bulk jobs
    "class_event.sql",      # what operators did to a class (pause, resume)
    "sensor_tick.sql",
    "api_helpers.sql",      # internal helpers the role APIs share
    "api_sensor.sql",
    "api_worker.sql",
    "api_reaper.sql",
    "api_verifier.sql",
    "api_dispatcher.sql",
    "api_operator.sql",
    "process.sql",          # the registry of live processes, one report function per role
    "views.sql",
    "grants.sql",           # the function -> role table, and the self-check
)

#: Files run as the administrator; all others run as the owner role.
ADMIN_FILES = frozenset({"roles.sql"})


def migrations_dir() -> Path:
    """The migrations directory: packaged in a wheel, or at the repository top."""
    packaged = Path(__file__).parent / "_migrations"
    if packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parents[3] / "migrations"


def schema_dir() -> Path:
    """The folder of the schema files (inside the package, so a wheel has it)."""
    return Path(__file__).parent / "sql"


def engine_for(url: str) -> Engine:
    """A SQLAlchemy engine over psycopg for ``url`` (a URL or a conninfo string)."""
    return create_engine("postgresql+psycopg://", creator=lambda: psycopg.connect(url),
                         poolclass=NullPool)


def alembic_config(url: str, role_prefix: str) -> Config:
    """An Alembic config for ``url``; env.py reads the url and prefix from it."""
    cfg = Config()
    cfg.set_main_option("script_location", str(migrations_dir()))
    cfg.attributes["ledger_url"] = url
    cfg.attributes["ledger_role_prefix"] = role_prefix
    return cfg


def upgrade(url: str, role_prefix: str = "ledger_", revision: str = "head") -> None:
    """Bring the schema up to ``revision`` (idempotent), then re-apply the
    database-level privileges (see ``secure_database``)."""
    _run(command.upgrade, url, role_prefix, revision)
    secure_database(url)


def secure_database(url: str) -> None:
    """Re-apply what a database copied from a template lacks (no TEMPORARY for PUBLIC)."""
    with psycopg.connect(url, autocommit=True) as conn:
        if _scalar(conn, "SELECT to_regprocedure('ledger.secure_database()') IS NOT NULL"):
            # Two processes migrating at once would update the database's ACL
            # together ("tuple concurrently updated"): one at a time.
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(hashtext('ledger.secure_database'))")
                conn.execute("SELECT ledger.secure_database()")


def downgrade(url: str, role_prefix: str = "ledger_", revision: str = "base") -> None:
    """Take the schema down to ``revision``. Roles stay: they are cluster-wide."""
    _run(command.downgrade, url, role_prefix, revision)


def _run(fn, url: str, role_prefix: str, revision: str) -> None:  # type: ignore[no-untyped-def]
    try:
        fn(alembic_config(url, role_prefix), revision)
    except psycopg.OperationalError as exc:
        raise Unavailable(f"cannot reach the database to migrate: {exc}") from exc
    except psycopg.Error as exc:
        # e.g. the privilege self-check (LG009): one readable line, not a traceback
        message = exc.diag.message_primary or str(exc)
        raise from_sqlstate(exc.sqlstate, f"migration failed: {message}") from exc
    except CommandError as exc:
        # e.g. a database at a revision this code does not know
        raise LedgerError(f"cannot migrate: {exc}") from exc


def current(url: str) -> str | None:
    """The revision the database is at (``None``: never migrated)."""
    engine = engine_for(url)
    try:
        with engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()
    finally:
        engine.dispose()


def head() -> str:
    """The newest revision this code knows."""
    cfg = Config()
    cfg.set_main_option("script_location", str(migrations_dir()))
    revision = ScriptDirectory.from_config(cfg).get_current_head()
    assert revision is not None
    return revision


def known_revisions() -> set[str]:
    """Every revision this code knows."""
    cfg = Config()
    cfg.set_main_option("script_location", str(migrations_dir()))
    return {script.revision for script in ScriptDirectory.from_config(cfg).walk_revisions()}


def prepare(connection: Connection | psycopg.Connection, role_prefix: str) -> None:
    """Called by env.py inside the migration transaction, before any revision."""
    raw = _driver(connection)
    raw.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
    raw.execute("SELECT set_config('ledger.role_prefix', %s, true)", (role_prefix,))
    raw.execute("SELECT set_config('ledger.migrating', 'on', true)")


def finish(connection: Connection | psycopg.Connection) -> None:
    """Called by env.py after the revisions, in the same transaction: the
    privilege self-check (grants.sql) fails the migration if any function is
    executable by PUBLIC or is not granted and pinned as the API must be."""
    raw = _driver(connection)
    if _scalar(raw, "SELECT to_regprocedure('ledger.check_privileges()') IS NOT NULL"):
        raw.execute("SELECT ledger.check_privileges()")


def apply_schema(connection: Connection | psycopg.Connection, *names: str,
                 folder: Path | None = None) -> None:
    """Apply schema files from ``folder`` (default ``schema_dir()``): the named
    ones, or all of them.

    Files run in ``SCHEMA_FILES`` order whatever the order named, each as one
    script: ``roles.sql`` as the administrator, the others as the owner role,
    so that what they create is owned by the owner. Called by the baseline
    revision (all files) and by later revisions that re-apply the files they
    change (``apply_schema(op.get_bind(), "api_worker.sql", "grants.sql")``).
    """
    unknown = sorted(set(names) - set(SCHEMA_FILES))
    if unknown:
        raise ValueError(f"not schema files: {', '.join(unknown)} (see SCHEMA_FILES)")
    raw = _driver(connection)
    for name in SCHEMA_FILES:
        if not names or name in names:
            text = ((folder or schema_dir()) / name).read_text()
            _execute(raw, text, as_owner=name not in ADMIN_FILES)


def run_sql(connection: Connection, filename: str, *, as_owner: bool) -> None:
    """Run ``migrations/sql/<filename>`` as one script (SQL that belongs to one
    revision only, such as the baseline's downgrade).

    ``as_owner`` runs it as the owner role so that what it creates is owned by
    the owner, not by the administrator who migrates.
    """
    _execute(_driver(connection), (migrations_dir() / "sql" / filename).read_text(),
             as_owner=as_owner)


def _driver(connection: Connection | psycopg.Connection) -> psycopg.Connection:
    if isinstance(connection, psycopg.Connection):
        return connection
    raw = connection.connection.driver_connection
    assert isinstance(raw, psycopg.Connection)
    return raw


def _scalar(conn: psycopg.Connection[Any], query: LiteralString) -> Any:
    """The one value a one-row query returns."""
    row = conn.execute(query).fetchone()
    assert row is not None, query
    return row[0]


def _execute(raw: psycopg.Connection, text: str, *, as_owner: bool) -> None:
    if as_owner:
        prefix = _scalar(raw, "SELECT current_setting('ledger.role_prefix')")
        raw.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(f"{prefix}owner")))
    # No parameters: psycopg sends the script as-is (several statements, and
    # %-signs inside format() calls untouched).
    raw.execute(text.encode())
    raw.execute("RESET ROLE")
