"""Is the database ready for Ledger? Asked when a command failed to use it, so
the user is told which of three things is wrong -- the server cannot be
reached, the database does not exist, or it is not migrated -- and what to do.

The answer comes from probing, not from reading error messages: connecting to
the same server's maintenance database tells a missing database from an
unreachable server, and the catalog tells whether ``ledger migrate`` ran.
Only psycopg is imported here; Alembic only when a revision must be compared.
"""

from __future__ import annotations

import contextlib

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from ..errors import DatabaseMissing, LedgerError, NotMigrated, Unavailable

#: How long a probe may take to connect; a diagnosis must not hang.
PROBE_CONNECT_TIMEOUT_S = 5
#: Databases that exist on every PostgreSQL server (tried in this order).
MAINTENANCE_DATABASES = ("postgres", "template1")

MIGRATE_HINT = "run `ledger migrate`"


def describe_server(url: str) -> str:
    """``host:port`` (or the socket directory) of a URL, for messages."""
    params = conninfo_to_dict(url)
    host = params.get("host") or params.get("hostaddr") or "localhost"
    port = params.get("port") or "5432"
    return f"{host}:{port}" if not str(host).startswith("/") else f"{host} (port {port})"


def database_name(url: str) -> str:
    """The database a URL names (libpq's default: the user name)."""
    params = conninfo_to_dict(url)
    return str(params.get("dbname") or params.get("user") or "postgres")


def _reason(exc: BaseException) -> str:
    """libpq's reason, without its 'connection to server ... failed:' preamble."""
    first = next((line.strip() for line in str(exc).splitlines() if line.strip()), "")
    reason = first.rsplit("failed: ", 1)[-1].strip()
    return reason.removeprefix("FATAL:").strip() or type(exc).__name__


def _connect(url: str) -> psycopg.Connection:
    params = conninfo_to_dict(url)
    params.setdefault("connect_timeout", str(PROBE_CONNECT_TIMEOUT_S))
    return psycopg.connect(make_conninfo("", **params), autocommit=True)


def maintenance_url(url: str) -> str | None:
    """A URL to a database that exists on the same server, or ``None`` if no
    connection to the server works at all."""
    for name in MAINTENANCE_DATABASES:
        if name == database_name(url):
            continue
        candidate = make_conninfo(url, dbname=name)
        with contextlib.suppress(psycopg.Error):
            _connect(candidate).close()
            return candidate
    return None


def connection_problem(url: str, exc: BaseException) -> LedgerError:
    """What a failed connection to ``url`` means: the database is missing (the
    server answers on another database) or the server cannot be reached."""
    name = database_name(url)
    server = describe_server(url)
    if maintenance_url(url) is not None:
        return DatabaseMissing(
            f'database "{name}" does not exist on {server}',
            hint=f"create it (createdb {name}), or run `ledger migrate --create-database`")
    return Unavailable(
        f"cannot connect to the database at {server}: {_reason(exc)}",
        hint="is PostgreSQL running there? Check --database-url / LEDGER_DATABASE_URL")


def schema_problem(conn: psycopg.Connection, role_prefix: str) -> LedgerError | None:
    """Whether the connected database lacks Ledger's roles or schema, or has an
    older schema than this code."""
    name = conn.info.dbname
    has_api = conn.execute("SELECT to_regnamespace('ledger_api') IS NOT NULL").fetchone()
    if not has_api or not has_api[0]:
        return NotMigrated(f'database "{name}" has no Ledger schema', hint=MIGRATE_HINT)
    missing_role = conn.execute(
        "SELECT NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = %s)",
        (f"{role_prefix}reader",)).fetchone()
    if missing_role and missing_role[0]:
        return NotMigrated(f'the roles of prefix "{role_prefix}" do not exist on this server',
                           hint=f"{MIGRATE_HINT} (with the same --role-prefix)")
    has_version = conn.execute("SELECT to_regclass('alembic_version') IS NOT NULL").fetchone()
    if not has_version or not has_version[0]:
        return NotMigrated(f'database "{name}" has no migration record', hint=MIGRATE_HINT)
    row = conn.execute(sql.SQL("SELECT version_num FROM alembic_version")).fetchone()
    at = row[0] if row else None
    from ..migrations import head, known_revisions  # Alembic: only on this path

    want = head()
    if at == want:
        return None
    if at is not None and at not in known_revisions():
        return Unavailable(f'database "{name}" has schema revision {at}, newer than this '
                           f"Ledger knows", hint="upgrade Ledger")
    return NotMigrated(f'database "{name}" has schema revision {at or "base"}, this Ledger '
                       f"needs {want}", hint=MIGRATE_HINT)


def diagnose(url: str, role_prefix: str) -> LedgerError | None:
    """Why the database at ``url`` cannot serve Ledger, or ``None`` if it can."""
    try:
        conn = _connect(url)
    except psycopg.Error as exc:
        return connection_problem(url, exc)
    try:
        return schema_problem(conn, role_prefix)
    except psycopg.Error:
        return None  # it answered: whatever failed is not about readiness
    finally:
        conn.close()


def create_missing_database(url: str) -> bool:
    """Create the database ``url`` names if the server lacks it; ``True`` if
    created. Raises what ``connection_problem`` says when the server itself
    cannot be reached."""
    try:
        _connect(url).close()
        return False
    except psycopg.Error as exc:
        admin = maintenance_url(url)
        if admin is None:
            raise connection_problem(url, exc) from None
    name = database_name(url)
    with _connect(admin) as conn:
        try:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        except psycopg.errors.DuplicateDatabase:
            return False  # another process created it a moment ago
        except psycopg.Error as exc:
            raise Unavailable(f'cannot create database "{name}": {_reason(exc)}',
                              hint="create it as a user allowed to (createdb), then migrate") from None
    return True
