"""Whether a database's schema serves this code: asked of the database itself
(``ledger_api.hello``, compatibility.sql), which knows the oldest code it
serves. Only psycopg is imported: readiness probes and ``/readyz`` use it."""

from __future__ import annotations

import psycopg

from ledger.errors import CodeTooOld, LedgerError, NotMigrated, SchemaMismatch
from ledger.release import RELEASE, SCHEMA, describe

MIGRATE_HINT = "run `ledger migrate`"


def revision(conn: psycopg.Connection) -> str | None:
    """The revision the connected database is at (``None``: never migrated)."""
    found = conn.execute("SELECT to_regclass('public.alembic_version') IS NOT NULL").fetchone()
    if not found or not found[0]:
        return None
    row = conn.execute("SELECT version_num FROM public.alembic_version").fetchone()
    return str(row[0]) if row else None


def compatibility(conn: psycopg.Connection, at: str | None) -> LedgerError | None:
    """Why this code cannot use the connected database at revision ``at``
    (``None``: it can). A schema older than the greeting is one this code
    cannot use; a newer one says itself whether it still serves this code."""
    name = conn.info.dbname
    if at == SCHEMA:
        return None
    if at is None:
        return NotMigrated(f'database "{name}" has no migration record', hint=MIGRATE_HINT)
    try:
        with conn.transaction():
            conn.execute("SELECT ledger_api.hello(%s, %s)", (RELEASE, SCHEMA))
    except psycopg.errors.UndefinedFunction:
        return NotMigrated(f'database "{name}" is at schema {describe(at)}; Ledger {RELEASE} '
                           f"needs {SCHEMA}", hint=f"{MIGRATE_HINT} with Ledger {RELEASE}")
    except psycopg.errors.InvalidSchemaName:
        return NotMigrated(f'database "{name}" has no Ledger schema', hint=MIGRATE_HINT)
    except psycopg.Error as exc:
        if exc.sqlstate in ("LG012", "LG013"):
            cls = CodeTooOld if exc.sqlstate == "LG013" else SchemaMismatch
            return cls(f'database "{name}": {exc.diag.message_primary}', sqlstate=exc.sqlstate,
                       hint=exc.diag.message_hint)
        raise
    return None


def schema_state(url: str) -> tuple[str | None, LedgerError | None]:
    """The revision of the database at ``url``, and why this code cannot use
    it (``None``: it can)."""
    with psycopg.connect(url, autocommit=True, connect_timeout=5) as conn:
        at = revision(conn)
        return at, compatibility(conn, at)
