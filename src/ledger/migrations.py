"""Schema migrations: Alembic revisions that each run one versioned SQL file.

``upgrade``/``downgrade`` run every pending revision in one transaction under an
advisory lock, so running them twice, or from two processes at once, is
harmless: the second waits, then finds nothing to do.
"""

from __future__ import annotations

from pathlib import Path

import psycopg
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from psycopg import sql
from sqlalchemy import create_engine
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.pool import NullPool

from .errors import Unavailable

#: Key of the advisory lock that serialises migrations of one database.
MIGRATION_LOCK = 0x4C45444745520001  # "LEDGER" 0001


def migrations_dir() -> Path:
    """The migrations directory: packaged in a wheel, or at the repository top."""
    packaged = Path(__file__).parent / "_migrations"
    if packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parents[2] / "migrations"


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
        if conn.execute("SELECT to_regprocedure('ledger.secure_database()') IS NOT NULL").fetchone()[0]:
            conn.execute("SELECT ledger.secure_database()")


def downgrade(url: str, role_prefix: str = "ledger_", revision: str = "base") -> None:
    """Take the schema down to ``revision``. Roles stay: they are cluster-wide."""
    _run(command.downgrade, url, role_prefix, revision)


def _run(fn, url: str, role_prefix: str, revision: str) -> None:  # type: ignore[no-untyped-def]
    try:
        fn(alembic_config(url, role_prefix), revision)
    except psycopg.OperationalError as exc:
        raise Unavailable(f"cannot reach the database to migrate: {exc}") from exc


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


def prepare(connection: Connection, role_prefix: str) -> None:
    """Called by env.py inside the migration transaction, before any revision."""
    raw = connection.connection.driver_connection
    assert isinstance(raw, psycopg.Connection)
    raw.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
    raw.execute("SELECT set_config('ledger.role_prefix', %s, true)", (role_prefix,))
    raw.execute("SELECT set_config('ledger.migrating', 'on', true)")


def run_sql(connection: Connection, filename: str, *, as_owner: bool) -> None:
    """Run ``migrations/sql/<filename>`` as one script (called by revision files).

    ``as_owner`` runs it as the owner role so that what it creates is owned by
    the owner, not by the administrator who migrates.
    """
    raw = connection.connection.driver_connection
    assert isinstance(raw, psycopg.Connection)
    text = (migrations_dir() / "sql" / filename).read_text()
    if as_owner:
        prefix = raw.execute("SELECT current_setting('ledger.role_prefix')").fetchone()[0]
        raw.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(f"{prefix}owner")))
    # No parameters: psycopg sends the script as-is (several statements, and
    # %-signs inside format() calls untouched).
    raw.execute(text.encode())
    raw.execute("RESET ROLE")
