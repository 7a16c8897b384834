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

from ledger import Database, migrations
from ledger.embedded import create_database, drop_database, server_url

PREFIX = os.environ.get("LEDGER_BENCH_ROLE_PREFIX", "ledgerbench_")


@contextmanager
def bench_database() -> Iterator[Database]:
    """A fresh migrated database, dropped afterwards."""
    admin = os.environ.get("LEDGER_BENCH_DATABASE_URL") or server_url(
        Path(tempfile.mkdtemp(prefix="ledger-bench-pg-")), cleanup="delete")
    name = f"ledgerbench_{uuid.uuid4().hex[:8]}"
    url = create_database(admin, name)
    try:
        migrations.upgrade(url, PREFIX)
        yield Database(url, role_prefix=PREFIX)
    finally:
        drop_database(admin, name)


def server_version(db: Database) -> str:
    """The server's version string, for the printout."""
    with db.connect_sync(None) as conn:
        return conn.execute("SHOW server_version").fetchone()["server_version"]
