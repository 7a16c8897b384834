"""Test harness: a real PostgreSQL for every test.

The server is ``LEDGER_TEST_DATABASE_URL`` when set, otherwise a throwaway
embedded PostgreSQL 18. ``pgbouncer`` (session-wide) puts a real PgBouncer in
transaction mode in front of it, on a free port, with a pool small enough that
clients really share server connections; tests that need it skip when the
binary is not installed (Debian's ``pgbouncer`` package). One template database is migrated per session; every
test that asks for ``db`` gets its own database copied from it
(``CREATE DATABASE ... TEMPLATE``), dropped afterwards. Roles are cluster-wide,
so tests use their own prefix and never assume a pristine cluster.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from ledger import Database, Kernel, Reads, migrations
from ledger.embedded import create_database, drop_database, server_url

TEST_PREFIX = os.environ.get("LEDGER_TEST_ROLE_PREFIX", "ledgertest_")
RUN_TAG = f"{os.getpid()}_{uuid.uuid4().hex[:6]}"


# Async tests declare `pytestmark = pytest.mark.anyio`; they run on asyncio.


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session")
def pg_admin_url() -> Iterator[str]:
    """An administrator URL of the server under test."""
    url = os.environ.get("LEDGER_TEST_DATABASE_URL")
    if url:
        yield url
        return
    data_dir = Path(tempfile.mkdtemp(prefix="ledger-test-pg-"))
    yield server_url(data_dir, cleanup="delete")


#: Server connections PgBouncer keeps per (database, user): small, so that the
#: tests' clients really take turns on them.
PGBOUNCER_POOL_SIZE = 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def pgbouncer(pg_admin_url: str) -> Iterator[dict[str, str]]:
    """A PgBouncer in transaction mode in front of the test server; yields the
    host and port to put in a URL instead of the server's."""
    binary = shutil.which("pgbouncer") or shutil.which("pgbouncer", path="/usr/sbin:/usr/bin")
    if binary is None:
        pytest.skip("pgbouncer is not installed (apt-get install pgbouncer)")
    server = conninfo_to_dict(pg_admin_url)
    # Not under pytest's (private) temporary directory: run as root, PgBouncer
    # drops to nobody, who must read its files and write its log here.
    work = Path(tempfile.mkdtemp(prefix="ledger-test-pgbouncer-"))
    work.chmod(0o777)
    user, password = str(server.get("user") or "postgres"), str(server.get("password") or "")
    (work / "users.txt").write_text(f'"{user}" "{password}"\n')
    port = _free_port()
    target = {k: server[k] for k in ("host", "port") if server.get(k)}
    (work / "pgbouncer.ini").write_text("\n".join([
        "[databases]",
        "* = " + " ".join(f"{k}={v}" for k, v in target.items()),
        "[pgbouncer]",
        "listen_addr = 127.0.0.1",
        f"listen_port = {port}",
        "unix_socket_dir =",
        "auth_type = trust",
        f"auth_file = {work / 'users.txt'}",
        "pool_mode = transaction",
        f"default_pool_size = {PGBOUNCER_POOL_SIZE}",
        "min_pool_size = 0",
        "reserve_pool_size = 0",
        "max_client_conn = 500",
        "server_lifetime = 3600",
        f"logfile = {work / 'pgbouncer.log'}",
        "",
    ]))
    command = [binary, str(work / "pgbouncer.ini")]
    if os.geteuid() == 0:
        # PgBouncer refuses to run as root: it runs as nobody, or as the owner
        # of the server's socket directory (the embedded server's is private).
        host = str(target.get("host", ""))
        owner = pwd.getpwuid(os.stat(host).st_uid).pw_name if host.startswith("/") else "nobody"
        command[1:1] = ["-u", owner]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 10
    while True:  # until it accepts connections (or has died)
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                break
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            _, err = proc.communicate()
            raise RuntimeError(f"pgbouncer did not start: {err.decode(errors='replace').strip()}")
        time.sleep(0.05)
    try:
        yield {"host": "127.0.0.1", "port": str(port)}
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(work, ignore_errors=True)


def through(url: str, pooler: dict[str, str]) -> str:
    """``url`` pointed at the pooler instead of the server."""
    params = conninfo_to_dict(url)
    params.update(pooler)
    return make_conninfo(**params)


@pytest.fixture(scope="session")
def template_db(pg_admin_url: str) -> Iterator[str]:
    """A migrated database to copy; the clock may be pinned in it."""
    name = f"ledgertest_tmpl_{RUN_TAG}"
    url = create_database(pg_admin_url, name)
    migrations.upgrade(url, TEST_PREFIX)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("UPDATE ledger.meta SET value = 'true' WHERE key = 'clock_pinnable'")
    yield name
    drop_database(pg_admin_url, name)


@pytest.fixture
def db_url(pg_admin_url: str, template_db: str) -> Iterator[str]:
    """A fresh migrated database for this test."""
    name = f"ledgertest_{RUN_TAG}_{uuid.uuid4().hex[:8]}"
    url = create_database(pg_admin_url, name, template=template_db)
    migrations.secure_database(url)
    yield url
    drop_database(pg_admin_url, name)


@pytest.fixture
def db(db_url: str) -> Database:
    """The test's database, with the test role prefix."""
    return Database(db_url, role_prefix=TEST_PREFIX)


@pytest.fixture
def admin(db: Database) -> Iterator[psycopg.Connection]:
    """A superuser connection to the test's database, for looking underneath."""
    conn = db.connect_sync(None)
    yield conn
    conn.close()


class Actors:
    """Kernels acting as each role, opened on first use."""

    def __init__(self, db: Database):
        self.db = db
        self.sessions: dict[str, object] = {}

    async def __call__(self, actor: str) -> Kernel:
        if actor not in self.sessions:
            self.sessions[actor] = await self.db.session(actor, max_size=10).open()
        return Kernel(self.sessions[actor])  # type: ignore[arg-type]

    async def reads(self, actor: str = "reader") -> Reads:
        """Reads acting as ``actor`` (the reader unless said)."""
        return Reads((await self(actor)).executor)

    def session(self, actor: str):  # type: ignore[no-untyped-def]
        return self.sessions[actor]

    async def close(self) -> None:
        for session in self.sessions.values():
            await session.close()  # type: ignore[attr-defined]


@pytest.fixture
async def actors(db: Database) -> AsyncIterator[Actors]:
    """``await actors("worker")`` -> a Kernel acting as the worker role."""
    a = Actors(db)
    yield a
    await a.close()


TEST_CLASS = "test"


@pytest.fixture
async def test_class(actors: Actors) -> str:
    """A registered class with no backoff (a failed campaign is ready at once)."""
    op = await actors("operator")
    await op.register_class(TEST_CLASS, max_attempts=3, lease_seconds=30, backoff_base_s=0,
                            backoff_jitter=0)
    return TEST_CLASS


@pytest.fixture(autouse=True)
def _structlog_restored() -> Iterator[None]:
    """What a test configures in structlog ends with it: the demo sets the
    level to error, after which another test's ``capture_logs`` saw no warning."""
    import structlog

    saved = structlog.get_config()
    yield
    structlog.configure(**saved)
