"""Connections as a role, kernel function calls, read queries, error mapping
and retries: the core of the database layer, through which every runtime
call goes (psycopg itself is imported elsewhere too: the rest of ledger.db,
conninfo parsing in settings, the demo, ``ledger migrate`` and the drills).

Every runtime connection acts as exactly one Ledger role. With a per-role login
configured (``LEDGER_WORKER_DATABASE_URL`` ...) it connects with that login;
otherwise it connects with the administrator URL. Either way it acts as
``<prefix><actor>``, so PostgreSQL checks every statement against that role's
privileges -- the application can never do more than the role.

How depends on the connection (``Database.pooled``, else detected on each new
one). A direct connection is one server session: it takes on the role once
(``SET ROLE``). Through a transaction pooler each transaction may run on
another server connection, and session state set by one client leaks to the
next (README "Behind a connection pooler"): there every transaction first takes on its role and limits for
its own length (``SET LOCAL``, pipelined with the call: one round trip), and no
statement is prepared on the server.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from datetime import datetime
from functools import lru_cache
from typing import Any, Protocol, TypeVar

import psycopg
import psycopg.waiting
import psycopg_pool
import psycopg_pool.base
import psycopg_pool.pool_async
from psycopg import sql
from psycopg.adapt import Dumper
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, stop_before_delay

from ledger import errors
from ledger.backoff import backoff
from ledger.db import stored
from ledger.db.named_queries import Query
from ledger.logs import get_logger
from ledger.release import RELEASE, SCHEMA
from ledger.settings import Settings, get_settings

Row = dict[str, Any]
T = TypeVar("T")

#: How long a Session gathers post-commit hints before sending them together.
#: A recorded attempt's verifier may wake this much later (an attempt takes
#: seconds); each window's flush is a notifying transaction of its own, and
#: at 5 ms a worker recording every 1.5 ms paid one per ~2.4 cycles, ~0.1 ms
#: of server and as much of client CPU per cycle (measured interleaved).
HINT_WINDOW_S = 0.02
#: The first wait before retrying; each later one doubles, up to RETRY_CAP_S.
RETRY_BASE_S = 0.05
RETRY_CAP_S = 1.0

#: A call's whole budget, retries included, unless the caller gives its own.
CALL_TIMEOUT_S = 30.0
#: How long one try may wait for its reply before the connection is dropped.
TRY_TIMEOUT_S = 10.0
#: A pooled connection idle for longer than this is checked before it is used.
CHECK_IDLE_S = 1.0
CHECK_TIMEOUT_S = 3.0

#: libpq parameters every connection gets unless its URL sets them (README "When the
#: database restarts, or the network goes quiet"): a bounded connect, keepalives on an idle
#: connection, and TCP_USER_TIMEOUT so unacknowledged data fails the
#: connection in seconds rather than after the kernel's retransmission limit.
#: (Both only help where the path really drops packets; a path that ACKs but
#: never answers is caught by each call's own deadline, below.)
CONNECT_DEFAULTS: dict[str, str] = {
    "connect_timeout": "5",
    "keepalives": "1",
    "keepalives_idle": "10",
    "keepalives_interval": "3",
    "keepalives_count": "3",
    "tcp_user_timeout": "15000",
}

#: Server-side limits each runtime connection sets for itself: a statement
#: nobody waits for any more, or a transaction whose client vanished, must not
#: hold locks until the server's own keepalives notice (hours by default).
SESSION_LIMITS: dict[str, tuple[str, str]] = {
    # actor: (statement_timeout, idle_in_transaction_session_timeout)
    "reader": ("120s", "60s"),
    "operator": ("300s", "60s"),
}
DEFAULT_SESSION_LIMITS = ("30s", "60s")
# roles.sql sets the same limits on the roles (ALTER ROLE ... SET) for logins
# made by `ledger logins create`; tests/test_pooler.py keeps the two equal.

_admin_warned: set[str] = set()

#: Every session (direct) or transaction (pooled) first says which release
#: and schema this code is, and the database refuses code it cannot serve
#: (compatibility.sql; ``errors.SchemaMismatch``) before anything else runs.
GREETING = sql.SQL("ledger_api.hello({}, {})").format(sql.Literal(RELEASE), sql.Literal(SCHEMA))


def with_connect_defaults(url: str) -> str:
    """``url`` (a URL or conninfo string) with ``CONNECT_DEFAULTS`` added where it
    says nothing. What the URL sets wins."""
    params = conninfo_to_dict(url)
    for key, value in CONNECT_DEFAULTS.items():
        params.setdefault(key, value)
    return make_conninfo("", **params)


class Executor(Protocol):
    """Something that can call kernel functions and run read queries."""

    async def call(self, function: str, args: Mapping[str, Any], /, *,
                   idempotent: bool = False, timeout_s: float | None = None) -> list[Row]: ...

    async def fetch(self, query: Query, /, **params: Any) -> list[Row]: ...

    async def hint(self, hints: Sequence[tuple[str, str]], /) -> None: ...


#: The post-commit hints (``Session.flush_hints``) as one prepared statement in
#: a transaction of its own that needs no flush at commit: the same bytes
#: whatever the hints (they are its parameters), so the server plans it once
#: per connection where a statement of literals was parsed and planned each
#: time (bench/cost: 1.2 M client instructions per flush, 0.4 flushes a cycle).
_POST_COMMIT_HINTS = (
    b"SELECT count(pg_catalog.pg_notify(h.channel, h.payload)) AS sent"
    b" FROM pg_catalog.set_config('synchronous_commit', 'off', true) AS s,"
    b" unnest(%(channels)s::text[], %(payloads)s::text[]) AS h(channel, payload)")


def _hint_statement(hints: Sequence[tuple[str, str]]) -> sql.Composed:
    return sql.SQL("SELECT {}").format(sql.SQL(", ").join(
        sql.SQL("pg_notify({}, {})").format(sql.Literal(channel), sql.Literal(payload))
        for channel, payload in hints))


def _retry_wait(state: RetryCallState) -> float:
    # One try failed before the retry loop began, hence the + 1.
    return backoff(state.attempt_number + 1, base_s=RETRY_BASE_S, cap_s=RETRY_CAP_S)


def _retryable(exc: BaseException, idempotent: bool) -> bool:
    """Whether a failed try may be made again: the statement certainly did not
    take effect (a transient SQLSTATE, or nothing was sent), or it may have
    but the call is idempotent (retrying it returns the first result)."""
    if isinstance(exc, errors.OutcomeUnknown):
        return idempotent
    if isinstance(exc, (errors.LoginRefused, errors.DatabaseMissing, errors.NotMigrated)):
        return False  # someone has to act: a login, a database, a migration
    if isinstance(exc, errors.Unavailable):
        # not sent, or refused before running (a standby, a starting server);
        # a missing database or schema is no reason to wait
        return exc.sqlstate not in ("3D000", "3F000", "42883", "42P01")
    return isinstance(exc, errors.LedgerError) and exc.sqlstate in errors.TRANSIENT_SQLSTATES


class _Integer(int):
    """An int sent as an untyped literal, so the kernel function's argument
    decides its type: a value out of an ``integer`` argument's range is then
    refused by the server as out of range (22003: ``InvalidInput``), instead of
    psycopg sending a ``bigint`` that no function accepts (42883)."""


class _IntegerDumper(Dumper):
    oid = 0  # unknown: typed by the function's signature

    def dump(self, obj: int) -> bytes:
        return str(int(obj)).encode()


psycopg.adapters.register_dumper(_Integer, _IntegerDumper)
# Whatever a row holds reads back as something renderable (ledger.stored).
stored.install()


class _TextArray(str):
    """A list of strings sent as one array literal, untyped like ``_Integer``
    (the argument's declared type reads it): psycopg's list dumper costs
    ~20 us per list in Python, against a string's C dumper (bench/cost)."""


class _TextArrayDumper(Dumper):
    oid = 0

    def dump(self, obj: str) -> bytes:
        return obj.encode()


psycopg.adapters.register_dumper(_TextArray, _TextArrayDumper)


def _text_array(values: Sequence[Any]) -> _TextArray | None:
    """``values`` as an array literal, or None if some element is not a
    string or NULL, or holds a NUL (psycopg's own dumping refuses it, with
    its own message)."""
    out = []
    for v in values:
        if v is None:
            out.append("NULL")
        elif type(v) is str and "\x00" not in v:
            out.append('"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"')
        else:
            return None
    return _TextArray("{" + ",".join(out) + "}")


class _PromptReconnect(psycopg_pool.base.AttemptWithBackoff):
    """psycopg_pool's reconnection schedule, capped at 1 s between tries.

    The pool replaces a broken connection in the background, waiting 1 s,
    then 2, 4, 8 ... between failed tries; after a restart that outlasted a
    few tries, a pool kept its callers waiting for seconds while the server
    was back. Capped, every pool is back within a second of its server."""

    INITIAL_DELAY = 0.25
    MAX_DELAY = 1.0

    def update_delay(self, now: float) -> None:
        super().update_delay(now)
        self.delay = min(self.delay, self.MAX_DELAY)


# The pool module names its schedule once; give it ours (the one change of
# psycopg_pool's behaviour Ledger makes, tested by tests/test_restart.py).
if hasattr(psycopg_pool.pool_async, "AttemptWithBackoff"):
    psycopg_pool.pool_async.AttemptWithBackoff = _PromptReconnect


def _argument(value: Any) -> Any:
    """A kernel function's argument: integers and lists of strings untyped
    (see ``_Integer``, ``_TextArray``), the rest as ``_adapt``."""
    if isinstance(value, int) and not isinstance(value, bool):
        return _Integer(value)
    if type(value) is list and (literal := _text_array(value)) is not None:
        return literal
    return _adapt(value)


def _adapt(value: Any) -> Any:
    """Python values as psycopg parameters: dicts and lists of dicts are jsonb."""
    if isinstance(value, dict):
        return Jsonb(value)
    if isinstance(value, (list, tuple)) and any(isinstance(v, dict) for v in value):
        return Jsonb(list(value))
    if isinstance(value, tuple):
        return list(value)
    return value


#: libpq's words when ``target_session_attrs`` rejected every server it reached
#: for being read-only (``read-write``, ``primary``).
_LIBPQ_READ_ONLY = ("session is read-only", "server is in hot standby mode")


def _refuse_standby(conn: psycopg.AsyncConnection[Any] | psycopg.Connection[Any]) -> None:
    """``ReadOnly`` when the server just connected to reports itself a hot
    standby (PostgreSQL 14+ sends ``in_hot_standby`` at connect; a pooler in
    between may not, and then the first write says so with SQLSTATE 25006)."""
    if conn.info.parameter_status("in_hot_standby") == "on":
        raise errors.ReadOnly(f"the server at {conn.info.host}:{conn.info.port} is a standby "
                              "(in recovery); waiting for a primary")


def _translate(exc: psycopg.Error, *, sent: bool = True) -> errors.LedgerError:
    """The Ledger error for a driver error. ``sent``: whether a statement had
    been sent on the connection when it failed (a lost connection is then an
    unknown outcome, not merely an unreachable server)."""
    if exc.sqlstate is None:
        if isinstance(exc, psycopg.DataError):
            # Raised by the driver before anything reaches the server (e.g. a
            # NUL character in a text parameter): the caller's input is unusable.
            return errors.InvalidInput(f"invalid input: {_first_line(exc)}")
        if not sent and isinstance(exc, psycopg.OperationalError) and any(
                phrase in str(exc) for phrase in _LIBPQ_READ_ONLY):
            # target_session_attrs=read-write found only standbys: libpq says so
            # in words, with no SQLSTATE (the one message Ledger reads)
            return errors.ReadOnly(f"no writable server: {_first_line(exc)}")
        if isinstance(exc, (psycopg.OperationalError, psycopg.InterfaceError)):
            # The connection broke without the server saying why (killed,
            # restarted, a dropped path): a reply may have been lost.
            cls = errors.OutcomeUnknown if sent else errors.Unavailable
            what = "the connection was lost during the call" if sent else "cannot connect to the database"
            return cls(f"{what}: {_first_line(exc)}")
    diag = exc.diag
    message = diag.message_primary or str(exc).strip() or type(exc).__name__
    return errors.from_sqlstate(exc.sqlstate, message, diag.message_detail, sent=sent,
                                hint=diag.message_hint)


def _first_value(row: Any) -> Any:
    return next(iter(row.values())) if isinstance(row, dict) else row[0]


def _first_line(exc: BaseException) -> str:
    lines = [line for line in str(exc).splitlines() if line.strip()]
    return lines[-1].strip() if lines else type(exc).__name__


def abort(conn: psycopg.AsyncConnection[Any]) -> None:
    """Make a connection fail at once, whatever it is waiting for.

    Shutting the socket down (through a duplicate of its descriptor, so the
    driver's own descriptor stays valid) ends a read that would otherwise wait
    for a reply that a silent path never delivers; the driver then sees the
    connection closed and the pool discards it. Cancelling the task instead
    would make psycopg send a cancel request over the same silent path and
    wait up to 10 s for it."""
    with contextlib.suppress(Exception):
        fd = conn.pgconn.socket
        dup = socket.socket(fileno=os.dup(fd))
        try:
            dup.shutdown(socket.SHUT_RDWR)
        finally:
            dup.close()


class _Connection(psycopg.AsyncConnection[Row]):
    """Ledger's connections: a wait that is cancelled aborts the connection
    (``abort``) instead of sending a cancel request over the same, perhaps
    silent, path and waiting up to 10 s for it (psycopg's own way). Then
    ``bounded`` can run the work in its caller's task: no task, no extra
    turns of the event loop (bench/cost: 114 K client instructions per call
    with a task of its own, 28 K without)."""

    async def wait(self, gen: Any, interval: float = 0.1, timeout: float | None = None) -> Any:
        try:
            if timeout is None:
                return await psycopg.waiting.wait_async(gen, self.pgconn.socket, interval=interval)
            return await psycopg.waiting.wait_async(gen, self.pgconn.socket, interval=interval,
                                                    timeout=timeout)
        except asyncio.CancelledError:
            abort(self)
            raise


async def bounded(conn: psycopg.AsyncConnection[Any], work: Awaitable[T], timeout_s: float) -> T:
    """Await ``work`` (which uses ``conn``) for at most ``timeout_s``. Past it,
    or if the caller is cancelled meanwhile, the connection is aborted (see
    ``abort``) and ``OutcomeUnknown`` raised: the statement may have run.

    The deadline is a timer that aborts the connection, which ends the work's
    read at once. On Ledger's own connections (``_Connection``) the work runs
    in the caller's task; on any other it runs as a task of its own, so that
    cancelling the caller never reaches psycopg's cancel request."""
    loop = asyncio.get_running_loop()
    if isinstance(conn, _Connection):
        expired = False

        def expire_now() -> None:
            nonlocal expired
            expired = True
            abort(conn)

        deadline = loop.call_later(max(timeout_s, 0.0), expire_now)
        try:
            return await work
        except asyncio.CancelledError:
            abort(conn)  # (also when the cancel found the work outside psycopg's wait)
            raise
        except Exception as exc:
            if expired:
                raise errors.OutcomeUnknown(_no_reply(timeout_s)) from exc
            raise
        finally:
            deadline.cancel()
    task = asyncio.ensure_future(work)
    expired = False

    def expire() -> None:
        nonlocal expired
        if task.done():
            return  # answered in time; its caller has not resumed yet
        expired = True
        abort(conn)
        # the aborted read ends at once; the bound is only a guard
        loop.call_later(2.0, task.cancel)

    timer = loop.call_later(max(timeout_s, 0.0), expire)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if expired and not (current is not None and current.cancelling()):
            raise errors.OutcomeUnknown(_no_reply(timeout_s)) from None  # the guard cancelled the work
        abort(conn)
        await _settle(task)
        raise
    except Exception as exc:
        if expired:
            raise errors.OutcomeUnknown(_no_reply(timeout_s)) from exc
        raise
    finally:
        timer.cancel()


def _no_reply(timeout_s: float) -> str:
    return (f"no reply within {timeout_s:.1f}s: the connection was dropped "
            "(the call may or may not have taken effect)")


async def _settle(task: asyncio.Future[Any]) -> None:
    # After abort() the driver's read ends at once; the bound is only a guard.
    with contextlib.suppress(BaseException):
        await asyncio.wait_for(asyncio.shield(task), timeout=2.0)
    if not task.done():
        task.cancel()
        with contextlib.suppress(BaseException):
            await task


@lru_cache(maxsize=256)
def _call_statement(function: str, names: tuple[str, ...]) -> bytes:
    # Named notation (p_x => value) so argument order never matters and a
    # missing optional argument takes the SQL default. Rendered once per
    # signature: the same bytes each time also let psycopg prepare it.
    return sql.SQL("SELECT * FROM ledger_api.{}({})").format(
        sql.Identifier(function),
        sql.SQL(", ").join(
            sql.SQL("{} => {}").format(sql.Identifier(f"p_{name}"), sql.Placeholder(name))
            for name in names
        ),
    ).as_bytes(None)


def _not_a_second_report(record: logging.LogRecord) -> bool:
    """Drop psycopg's "error ignored terminating <pipeline>": it reports, as a
    warning, the pipeline's own echo of a statement error that is raised (and
    classified) anyway; one failed call would otherwise say it twice."""
    return not str(record.msg).startswith("error ignored terminating")


logging.getLogger("psycopg").addFilter(_not_a_second_report)


#: Whether psycopg's pipeline can end a transaction without waiting for its
#: results (psycopg 3.1-3.3 do it for its own Syncs, ``Pipeline._enqueue_sync``;
#: no public method does it without a round trip). Without it, post-commit
#: hints are sent on their own (``Session.flush_hints``).
_CAN_SYNC_IN_PIPELINE = hasattr(psycopg.AsyncPipeline, "_enqueue_sync")
_SUCCEEDED = (psycopg.pq.ExecStatus.TUPLES_OK, psycopg.pq.ExecStatus.COMMAND_OK)


def _hint_params(hints: Sequence[tuple[str, str]]) -> dict[str, Any]:
    channels, payloads = [c for c, _ in hints], [p for _, p in hints]
    return {"channels": _text_array(channels) or channels, "payloads": _text_array(payloads) or payloads}


async def _in_transaction(conn: psycopg.AsyncConnection[Row], prelude: bytes | None,
                          statement: bytes | str, params: Mapping[str, Any],
                          hints: Sequence[tuple[str, str]] = ()) -> list[Row]:
    """Run ``statement`` in a transaction of its own that first runs ``prelude``
    (the role and limits, see ``Database.prelude``), in one round trip.

    ``hints`` (gathered after earlier commits, ``Session.hint``) ride in the
    same round trip, in a transaction of their own after the statement's: a
    notifying transaction serialises its commit, so the statement's own must
    not notify. The statement's result is its own: hints that fail are
    dropped (a hint lost costs a waiter one poll tick)."""
    if hints and not _CAN_SYNC_IN_PIPELINE:
        hints = ()
    cur: psycopg.AsyncCursor[Row] | None = None
    try:
        if prelude is None and not hints:  # already inside a transaction, or a direct connection
            cur = await conn.execute(statement, params)
        elif hints:
            try:
                async with conn.pipeline() as pipeline:
                    if prelude is not None:
                        await conn.execute(prelude, prepare=False)
                    cur = await conn.execute(statement, params)
                    pipeline._enqueue_sync()  # the statement's transaction ends here, unanswered yet
                    if prelude is not None:
                        await conn.execute(prelude, prepare=False)
                    await conn.cursor().execute(_POST_COMMIT_HINTS, _hint_params(hints))
            except psycopg.errors.InvalidSqlStatementName as exc:
                await conn.close()  # as below: this connection's prepared statements are unknown
                raise errors.Unavailable(f"a prepared statement was lost: {_first_line(exc)}") from exc
            except psycopg.Error:
                # psycopg raises the first error of the pipeline: the
                # statement's own, unless the statement succeeded
                if cur is None or cur.pgresult is None or cur.pgresult.status not in _SUCCEEDED:
                    raise
        else:
            # One pipeline, one Sync: the server runs everything before the
            # Sync as one implicit transaction, so the prelude's SET LOCAL
            # holds for the statement and ends with it, in one round trip (an
            # explicit BEGIN/COMMIT cost two more statements per call). Only
            # the statement itself may be prepared: psycopg counts a statement
            # of an aborted pipeline as prepared although the server skipped
            # its Parse (a COMMIT behind a failed call did, and the next call
            # failed: "prepared statement ... does not exist").
            assert prelude is not None
            try:
                async with conn.pipeline():
                    await conn.execute(prelude, prepare=False)
                    cur = await conn.execute(statement, params)
            except psycopg.errors.InvalidSqlStatementName as exc:
                # the same bookkeeping, had the prelude failed: nothing ran,
                # and this connection's list of prepared statements is wrong
                await conn.close()
                raise errors.Unavailable(f"a prepared statement was lost: {_first_line(exc)}") from exc
        # (not cur.description: it builds a Column object per column)
        assert cur is not None
        result = cur.pgresult
        return await cur.fetchall() if result is not None and result.nfields else []
    except psycopg.Error as exc:
        raise _translate(exc) from exc


async def _run_call(conn: psycopg.AsyncConnection[Row], function: str, args: Mapping[str, Any],
                    prelude: bytes | None = None, hints: Sequence[tuple[str, str]] = ()) -> list[Row]:
    params = {name: _argument(value) for name, value in args.items()}
    return await _in_transaction(conn, prelude, _call_statement(function, tuple(params)), params, hints)


async def _run_query(conn: psycopg.AsyncConnection[Row], query: Query, params: Mapping[str, Any],
                     prelude: bytes | None = None, hints: Sequence[tuple[str, str]] = ()) -> list[Row]:
    values = {**query.defaults, **{k: _adapt(v) for k, v in params.items()}}
    return await _in_transaction(conn, prelude, query.text, values, hints)


class Transaction:
    """One open transaction as one role; ``call``/``fetch`` run inside it."""

    def __init__(self, conn: psycopg.AsyncConnection[Row]):
        self.conn = conn

    async def call(self, function: str, args: Mapping[str, Any], /, *,
                   idempotent: bool = False, timeout_s: float | None = None) -> list[Row]:
        """Call ``ledger_api.<function>`` with named arguments, inside this
        transaction (no retries: a failure aborts the transaction)."""
        return await bounded(self.conn, _run_call(self.conn, function, args),
                             timeout_s or CALL_TIMEOUT_S)

    async def fetch(self, query: Query, /, **params: Any) -> list[Row]:
        """Run a read query inside this transaction."""
        return await bounded(self.conn, _run_query(self.conn, query, params), CALL_TIMEOUT_S)

    async def hint(self, hints: Sequence[tuple[str, str]], /) -> None:
        """NOTIFY ``(channel, payload)`` pairs when this transaction commits."""
        if hints:
            await self.conn.execute(_hint_statement(hints))


class ConnectionSource(Protocol):
    """Where a ``Session`` gets its connections: an ``AsyncConnectionPool``
    (always, in production), or whatever ``Database.pool_factory`` builds
    instead with the same arguments -- the test suite's rolled-back tier lends
    its one connection, each loan a savepoint (tests/conftest.py), so that the
    calls it makes are this module's, retries and role-taking included."""

    async def open(self, wait: bool = ..., timeout: float = ...) -> None: ...

    async def close(self, timeout: float = ...) -> None: ...

    async def getconn(self, timeout: float | None = ...) -> psycopg.AsyncConnection[Row]: ...

    async def putconn(self, conn: psycopg.AsyncConnection[Row]) -> None: ...

    def connection(self, timeout: float | None = ...
                   ) -> contextlib.AbstractAsyncContextManager[psycopg.AsyncConnection[Row]]: ...


class Session:
    """A pool of connections acting as one role. Each call is its own
    transaction with a deadline, retried with jittered backoff while its
    budget lasts -- the one place Ledger retries database work:

    * a transient SQLSTATE (serialization failure, deadlock, lock not
      available) or a call that never left (``Unavailable``): always;
    * a call whose reply was lost (``OutcomeUnknown``: the connection
      dropped, or the try's deadline passed and the connection was
      aborted): only when the call is idempotent, on a fresh connection.

    A pooled connection idle for a while is checked before it is handed out,
    so one killed by a server restart costs a reconnect, not a failed call."""

    def __init__(self, database: Database, actor: str | None, *, min_size: int = 1, max_size: int = 4):
        self.database = database
        self.actor = actor
        self._prelude = database.prelude(actor)
        pool: Callable[..., ConnectionSource] = database.pool_factory or AsyncConnectionPool
        self._pool = pool(
            with_connect_defaults(database.url_for(actor)),
            min_size=min_size,
            max_size=max_size,
            kwargs={
                "autocommit": True,
                "row_factory": dict_row,
                "application_name": f"ledger:{actor or 'admin'}",
            },
            configure=self._configure,
            check=self._check,
            open=False,
            connection_class=_Connection,
            name=f"ledger-{actor or 'admin'}",
        )
        self._used: weakref.WeakKeyDictionary[psycopg.AsyncConnection[Row], float] = \
            weakref.WeakKeyDictionary()
        #: pooled connections: each transaction takes on the role itself
        self._per_transaction: weakref.WeakSet[psycopg.AsyncConnection[Row]] = weakref.WeakSet()
        self._hints: dict[tuple[str, str], None] = {}  # ordered, without repeats
        self._hinter: asyncio.Task[None] | None = None
        self._hint_timer: asyncio.TimerHandle | None = None
        self._hints_due = False  # gathered for their window: the next call carries them
        self._in_flight = 0  # calls under way (each try)
        self.log = get_logger("database", actor=actor or "admin")

    async def _configure(self, conn: psycopg.AsyncConnection[Row]) -> None:
        # Session state only on a direct connection (see the module's docstring).
        if await self.database.configure(conn):
            self._per_transaction.add(conn)
        else:
            await conn.execute(self.database.session_setup(self.actor))

    def _prelude_for(self, conn: psycopg.AsyncConnection[Row]) -> bytes | None:
        return self._prelude if conn in self._per_transaction else None

    async def _check(self, conn: psycopg.AsyncConnection[Row]) -> None:
        # A connection used a moment ago is very likely fine; one that idled
        # may have been killed by a restart or forgotten by a middlebox.
        if time.monotonic() - self._used.get(conn, 0.0) < CHECK_IDLE_S:
            return
        try:
            await bounded(conn, conn.execute(b""), CHECK_TIMEOUT_S)
        except errors.LedgerError as exc:
            raise psycopg.OperationalError(exc.message) from exc

    async def open(self, *, wait: bool = True, timeout: float = 30.0,
                   wait_for_database_s: float | None = None) -> Session:
        """Open the pool (waiting for its first connection by default).

        One direct connection first: a wrong URL or a missing database fails at
        once with the server's own message, instead of the pool retrying. An
        unreachable or starting server is waited for ``wait_for_database_s``
        (default: the database's ``wait_for_database_s``), with a log line per
        try, before ``Unavailable``."""
        self.database.warn_if_administrator(self.actor)
        await self.database.wait_until_reachable(
            self.actor, self.database.wait_for_database_s if wait_for_database_s is None
            else wait_for_database_s)
        try:
            await self._pool.open(wait=wait, timeout=timeout)
        except psycopg.Error as exc:
            raise _translate(exc, sent=False) from exc
        except Exception as exc:  # psycopg_pool.PoolTimeout carries no SQLSTATE
            raise errors.Unavailable(f"cannot connect to the database: {exc}") from exc
        return self

    async def close(self) -> None:
        """Send pending hints; close the pool and its connections."""
        if self._hint_timer is not None:
            self._hint_timer.cancel()
            self._hint_timer = None
        if self._hinter is not None and not self._hinter.done():
            self._hinter.cancel()
        await self.flush_hints()
        await self._pool.close()

    async def __aenter__(self) -> Session:
        return await self.open()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def call(self, function: str, args: Mapping[str, Any], /, *,
                   idempotent: bool = False, timeout_s: float | None = None) -> list[Row]:
        """Call ``ledger_api.<function>`` with named arguments in its own
        transaction, within ``timeout_s`` (retries included)."""
        return await self._retried(
            lambda conn: _run_call(conn, function, args, self._prelude_for(conn), self._take_hints()),
                                   idempotent=idempotent, timeout_s=timeout_s)

    async def fetch(self, query: Query, /, **params: Any) -> list[Row]:
        """Run a read query (reads are always safe to retry)."""
        return await self._retried(
            lambda conn: _run_query(conn, query, params, self._prelude_for(conn), self._take_hints()),
                                   idempotent=True, timeout_s=None)

    def _take_hints(self) -> list[tuple[str, str]]:
        """The hints gathered, once their window is over, for the call about
        to be sent to carry."""
        if not self._hints_due or not _CAN_SYNC_IN_PIPELINE:
            return []
        hints, self._hints, self._hints_due = list(self._hints), {}, False
        return hints

    async def _retried(self, work: Callable[[psycopg.AsyncConnection[Row]], Awaitable[list[Row]]], *,
                       idempotent: bool, timeout_s: float | None) -> list[Row]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (timeout_s if timeout_s is not None else CALL_TIMEOUT_S)
        # The first try runs outside tenacity: building its retry state on
        # every call cost more than the call's own Python work (bench/cycle).
        try:
            return await self._try(work, min(deadline - loop.time(), TRY_TIMEOUT_S))
        except errors.LedgerError as exc:
            if not _retryable(exc, idempotent) or deadline - loop.time() <= RETRY_BASE_S:
                raise
            self.log.info("retrying a database call", error=exc.message,
                          error_type=type(exc).__name__)
        # Then jittered exponential waits (up to RETRY_CAP_S), tries on fresh
        # connections, until the call's budget is spent.
        retrying = AsyncRetrying(
            retry=retry_if_exception(lambda exc: _retryable(exc, idempotent)),
            wait=_retry_wait,
            stop=stop_before_delay(max(deadline - loop.time(), 0.0)),
            reraise=True,
        )
        async for attempt in retrying:
            with attempt:
                return await self._try(work, min(deadline - loop.time(), TRY_TIMEOUT_S))
        raise AssertionError("unreachable")  # pragma: no cover

    async def _try(self, work: Callable[[psycopg.AsyncConnection[Row]], Awaitable[list[Row]]],
                   timeout_s: float) -> list[Row]:
        loop = asyncio.get_running_loop()
        started = loop.time()
        self._in_flight += 1
        try:
            return await self._try_on_a_connection(work, timeout_s, started)
        finally:
            self._in_flight -= 1

    async def _try_on_a_connection(self, work: Callable[[psycopg.AsyncConnection[Row]], Awaitable[list[Row]]],
                                   timeout_s: float, started: float) -> list[Row]:
        loop = asyncio.get_running_loop()
        try:
            conn = await self._pool.getconn(timeout=max(timeout_s, 0.001))
        except psycopg_pool.PoolTimeout as exc:
            raise errors.Unavailable(f"no database connection within {timeout_s:.1f}s") from exc
        except psycopg_pool.PoolClosed as exc:
            raise errors.Unavailable("the connection pool is closed") from exc
        try:
            result = await bounded(conn, work(conn), timeout_s - (loop.time() - started))
            self._used[conn] = time.monotonic()
            return result
        except errors.OutcomeUnknown:
            # whatever the connection was doing is over: never hand it out again
            with contextlib.suppress(Exception):
                await conn.close()
            raise
        except errors.ReadOnly:
            # a standby: a new connection may find the (new) primary
            with contextlib.suppress(Exception):
                await conn.close()
            raise
        finally:
            await self._pool.putconn(conn)

    async def hint(self, hints: Sequence[tuple[str, str]], /) -> None:
        """NOTIFY ``(channel, payload)`` pairs after a committed write.

        For writes whose waiters may be many per second (a recorded attempt
        wakes verifiers and tails): PostgreSQL serialises the commits of
        notifying transactions, WAL flush included, so a NOTIFY inside the
        write capped a fleet at one write per flush (bench/cycle). Hints are
        sent in a transaction of their own that writes nothing worth a flush:
        the serialised part is microseconds. They are gathered for
        ``HINT_WINDOW_S``; then the session's next call carries them all in
        its own round trip (``_in_transaction``), or, if no call is under way,
        they are sent on their own. A hint lost to a crash in between costs a
        waiter one poll tick (README "How it works": wake-ups are hints, rows are truth)."""
        if not hints:
            return
        self._hints.update(dict.fromkeys(hints))
        if self._hint_timer is None:
            self._hint_timer = asyncio.get_running_loop().call_later(HINT_WINDOW_S, self._window_over)

    def _window_over(self) -> None:
        # The coalescing window, not a synchronisation: a busy session's next
        # call carries what was gathered (a pipeline per window, not per
        # call: bench/cost); an idle one sends it now. A call under way means
        # another is likely to follow: look again a window later, in case not.
        self._hint_timer = None
        if not self._hints:
            return
        self._hints_due = True
        if self._in_flight == 0:
            if self._hinter is None or self._hinter.done():
                self._hinter = asyncio.create_task(self.flush_hints())
        else:
            self._hint_timer = asyncio.get_running_loop().call_later(HINT_WINDOW_S, self._window_over)

    async def flush_hints(self) -> None:
        """Send the hints gathered so far now."""
        if not self._hints:
            return
        hints, self._hints, self._hints_due = list(self._hints), {}, False
        params = _hint_params(hints)

        async def send(conn: psycopg.AsyncConnection[Row]) -> list[Row]:
            return await _in_transaction(conn, self._prelude_for(conn), _POST_COMMIT_HINTS, params)

        with contextlib.suppress(errors.LedgerError, psycopg.Error):
            # a hint, not a write: the waiters' poll tick covers a lost one
            await self._try(send, CHECK_TIMEOUT_S)

    @asynccontextmanager
    async def transaction(self, *, now: datetime | None = None) -> AsyncIterator[Transaction]:
        """A transaction spanning several calls. ``now`` pins ``ledger.now()``
        for its length (only where the database allows pinning: tests)."""
        async with self._pool.connection() as conn:
            try:
                async with conn.transaction():
                    await conn.execute(self._prelude)
                    if now is not None:
                        await conn.execute(
                            "SELECT set_config('ledger.now', %s, true)", (now.isoformat(),)
                        )
                    yield Transaction(conn)
            except psycopg.Error as exc:
                raise _translate(exc) from exc


class Database:
    """One Ledger database: where it is, and how each role connects to it."""

    def __init__(
        self,
        url: str,
        *,
        role_prefix: str = "ledger_",
        role_urls: Mapping[str, str] | None = None,
        wait_for_database_s: float = 0.0,
        pooled: bool | None = None,
        listen_url: str | None = None,
        service: bool = False,
        pool_factory: Callable[..., ConnectionSource] | None = None,
    ):
        self.url = url
        self.role_prefix = role_prefix
        self.role_urls = dict(role_urls or {})
        #: how long a service starting up waits for an unreachable server
        self.wait_for_database_s = wait_for_database_s
        #: whether connections go through a transaction pooler (then nothing is
        #: prepared on the server); None: detected on each new connection
        self.pooled = pooled
        #: a direct connection for LISTEN (a pooler cannot keep one); None:
        #: the listening actor's own login
        self.listen_url = listen_url
        #: what a Session builds its pool with (AsyncConnectionPool's
        #: arguments); None: an AsyncConnectionPool (see ConnectionSource)
        self.pool_factory = pool_factory
        #: a long-running service: it logs, once, that it acts through the
        #: administrator's login or through a pooler; one-shot commands (whose
        #: stdout may be JSON) and tests stay quiet
        self.service = service
        self._warned_pooled = False

    @classmethod
    def from_settings(cls, settings: Settings | None = None, *, wait_for_database_s: float = 0.0,
                      service: bool = False) -> Database:
        """The database the settings name, starting the embedded server if none is
        named; ``wait_for_database_s`` and ``service`` as for the constructor."""
        settings = settings or get_settings()
        url = settings.database_url
        if not url:
            from ledger.db.embedded import default_url

            url = default_url(settings.data_dir)
        return cls(url, role_prefix=settings.role_prefix, role_urls=settings.role_urls(),
                   pooled=settings.pooled, listen_url=settings.listen_database_url,
                   wait_for_database_s=wait_for_database_s, service=service)

    def role(self, actor: str) -> str:
        """The database role that plays ``actor``."""
        return f"{self.role_prefix}{actor}"

    def url_for(self, actor: str | None) -> str:
        """The login an actor connects with (its own, or the administrator's)."""
        if actor is None:
            return self.url
        return self.role_urls.get(actor, self.url)

    def listen_url_for(self, actor: str | None) -> str:
        """Where the hub of ``actor`` LISTENs: ``listen_url``, else its login."""
        return self.listen_url or self.url_for(actor)

    def prelude(self, actor: str | None) -> bytes:
        """What every transaction of ``actor`` runs first: its role and its
        server-side limits (``SESSION_LIMITS``), for that transaction only
        (``set_config(..., true)`` is ``SET LOCAL``), and the greeting
        (``GREETING``), in one statement."""
        statement, idle = SESSION_LIMITS.get(actor or "", DEFAULT_SESSION_LIMITS)
        settings = [("statement_timeout", statement), ("idle_in_transaction_session_timeout", idle)]
        if actor is not None:
            settings.insert(0, ("role", self.role(actor)))
        # the greeting last: after the role, which it runs as
        return sql.SQL("SELECT {}, {}").format(sql.SQL(", ").join(
            sql.SQL("pg_catalog.set_config({}, {}, true)").format(sql.Literal(name), sql.Literal(value))
            for name, value in settings), GREETING).as_bytes(None)

    async def configure(self, conn: psycopg.AsyncConnection[Any]) -> bool:
        """Whether ``conn`` is pooled; if it is, turn off server-side prepared
        statements: the next transaction may run on a server connection that
        never saw them (or saw another client's of the same name)."""
        pooled = await self.is_pooled(conn)
        if pooled:
            conn.prepare_threshold = None
        return pooled

    async def is_pooled(self, conn: psycopg.AsyncConnection[Any]) -> bool:
        """Whether ``conn`` goes through a pooler: ``pooled`` if set, else
        whether the server process running its statements is another than
        the one the connection was given at start-up (a pooler hands out its
        own process id and cancel key)."""
        if self.pooled is not None:
            return self.pooled
        cur = await bounded(conn, conn.execute("SELECT pg_catalog.pg_backend_pid() AS pid"),
                            CHECK_TIMEOUT_S)
        row = await cur.fetchone()
        pooled = row is not None and _first_value(row) != conn.info.backend_pid
        if pooled and self.service and not self._warned_pooled:
            self._warned_pooled = True
            get_logger("database").info(
                "connected through a pooler: no server-side prepared statements "
                "(set LEDGER_POOLED to skip the check)")
        return pooled

    def warn_if_administrator(self, actor: str | None) -> None:
        """Log once per process and role when ``actor`` acts through the
        administrator's login (no ``LEDGER_<ROLE>_DATABASE_URL``): the process
        could take on any role, the owner's included."""
        if not self.service or actor is None or actor in self.role_urls or actor in _admin_warned:
            return
        _admin_warned.add(actor)
        get_logger("database", actor=actor).warning(
            "acting through the administrator's login: this process holds administrator "
            "rights; give it a login of its own (`ledger logins create`, "
            f"LEDGER_{actor.upper()}_DATABASE_URL)")

    def set_role_statement(self, actor: str) -> sql.Composed:
        """``SET ROLE`` to the actor's role, safely quoted."""
        return sql.SQL("SET ROLE {}").format(sql.Identifier(self.role(actor)))

    def session_setup(self, actor: str | None) -> sql.Composed:
        """What a dedicated connection of ``actor`` (``connect``) runs once: its
        role, its server-side limits (``SESSION_LIMITS``) and the greeting
        (``GREETING``), in one round trip.
        Session state: for direct connections only, never through a pooler."""
        statement, idle = SESSION_LIMITS.get(actor or "", DEFAULT_SESSION_LIMITS)
        parts = [sql.SQL("SET statement_timeout = {}").format(sql.Literal(statement)),
                 sql.SQL("SET idle_in_transaction_session_timeout = {}").format(sql.Literal(idle))]
        if actor is not None:
            parts.insert(0, self.set_role_statement(actor))
        parts.append(sql.SQL("SELECT {}").format(GREETING))
        return sql.SQL("; ").join(parts)

    def session(self, actor: str | None, *, min_size: int = 1, max_size: int = 4) -> Session:
        """A (not yet opened) pool acting as ``actor``; ``None`` acts as the administrator."""
        return Session(self, actor, min_size=min_size, max_size=max_size)

    async def connect(self, actor: str | None = None, *, autocommit: bool = True,
                      url: str | None = None, setup: bool = True) -> psycopg.AsyncConnection[Row]:
        """One dedicated connection acting as ``actor`` for the whole session
        (session state: a direct connection, not one through a pooler);
        ``url`` overrides the actor's login (the hub's LISTEN URL); without
        ``setup`` nothing is set for the session (LISTEN needs no role, and a
        LISTEN URL that wrongly points at a pooler must not leak one)."""
        try:
            conn = await _Connection.connect(
                with_connect_defaults(url or self.url_for(actor)),
                autocommit=autocommit,
                row_factory=dict_row,
                application_name=f"ledger:{actor or 'admin'}",
            )
        except psycopg.Error as exc:
            raise _translate(exc, sent=False) from exc
        if not setup:
            conn.prepare_threshold = None  # it may (wrongly) go through a pooler
            try:
                _refuse_standby(conn)  # a standby cannot LISTEN: wait for a primary, classified
            except errors.ReadOnly:
                await conn.close()
                raise
            return conn
        try:
            if not (actor == "reader" and actor in self.role_urls):
                # reads may be served by a standby: a reader login of its own may name a replica
                _refuse_standby(conn)
            await bounded(conn, conn.execute(self.session_setup(actor)), CHECK_TIMEOUT_S)
            if not autocommit:
                await conn.commit()
        except psycopg.Error as exc:
            await conn.close()
            raise _translate(exc, sent=False) from exc
        except BaseException:
            await conn.close()
            raise
        return conn

    def connect_sync(self, actor: str | None = None, *, autocommit: bool = True) -> psycopg.Connection[Row]:
        """A blocking connection acting as ``actor`` (for scripts, tests and the CLI's admin work)."""
        try:
            conn = psycopg.connect(
                with_connect_defaults(self.url_for(actor)),
                autocommit=autocommit,
                row_factory=dict_row,
                application_name=f"ledger:{actor or 'admin'}",
            )
            if actor is not None:
                conn.execute(self.set_role_statement(actor))
            conn.execute(sql.SQL("SELECT {}").format(GREETING))
            if not autocommit:
                conn.commit()
        except psycopg.Error as exc:
            raise _translate(exc, sent=False) from exc
        return conn

    async def ping(self) -> None:
        """Raise ``Unavailable`` unless the database answers."""
        await self.probe(None)

    async def probe(self, actor: str | None) -> None:
        """Connect with ``actor``'s login and take on its role in a transaction
        (pooler-safe: nothing outlives the transaction); raise the translated
        error if that fails, ``ReadOnly`` if the server is a standby."""
        url = self.url_for(actor)
        try:
            conn = await _Connection.connect(
                with_connect_defaults(url), autocommit=True, prepare_threshold=None,
                application_name=f"ledger:{actor or 'admin'}")
        except psycopg.Error as exc:
            error = _translate(exc, sent=False)
            if type(error) is errors.Unavailable and "FATAL:" in str(exc):
                # The server answered and refused: libpq gives no SQLSTATE, so
                # ask it which refusal (a login that does not exist or may not
                # log in, a database that is not there) -- no reason to wait.
                from ledger.db.readiness import connection_problem

                login = None
                if actor is not None and actor in self.role_urls:
                    variable = f"LEDGER_{actor.upper()}_DATABASE_URL"
                    if actor == "reaper" and self.role_urls[actor] == self.role_urls.get("worker"):
                        variable = "LEDGER_WORKER_DATABASE_URL (the reaper's too)"
                    login = (f"{variable} names the {actor} role's own login: create it "
                             "(`ledger logins create`), or check its user and password")
                error = await asyncio.to_thread(connection_problem, url, exc, login=login)
            raise error from exc
        try:
            if not (actor == "reader" and actor in self.role_urls):
                _refuse_standby(conn)  # as connect(): a standby is waited for, never used

            async def check() -> None:
                async with conn.transaction():
                    await conn.execute(self.prelude(actor))
            await bounded(conn, check(), CHECK_TIMEOUT_S)
        except psycopg.Error as exc:
            raise _translate(exc, sent=False) from exc
        finally:
            await conn.close()

    async def check_logins(self, actors: Sequence[str], wait_s: float | None = None) -> None:
        """Connect once as each of ``actors`` (``wait_until_reachable``): a
        service checks every login it will use before it opens anything."""
        for actor in actors:
            await self.wait_until_reachable(
                actor, self.wait_for_database_s if wait_s is None else wait_s)

    async def wait_until_reachable(self, actor: str | None, wait_s: float) -> None:
        """Connect once as ``actor``; while the server is unreachable, starting
        or read-only, try again with jittered backoff (capped at 1 s) for up to
        ``wait_s`` seconds, logging each wait. Errors that waiting cannot mend
        (a wrong password, a missing database) are raised at once."""
        log = get_logger("database", actor=actor or "admin")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(wait_s, 0.0)
        tries = 0
        while True:
            tries += 1
            try:
                await self.probe(actor)
                if tries > 1:
                    log.info("the database is reachable", tries=tries)
                return
            except errors.Unavailable as exc:
                # capped at 1 s: a service is back within a second of its server
                delay = backoff(tries, base_s=0.25, cap_s=1.0)
                if not _retryable(exc, False) or loop.time() + delay >= deadline:
                    raise
                log.warning("waiting for the database", error=exc.message,
                            error_type=type(exc).__name__, tries=tries,
                            gives_up_in_s=round(deadline - loop.time(), 1))
                await asyncio.sleep(delay)
