"""Per-role logins (``ledger logins create``).

A process given only the administrator's URL can take on any role, the owner's
included. A login per runtime role (``<prefix><actor>_login``: LOGIN, no other
attribute, member of ``<prefix><actor>``) bounds each process to its role; its
``LEDGER_<ACTOR>_DATABASE_URL`` entry is printed for the process's environment.

Creating them is idempotent: a login that exists is left as it is (its
password too, unless ``rotate``), its membership and limits made right. With
``auth="password"`` a new login gets a random password, sent to the server
already hashed (SCRAM, by libpq) so it never appears in a server log; with
``auth="cert"`` it gets none, and its URL asks for a client certificate
(``sslcert``/``sslkey`` named after the login; the server's ``pg_hba.conf`` must
say ``cert`` for it).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlencode

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from ledger import errors
from ledger.db.database import DEFAULT_SESSION_LIMITS, SESSION_LIMITS, Database
from ledger.settings import ACTORS

LOGIN_SUFFIX = "_login"


@dataclass(frozen=True)
class Login:
    """One runtime role's login and the URL a process of that role uses."""

    actor: str
    login: str
    created: bool
    url: str | None  # None: an existing login whose password was kept

    @property
    def variable(self) -> str:
        """The environment variable that names the URL."""
        return f"LEDGER_{self.actor.upper()}_DATABASE_URL"


def login_name(db: Database, actor: str) -> str:
    """The login of ``actor``'s role."""
    return f"{db.role(actor)}{LOGIN_SUFFIX}"


def login_url(admin_url: str, login: str, password: str | None, *, cert: bool = False) -> str:
    """The administrator's connection settings with ``login`` (and its
    password, or a client certificate) instead of the administrator."""
    params = {k: str(v) for k, v in conninfo_to_dict(admin_url).items() if v is not None}
    for key in ("user", "password", "passfile", "sslcert", "sslkey"):
        params.pop(key, None)
    host = params.pop("host", "")
    port = params.pop("port", "")
    dbname = params.pop("dbname", "")
    if cert:
        params["sslmode"] = "verify-full"
        params["sslcert"] = f"{login}.crt"
        params["sslkey"] = f"{login}.key"
    credentials = quote(login, safe="") + (f":{quote(password, safe='')}" if password else "")
    netloc = credentials + "@"
    if host and not host.startswith("/") and "," not in host:
        netloc += f"[{host}]" if ":" in host else host
        if port:
            netloc += f":{port}"
    else:  # a socket directory or several hosts: as parameters
        if host:
            params["host"] = host
        if port:
            params["port"] = port
    query = f"?{urlencode(params)}" if params else ""
    return f"postgresql://{netloc}/{quote(dbname, safe='')}{query}"


def create_logins(db: Database, *, auth: str = "password", rotate: bool = False,
                  actors: tuple[str, ...] = ACTORS) -> list[Login]:
    """Create (or put right) one login per runtime role; see the module docstring."""
    if auth not in ("password", "cert"):
        raise errors.InvalidInput(f"auth must be password or cert, not {auth!r}")
    made: list[Login] = []
    try:
        with db.connect_sync(None) as conn:
            for actor in actors:
                made.append(_create_one(conn, db, actor, auth, rotate))
    except psycopg.Error as exc:
        message = (exc.diag.message_primary if exc.sqlstate else None) or str(exc).strip()
        if exc.sqlstate is None:
            raise errors.Unavailable(f"cannot create logins: {message}") from exc
        raise errors.from_sqlstate(exc.sqlstate, f"cannot create logins: {message}",
                                   exc.diag.message_detail) from exc
    return made


def _create_one(conn: psycopg.Connection[dict[str, Any]], db: Database, actor: str, auth: str,
                rotate: bool) -> Login:
    role, login = db.role(actor), login_name(db, actor)
    ident = sql.Identifier(login)
    with conn.transaction():
        exists = conn.execute("SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = %s",
                              (login,)).fetchone() is not None
        if not exists:
            conn.execute(sql.SQL("CREATE ROLE {} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE "
                                 "NOREPLICATION NOBYPASSRLS INHERIT").format(ident))
        if not conn.execute("SELECT pg_catalog.pg_has_role(%s, %s, 'MEMBER') AS m",
                            (login, role)).fetchone()["m"]:  # type: ignore[index]  # one row, always
            conn.execute(sql.SQL("GRANT {} TO {}").format(sql.Identifier(role), ident))
        # The limits its role has (roles.sql): role settings apply to the role
        # that logs in, not to the roles it is a member of.
        statement, idle = SESSION_LIMITS.get(actor, DEFAULT_SESSION_LIMITS)
        for name, value in (("statement_timeout", statement),
                            ("idle_in_transaction_session_timeout", idle)):
            conn.execute(sql.SQL("ALTER ROLE {} SET {} = {}").format(
                ident, sql.Identifier(name), sql.Literal(value)))
        password: str | None = None
        if auth == "cert":
            conn.execute(sql.SQL("ALTER ROLE {} PASSWORD NULL").format(ident))
        elif not exists or rotate:
            password = secrets.token_urlsafe(24)
            hashed = conn.pgconn.encrypt_password(password.encode(), login.encode())
            conn.execute(sql.SQL("ALTER ROLE {} PASSWORD {}").format(
                ident, sql.Literal(hashed.decode())))
    url = (login_url(db.url, login, None, cert=True) if auth == "cert"
           else login_url(db.url, login, password) if password else None)
    return Login(actor, login, not exists, url)
