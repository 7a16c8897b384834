"""Shared setup for benchmarks: a throwaway migrated database on the server
named by LEDGER_BENCH_DATABASE_URL (an admin URL), or on a throwaway embedded
PostgreSQL 18. Benchmarks print figures; they assert nothing."""

from __future__ import annotations

import os
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
from psycopg import sql

from ledger import Database, migrations
from ledger.embedded import server_url, with_database

PREFIX = os.environ.get("LEDGER_BENCH_ROLE_PREFIX", "ledgerbench_")


@contextmanager
def bench_database() -> Iterator[Database]:
    """A fresh migrated database, dropped afterwards."""
    admin = os.environ.get("LEDGER_BENCH_DATABASE_URL") or server_url(
        Path(tempfile.mkdtemp(prefix="ledger-bench-pg-")), cleanup="delete")
    name = f"ledgerbench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    url = with_database(admin, name)
    try:
        migrations.upgrade(url, PREFIX)
        yield Database(url, role_prefix=PREFIX)
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def server_version(db: Database) -> str:
    """The server's version string, for the printout."""
    with db.connect_sync(None) as conn:
        return conn.execute("SHOW server_version").fetchone()["server_version"]
