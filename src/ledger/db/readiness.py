"""Is the database ready for Ledger? Asked when a command failed to use it, so
the user is told which of four things is wrong -- the server cannot be
reached, it refuses the login, the database does not exist, or it is not
migrated -- and what to do.

The answer comes from probing, not from reading error messages: connecting to
the same server's maintenance database tells a missing database from an
unreachable server; a bare protocol-level start-up (``_startup_reply``) gets
the SQLSTATE of a login the server refuses (libpq gives none for a failed
connection), and the catalog tells whether ``ledger migrate`` ran.
Only psycopg is imported here; Alembic only when a revision must be compared.
"""

from __future__ import annotations

import contextlib
import getpass
import socket
import struct
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from ledger.db.compatibility import MIGRATE_HINT, compatibility, revision
from ledger.errors import DatabaseMissing, LedgerError, LoginRefused, NotMigrated, Unavailable

#: How long a probe may take to connect; a diagnosis must not hang.
PROBE_CONNECT_TIMEOUT_S = 5
#: Databases that exist on every PostgreSQL server (tried in this order).
MAINTENANCE_DATABASES = ("postgres", "template1")



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


def _message(kind: bytes, body: bytes) -> bytes:
    return kind + struct.pack("!I", len(body) + 4) + body


def _startup_reply(address: tuple[int, Any], user: str, dbname: str) -> str | None:
    """What a server at ``address`` answers to a plain StartupMessage for
    ``user`` on ``dbname``: the SQLSTATE of an error it sends before or without
    authentication, ``AUTH`` if it asks for a password, ``OK`` if it lets the
    login in, or ``None`` if nothing that speaks PostgreSQL answered."""
    family, where = address
    body = struct.pack("!I", 196608)  # protocol 3.0
    for key, value in (("user", user), ("database", dbname)):
        body += key.encode() + b"\0" + value.encode() + b"\0"
    startup = struct.pack("!I", len(body) + 5) + body + b"\0"
    try:
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.settimeout(PROBE_CONNECT_TIMEOUT_S)
            sock.connect(where)
            sock.sendall(startup)
            reader = sock.makefile("rb")
            for _ in range(64):  # a handful of messages at most before it decides
                head = reader.read(5)
                if len(head) < 5 or head[:1] not in b"ERSKNZ":
                    return None
                size = struct.unpack("!I", head[1:])[0] - 4
                if not 0 <= size <= 65536:
                    return None
                payload = reader.read(size)
                kind = head[:1]
                if kind == b"E":  # fields: a type byte, a C string; 'C' is the SQLSTATE
                    for field in payload.split(b"\0"):
                        if field[:1] == b"C":
                            return field[1:].decode(errors="replace")
                    return "?"
                if kind == b"R" and payload[:4] != b"\0\0\0\0":
                    return "AUTH"  # a password (or another method) is asked for
                if kind == b"Z":  # logged in: say goodbye properly
                    sock.sendall(_message(b"X", b""))
                    return "OK"
    except (OSError, ValueError, struct.error):
        return None
    return None


def _addresses(url: str) -> list[tuple[int, Any]]:
    """Where libpq would connect for ``url``: TCP ``(host, port)`` pairs or Unix sockets."""
    params = conninfo_to_dict(url)
    hosts = str(params.get("hostaddr") or params.get("host") or "").split(",")
    ports = str(params.get("port") or "5432").split(",")
    found: list[tuple[int, Any]] = []
    for i, host in enumerate(hosts):
        port = int(ports[i] if i < len(ports) else ports[-1] or 5432)
        if not host:  # libpq's default: the Unix socket in its usual directories
            found += [(socket.AF_UNIX, f"{d}/.s.PGSQL.{port}") for d in ("/var/run/postgresql", "/tmp")]
        elif host.startswith("/"):
            found.append((socket.AF_UNIX, f"{host}/.s.PGSQL.{port}"))
        else:
            found.append((socket.AF_INET6 if ":" in host else socket.AF_INET, (host, port)))
    return found


def _probe(url: str) -> str | None:
    """``_startup_reply`` of the first server of ``url`` that answers."""
    params = conninfo_to_dict(url)
    user = str(params.get("user") or getpass.getuser())
    try:
        addresses = _addresses(url)
    except ValueError:
        return None
    for address in addresses:
        reply = _startup_reply(address, user, database_name(url))
        if reply is not None:
            return reply
    return None


#: SQLSTATEs a server sends when it refuses a login: invalid authorization
#: (no such role, not permitted to log in, a pg_hba.conf reject), a wrong
#: password, no CONNECT privilege on the database.
_LOGIN_REFUSED = frozenset({"28000", "28P01", "42501"})
_CHECK_LOGIN = ("check the user and password in --database-url / LEDGER_DATABASE_URL, "
                "and the server's pg_hba.conf")


def _exists(admin_url: str, name: str) -> bool:
    with contextlib.suppress(psycopg.Error), _connect(admin_url) as conn:
        return conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone() is not None
    return False


def connection_problem(url: str, exc: BaseException, *, login: str | None = None) -> LedgerError:
    """What a failed connection to ``url`` means, from probing rather than from
    libpq's words: the database is missing, the server refused the login, or
    no server answers there. ``login``: the hint for a refused login, where
    the URL is not the main one (a role's own login)."""
    name = database_name(url)
    server = describe_server(url)
    user = str(conninfo_to_dict(url).get("user") or getpass.getuser())
    missing = DatabaseMissing(
        f'database "{name}" does not exist on {server}',
        hint=f"create it (createdb {name}), or run `ledger migrate --create-database`")
    refused = LoginRefused(
        f'the server at {server} refused the login of user "{user}" on database "{name}": '
        f"{_reason(exc)}", hint=login or _CHECK_LOGIN)
    admin = maintenance_url(url)
    if admin is not None:
        # The same login works on another database of the server.
        return refused if _exists(admin, name) else missing
    reply = _probe(url)
    if reply == "3D000":
        return missing
    if reply in _LOGIN_REFUSED or reply == "AUTH":
        return refused
    if reply == "OK":  # the login works now: what failed was passing
        return Unavailable(f"cannot connect to the database at {server}: {_reason(exc)}",
                           hint="the server accepts the login now: retry")
    if reply is not None:  # it answered, e.g. starting up (57P03) or too many clients (53300)
        return Unavailable(f"the server at {server} answered but cannot take the connection now: "
                           f"{_reason(exc)}", sqlstate=reply,
                           hint="retry when it is ready (services wait: --wait-for-database)")
    return Unavailable(
        f"cannot connect to the database at {server}: {_reason(exc)}",
        hint="is PostgreSQL running there? Check --database-url / LEDGER_DATABASE_URL")


def schema_problem(conn: psycopg.Connection, role_prefix: str) -> LedgerError | None:
    """Whether the connected database lacks Ledger's roles or schema, or has a
    schema this code cannot work with (``compatibility``)."""
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
    return compatibility(conn, revision(conn))


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
