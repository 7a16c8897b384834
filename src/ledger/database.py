"""The database layer: connections as a role, kernel function calls, read
queries, error mapping and retries -- the only module (with ``queries``) that
touches psycopg.

Every runtime connection acts as exactly one Ledger role. With a per-role login
configured (``LEDGER_WORKER_DATABASE_URL`` ...) it connects with that login;
otherwise it connects with the administrator URL. Either way it then runs
``SET ROLE <prefix><actor>``, so PostgreSQL checks every statement against that
role's privileges -- the application can never do more than the role.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from datetime import datetime
from functools import lru_cache
from typing import Any, Protocol

import psycopg
import psycopg_pool
from psycopg import sql
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool
from tenacity import (
    AsyncRetrying,
    retry_if_exception,
    stop_after_attempt,
    wait_random_exponential,
)

from . import errors
from .queries import Query
from .settings import Settings, get_settings

Row = dict[str, Any]

#: How long a Session gathers post-commit hints before sending them together.
HINT_WINDOW_S = 0.005
#: The first wait before retrying a transient failure; each later one doubles.
RETRY_BASE_S = 0.05


class Executor(Protocol):
    """Something that can call kernel functions and run read queries."""

    async def call(self, function: str, /, **args: Any) -> list[Row]: ...

    async def fetch(self, query: Query, /, **params: Any) -> list[Row]: ...

    async def hint(self, hints: Sequence[tuple[str, str]], /) -> None: ...


def _hint_statement(hints: Sequence[tuple[str, str]]) -> sql.Composed:
    return sql.SQL("SELECT {}").format(sql.SQL(", ").join(
        sql.SQL("pg_notify({}, {})").format(sql.Literal(channel), sql.Literal(payload))
        for channel, payload in hints))


def _is_transient(exc: BaseException) -> bool:
    if isinstance(exc, errors.LedgerError):
        return exc.sqlstate in errors.TRANSIENT_SQLSTATES
    return isinstance(exc, psycopg.OperationalError)


def _adapt(value: Any) -> Any:
    """Python values as psycopg parameters: dicts and lists of dicts are jsonb."""
    if isinstance(value, dict):
        return Jsonb(value)
    if isinstance(value, (list, tuple)) and any(isinstance(v, dict) for v in value):
        return Jsonb(list(value))
    if isinstance(value, tuple):
        return list(value)
    return value


def _translate(exc: psycopg.Error) -> errors.LedgerError:
    if exc.sqlstate is None and isinstance(exc, psycopg.DataError):
        # Raised by the driver before anything reaches the server (e.g. a NUL
        # character in a text parameter): the caller's input is unusable.
        return errors.InvalidInput(f"invalid input: {_first_line(exc)}")
    diag = exc.diag
    message = diag.message_primary or str(exc).strip() or type(exc).__name__
    return errors.from_sqlstate(exc.sqlstate, message, diag.message_detail)


def _first_line(exc: BaseException) -> str:
    lines = [line for line in str(exc).splitlines() if line.strip()]
    return lines[-1].strip() if lines else type(exc).__name__


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


async def _run_call(conn: psycopg.AsyncConnection[Row], function: str, args: Mapping[str, Any]) -> list[Row]:
    params = {name: _adapt(value) for name, value in args.items()}
    try:
        cur = await conn.execute(_call_statement(function, tuple(params)), params)
        return await cur.fetchall() if cur.description else []
    except psycopg.Error as exc:
        raise _translate(exc) from exc


async def _run_query(conn: psycopg.AsyncConnection[Row], query: Query, params: Mapping[str, Any]) -> list[Row]:
    values = {**query.defaults, **{k: _adapt(v) for k, v in params.items()}}
    try:
        cur = await conn.execute(query.text, values)
        return await cur.fetchall()
    except psycopg.Error as exc:
        raise _translate(exc) from exc


class Transaction:
    """One open transaction as one role; ``call``/``fetch`` run inside it."""

    def __init__(self, conn: psycopg.AsyncConnection[Row]):
        self.conn = conn

    async def call(self, function: str, /, **args: Any) -> list[Row]:
        """Call ``ledger_api.<function>`` with named arguments, inside this transaction."""
        return await _run_call(self.conn, function, args)

    async def fetch(self, query: Query, /, **params: Any) -> list[Row]:
        """Run a read query inside this transaction."""
        return await _run_query(self.conn, query, params)

    async def hint(self, hints: Sequence[tuple[str, str]], /) -> None:
        """NOTIFY ``(channel, payload)`` pairs when this transaction commits."""
        if hints:
            await self.conn.execute(_hint_statement(hints))


class Session:
    """A pool of connections acting as one role. Each call is its own
    transaction and is retried on transient errors (serialization failure,
    deadlock, lost connection) with jittered backoff -- the one place Ledger
    retries database work."""

    def __init__(self, database: Database, actor: str | None, *, min_size: int = 1, max_size: int = 4):
        self.database = database
        self.actor = actor
        self._pool: AsyncConnectionPool[psycopg.AsyncConnection[Row]] = AsyncConnectionPool(
            database.url_for(actor),
            min_size=min_size,
            max_size=max_size,
            kwargs={
                "autocommit": True,
                "row_factory": dict_row,
                "application_name": f"ledger:{actor or 'admin'}",
            },
            configure=self._configure,
            open=False,
            name=f"ledger-{actor or 'admin'}",
        )
        self._hints: dict[tuple[str, str], None] = {}  # ordered, without repeats
        self._hinter: asyncio.Task[None] | None = None

    async def _configure(self, conn: psycopg.AsyncConnection[Row]) -> None:
        if self.actor is not None:
            await conn.execute(self.database.set_role_statement(self.actor))

    async def open(self, *, wait: bool = True, timeout: float = 30.0) -> Session:
        """Open the pool (waiting for its first connection by default).

        One direct connection first: a wrong URL or a missing database fails at
        once with the server's own message, instead of the pool retrying."""
        probe = await self.database.connect(self.actor)
        await probe.close()
        try:
            await self._pool.open(wait=wait, timeout=timeout)
        except psycopg.Error as exc:
            raise _translate(exc) from exc
        except Exception as exc:  # psycopg_pool.PoolTimeout carries no SQLSTATE
            raise errors.Unavailable(f"cannot connect to the database: {exc}") from exc
        return self

    async def close(self) -> None:
        """Send pending hints; close the pool and its connections."""
        if self._hinter is not None and not self._hinter.done():
            self._hinter.cancel()
        await self.flush_hints()
        await self._pool.close()

    async def __aenter__(self) -> Session:
        return await self.open()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    def _retrying(self, already: int = 0) -> AsyncRetrying:
        """Up to six tries in all (``already`` made before this loop), with
        jittered exponential backoff between them: up to 0.05, 0.1, 0.2, 0.4
        and 0.8 s, the schedule continuing where the tries made left off."""
        return AsyncRetrying(
            retry=retry_if_exception(_is_transient),
            wait=wait_random_exponential(multiplier=RETRY_BASE_S * 2 ** already, max=2.0),
            stop=stop_after_attempt(6 - already),
            reraise=True,
        )

    async def call(self, function: str, /, **args: Any) -> list[Row]:
        """Call ``ledger_api.<function>`` with named arguments in its own transaction."""
        return await self._retried(lambda conn: _run_call(conn, function, args))

    async def fetch(self, query: Query, /, **params: Any) -> list[Row]:
        """Run a read query."""
        return await self._retried(lambda conn: _run_query(conn, query, params))

    async def _retried(self, work: Callable[[psycopg.AsyncConnection[Row]], Awaitable[list[Row]]]) -> list[Row]:
        # The first try runs outside tenacity: building its retry state on
        # every call cost more than the call's own Python work (bench/cycle).
        try:
            async with self._pool.connection() as conn:
                return await work(conn)
        except Exception as exc:
            if not _is_transient(exc):
                raise
            await asyncio.sleep(random.uniform(0, RETRY_BASE_S))  # the first of the jittered waits
        async for attempt in self._retrying(already=1):
            with attempt:
                async with self._pool.connection() as conn:
                    return await work(conn)
        raise AssertionError("unreachable")  # pragma: no cover

    async def hint(self, hints: Sequence[tuple[str, str]], /) -> None:
        """NOTIFY ``(channel, payload)`` pairs after a committed write.

        For writes whose waiters may be many per second (a recorded attempt
        wakes verifiers and tails): PostgreSQL serialises the commits of
        notifying transactions, WAL flush included, so a NOTIFY inside the
        write capped a fleet at one write per flush (bench/cycle). Hints are
        gathered for ``HINT_WINDOW_S`` and sent together in a transaction of
        their own that writes nothing worth a flush: the serialised part is
        microseconds and a busy worker pays one round trip for many hints. A
        hint lost to a crash in between costs a waiter one poll tick (DESIGN
        5: signals are hints; rows are truth)."""
        if not hints:
            return
        self._hints.update(dict.fromkeys(hints))
        if self._hinter is None or self._hinter.done():
            self._hinter = asyncio.create_task(self._send_hints())

    async def _send_hints(self) -> None:
        # Hints that arrive while a batch is being sent go in the next round.
        while self._hints:
            await asyncio.sleep(HINT_WINDOW_S)  # the coalescing window, not a synchronisation
            await self.flush_hints()

    async def flush_hints(self) -> None:
        """Send the hints gathered so far now."""
        if not self._hints:
            return
        hints, self._hints = list(self._hints), {}
        statement = sql.SQL("BEGIN; SET LOCAL synchronous_commit = off; {}; COMMIT").format(
            _hint_statement(hints))
        try:
            async with self._pool.connection() as conn:
                await conn.execute(statement)
        except (psycopg.Error, psycopg_pool.PoolTimeout):
            pass  # a hint, not a write: the waiters' poll tick covers it

    @asynccontextmanager
    async def transaction(self, *, now: datetime | None = None) -> AsyncIterator[Transaction]:
        """A transaction spanning several calls. ``now`` pins ``ledger.now()``
        for its length (only where the database allows pinning: tests)."""
        async with self._pool.connection() as conn:
            try:
                async with conn.transaction():
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
    ):
        self.url = url
        self.role_prefix = role_prefix
        self.role_urls = dict(role_urls or {})

    @classmethod
    def from_settings(cls, settings: Settings | None = None) -> Database:
        """The database the settings name, starting the embedded server if none is named."""
        settings = settings or get_settings()
        url = settings.database_url
        if not url:
            from .embedded import default_url

            url = default_url(settings.data_dir)
        return cls(url, role_prefix=settings.role_prefix, role_urls=settings.role_urls())

    def role(self, actor: str) -> str:
        """The database role that plays ``actor``."""
        return f"{self.role_prefix}{actor}"

    def url_for(self, actor: str | None) -> str:
        """The login an actor connects with (its own, or the administrator's)."""
        if actor is None:
            return self.url
        return self.role_urls.get(actor, self.url)

    def set_role_statement(self, actor: str) -> sql.Composed:
        """``SET ROLE`` to the actor's role, safely quoted."""
        return sql.SQL("SET ROLE {}").format(sql.Identifier(self.role(actor)))

    def session(self, actor: str | None, *, min_size: int = 1, max_size: int = 4) -> Session:
        """A (not yet opened) pool acting as ``actor``; ``None`` acts as the administrator."""
        return Session(self, actor, min_size=min_size, max_size=max_size)

    async def connect(self, actor: str | None = None, *, autocommit: bool = True) -> psycopg.AsyncConnection[Row]:
        """One dedicated connection acting as ``actor`` (for LISTEN and the like)."""
        try:
            conn = await psycopg.AsyncConnection.connect(
                self.url_for(actor),
                autocommit=autocommit,
                row_factory=dict_row,
                application_name=f"ledger:{actor or 'admin'}",
            )
            if actor is not None:
                await conn.execute(self.set_role_statement(actor))
                if not autocommit:
                    await conn.commit()
        except psycopg.OperationalError as exc:
            raise errors.Unavailable(f"cannot connect to the database: {_first_line(exc)}") from exc
        except psycopg.Error as exc:
            raise _translate(exc) from exc
        return conn

    def connect_sync(self, actor: str | None = None, *, autocommit: bool = True) -> psycopg.Connection[Row]:
        """A blocking connection acting as ``actor`` (for scripts, tests and the CLI's admin work)."""
        try:
            conn = psycopg.connect(
                self.url_for(actor),
                autocommit=autocommit,
                row_factory=dict_row,
                application_name=f"ledger:{actor or 'admin'}",
            )
            if actor is not None:
                conn.execute(self.set_role_statement(actor))
                if not autocommit:
                    conn.commit()
        except psycopg.OperationalError as exc:
            raise errors.Unavailable(f"cannot connect to the database: {_first_line(exc)}") from exc
        except psycopg.Error as exc:
            raise _translate(exc) from exc
        return conn

    async def ping(self) -> None:
        """Raise ``Unavailable`` unless the database answers."""
        conn = await self.connect(None)
        await conn.close()

