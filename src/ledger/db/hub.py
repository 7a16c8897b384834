"""Wake-ups (README "How it works"): NOTIFY is a hint, the rows are the truth.

The design at length: docs/internals.md (``ledger.db.hub``).
"""

from __future__ import annotations

import asyncio
import secrets
from collections import deque
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager, suppress
from typing import Any, Protocol

import psycopg
from psycopg import sql

from ledger.backoff import backoff
from ledger.db.database import Database, bounded
from ledger.errors import Unavailable
from ledger.logs import get_logger

CHANNELS = ("ledger_ready", "ledger_cancel", "ledger_event", "ledger_attempted", "ledger_outbox")
#: The hub's own channel: the round trip that proves it hears.
HUB_CHANNEL = "ledger_hub"
#: Above this share of the server's notification queue, warn (and /readyz
#: reports degraded): something listens but does not read.
NOTIFY_QUEUE_ALARM = 0.5


def queue_alarm(usage: float | None, threshold: float = NOTIFY_QUEUE_ALARM) -> bool:
    """Whether a ``pg_notification_queue_usage()`` reading calls for the alarm."""
    return usage is not None and usage > threshold


class Deaf(Exception):
    """The LISTEN connection did not deliver the hub's own NOTIFY in time."""


class Subscription(Protocol):
    """A subscriber's view of one channel (and key)."""

    async def wait(self, timeout: float) -> bool:
        """Wait for a wake-up; ``True`` if woken, ``False`` if the timeout passed."""

    def drain(self) -> list[str]:
        """Payloads received since the last drain (may have dropped some on overflow)."""


class WakeSource(Protocol):
    """What runtimes need from a hub."""

    @contextmanager
    def subscribe(self, channel: str, key: str | None = None) -> Iterator[Subscription]:
        """Subscribe for the length of the ``with`` block."""


class _Sleeper:
    async def wait(self, timeout: float) -> bool:
        await asyncio.sleep(timeout)
        return False

    def drain(self) -> list[str]:
        return []


class NullHub:
    """No LISTEN connection: every wait is a poll tick."""

    @contextmanager
    def subscribe(self, channel: str, key: str | None = None) -> Iterator[Subscription]:
        if channel not in CHANNELS:
            raise ValueError(f"unknown channel {channel!r}")
        yield _Sleeper()


class _Subscriber:
    """One subscriber's bounded inbox and wake flag.

    Delivery never blocks and never fails: past ``maxsize`` undrained payloads
    new ones are dropped (and counted), but the wake flag is still raised, so a
    slow subscriber is woken to re-read rows, which is what matters."""

    def __init__(self, channel: str, key: str | None, maxsize: int):
        self.channel = channel
        self.key = key
        self.maxsize = maxsize
        self.dropped = 0
        self._payloads: deque[str] = deque()
        self._woken = asyncio.Event()

    def push(self, payload: str) -> bool:
        """Queue a payload and wake; ``False`` if it was dropped."""
        kept = len(self._payloads) < self.maxsize
        if kept:
            self._payloads.append(payload)
        else:
            self.dropped += 1
        self._woken.set()
        return kept

    def wake(self) -> None:
        """Wake without a payload (after a reconnect: re-read the rows)."""
        self._woken.set()

    async def wait(self, timeout: float) -> bool:
        """Wait for a wake-up; ``True`` if woken, ``False`` if the timeout passed.
        A wake-up that happened since the last wait counts (it is not lost)."""
        if not self._woken.is_set():
            try:
                # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a
                # cancellation that races with the event being set.
                async with asyncio.timeout(max(timeout, 0.0)):
                    await self._woken.wait()
            except TimeoutError:
                return False
        self._woken.clear()
        return True

    def drain(self) -> list[str]:
        """Payloads received since the last drain, oldest first."""
        payloads = list(self._payloads)
        self._payloads.clear()
        return payloads


class Hub:
    """One LISTEN connection per process, demultiplexed to in-process subscribers.

    A single supervisor task owns the connection: it connects as ``actor``
    (LISTEN needs no privileges), LISTENs on every channel in ``CHANNELS``,
    dispatches each notification to the subscribers of its channel (all of
    them, or those whose key equals the payload), pings the server every
    ``ping_s`` so a half-open connection is noticed, and when the connection
    dies reconnects with jittered exponential backoff capped at
    ``backoff_cap_s``. After every (re)connect it wakes every subscriber once.

    ``reconnects`` and ``connected`` are for metrics; ``dropped`` counts
    payloads dropped from full subscriber queues.
    """

    def __init__(
        self,
        db: Database,
        *,
        actor: str = "reader",
        queue_size: int = 256,
        ping_s: float = 10.0,
        ping_timeout_s: float = 5.0,
        backoff_base_s: float = 0.1,
        backoff_cap_s: float = 1.0,
        queue_alarm: float = NOTIFY_QUEUE_ALARM,
    ):
        if queue_size < 1:
            raise ValueError(f"queue_size must be positive, not {queue_size}")
        if ping_s <= 0 or ping_timeout_s <= 0 or backoff_base_s <= 0 or backoff_cap_s < backoff_base_s:
            raise ValueError("ping_s, ping_timeout_s and backoff_base_s must be positive, "
                             "backoff_cap_s >= base")
        self.db = db
        self.actor = actor
        self.queue_size = queue_size
        self.ping_s = ping_s
        self.ping_timeout_s = ping_timeout_s
        self.backoff_base_s = backoff_base_s
        self.backoff_cap_s = backoff_cap_s
        self.reconnects = 0
        self._dropped_gone = 0  # from subscribers that have left
        self._subscribers: dict[tuple[str, str | None], set[_Subscriber]] = {}
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self._sender: psycopg.AsyncConnection[Any] | None = None  # sends the round trips
        self._task: asyncio.Task[None] | None = None
        self._up = asyncio.Event()
        self._settled = asyncio.Event()  # up, or found deaf
        self._connects = 0
        self._last_error: BaseException | None = None
        self._expect: str | None = None  # the token of the round trip in flight
        self._heard = asyncio.Event()
        #: whether the last round trip to itself came back (False: waiters poll)
        self.hearing = False
        #: round trips that did not come back in time
        self.misses = 0
        #: the last round trip failed to come back (and none has since):
        #: the process runs on polling
        self.deaf = False
        #: ``pg_notification_queue_usage()`` at the last round trip (0..1)
        self.queue_usage: float | None = None
        self.queue_alarm = queue_alarm
        self._queue_alarmed = False
        self.log = get_logger("hub", actor=actor)

    # --- metrics -------------------------------------------------------------

    @property
    def connected(self) -> bool:
        """Whether the LISTEN connection is up (and listening)."""
        return self._conn is not None

    @property
    def backend_pid(self) -> int | None:
        """The server process of the LISTEN connection (for diagnostics and drills)."""
        return self._conn.info.backend_pid if self._conn is not None else None

    @property
    def dropped(self) -> int:
        """Payloads dropped from full subscriber queues so far."""
        live = sum(s.dropped for subs in self._subscribers.values() for s in subs)
        return self._dropped_gone + live

    # --- lifecycle -----------------------------------------------------------

    async def start(self, *, wait: bool = True, timeout: float = 10.0) -> Hub:
        """Start the supervisor. With ``wait``, return once the first LISTEN is in
        place and heard, or found deaf (the process then polls, see ``deaf``);
        stop and raise ``Unavailable`` if neither happened after ``timeout`` s."""
        if self._task is not None:
            return self
        self._up.clear()
        self._settled.clear()
        self._task = asyncio.create_task(self._supervise(), name="ledger-hub")
        if wait:
            try:
                async with asyncio.timeout(timeout):
                    await self._settled.wait()
            except TimeoutError:
                await self.stop()
                detail = f": {self._last_error}" if self._last_error else ""
                raise Unavailable(f"the hub could not LISTEN within {timeout:g}s{detail}") from None
        return self

    async def stop(self) -> None:
        """Stop the supervisor and close the connection. Subscribers stay valid
        (their waits simply time out from now on)."""
        task, self._task = self._task, None
        if task is None:
            return
        task.cancel()
        # Bounded: a stop must never hang a shutdown, whatever the task does.
        done, _ = await asyncio.wait({task}, timeout=10.0)
        if not done:
            self.log.error("hub supervisor did not stop within 10s")
        elif not task.cancelled() and (exc := task.exception()) is not None:
            self.log.error("hub supervisor failed", error=_one_line(exc))

    async def __aenter__(self) -> Hub:
        return await self.start()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    # --- subscribers ---------------------------------------------------------

    @contextmanager
    def subscribe(self, channel: str, key: str | None = None) -> Iterator[Subscription]:
        """Subscribe to ``channel`` (only payloads equal to ``key``, if given)
        for the length of the ``with`` block."""
        if channel not in CHANNELS:
            raise ValueError(f"unknown channel {channel!r}")
        sub = _Subscriber(channel, key, self.queue_size)
        group = self._subscribers.setdefault((channel, key), set())
        group.add(sub)
        try:
            yield sub
        finally:
            group.discard(sub)
            self._dropped_gone += sub.dropped
            if not group:
                self._subscribers.pop((channel, key), None)

    def _dispatch(self, channel: str, payload: str) -> None:
        if channel == HUB_CHANNEL:
            if payload == self._expect:
                self._heard.set()
            return
        # Exact-key subscribers and channel-wide ones; nobody else is looked at,
        # so thousands of per-campaign tails cost nothing per notification.
        for key in (None, payload):
            for sub in tuple(self._subscribers.get((channel, key), ())):
                sub.push(payload)

    def _wake_all(self) -> None:
        for group in tuple(self._subscribers.values()):
            for sub in tuple(group):
                sub.wake()

    # --- the supervisor ------------------------------------------------------

    def _backoff(self, failures: int) -> float:
        # Exponential, capped, with "equal jitter": never zero, never in lockstep
        # with the other processes that lost the same server.
        return backoff(failures + 1, base_s=self.backoff_base_s, cap_s=self.backoff_cap_s)

    async def _listen(self) -> psycopg.AsyncConnection[Any]:
        # LISTEN is session state: it needs a direct connection, never one
        # through a transaction pooler (LEDGER_LISTEN_DATABASE_URL).
        conn = await self.db.connect(self.actor, url=self.db.listen_url_for(self.actor),
                                     setup=False)
        try:
            listen = sql.SQL("; ").join(sql.SQL("LISTEN {}").format(sql.Identifier(channel))
                                        for channel in (*CHANNELS, HUB_CHANNEL))
            await bounded(conn, conn.execute(listen), self.ping_timeout_s)
        except BaseException:
            await conn.close()
            raise
        return conn

    async def _prove(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """A NOTIFY to itself, sent and heard back within ``ping_timeout_s``
        each; else ``Deaf`` (or the send's own ``OutcomeUnknown``).
        Notifications that arrive meanwhile are dispatched as usual."""
        loop = asyncio.get_running_loop()
        self._expect = secrets.token_hex(8)
        self._heard.clear()
        sender = self._sender
        if sender is None or sender.closed:
            self._sender = sender = await self.db.connect(
                self.actor, url=self.db.listen_url_for(self.actor), setup=False)
        cur = await bounded(sender, sender.execute(
            "SELECT pg_notify(%s, %s), pg_catalog.pg_notification_queue_usage() AS usage",
            (HUB_CHANNEL, self._expect)), self.ping_timeout_s)
        row = await cur.fetchone()
        self._note_queue(float(row["usage"] if isinstance(row, dict) else row[1]) if row else None)
        deadline = loop.time() + self.ping_timeout_s
        while not self._heard.is_set():
            remaining = deadline - loop.time()
            if remaining <= 0:
                self.hearing = False
                self.misses += 1
                self._settled.set()
                if not self.deaf:
                    self.deaf = True
                    self.log.warning(
                        "hub connected but deaf",
                        meaning="its own NOTIFY, sent from another connection, did not come "
                                "back: wake-ups are lost, this process polls on its ticks",
                        fix="if LISTEN goes through a transaction pooler, give it a direct "
                            "connection: LEDGER_LISTEN_DATABASE_URL",
                        backend_pid=conn.info.backend_pid)
                raise Deaf(f"the hub's own NOTIFY did not come back within {self.ping_timeout_s:g}s")
            async for note in conn.notifies(timeout=remaining, stop_after=1):
                self._dispatch(note.channel, note.payload)
        self.hearing = True
        if self.deaf:
            self.deaf = False
            self.log.info("the hub hears again: wake-ups resume")

    def _note_queue(self, usage: float | None) -> None:
        self.queue_usage = usage
        alarmed = queue_alarm(usage, self.queue_alarm)
        if alarmed and not self._queue_alarmed:
            self.log.warning(
                "the server's notification queue is filling: a session LISTENs but does not "
                "read (often one idle inside a transaction); when it is full every NOTIFY, "
                "hence every open and every return to ready, fails",
                usage=round(usage or 0.0, 4), threshold=self.queue_alarm)
        elif not alarmed and self._queue_alarmed:
            self.log.info("the server's notification queue has drained", usage=round(usage or 0.0, 4))
        self._queue_alarmed = alarmed

    async def _pump(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """Dispatch notifications until the connection fails or goes deaf.
        Every ``ping_s`` a round trip to itself proves the connection still
        hears; notifications that arrive during it are dispatched in it."""
        while True:
            async for note in conn.notifies(timeout=self.ping_s):
                self._dispatch(note.channel, note.payload)
            await self._prove(conn)

    async def _supervise(self) -> None:
        loop = asyncio.get_running_loop()
        failures = 0
        while True:
            conn: psycopg.AsyncConnection[Any] | None = None
            up_since: float | None = None
            try:
                conn = await self._listen()
                await self._prove(conn)
                self._conn, up_since = conn, loop.time()
                if self._connects:
                    self.reconnects += 1
                self._connects += 1
                self._last_error = None
                self.log.info("hub listening", backend_pid=conn.info.backend_pid,
                              reconnects=self.reconnects)
                self._up.set()
                self._settled.set()
                # Anything sent while we were away is lost: everyone re-reads.
                self._wake_all()
                await self._pump(conn)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the supervisor outlives every failure
                self._last_error = exc
                self.hearing = False
                # One line per outage, then one per 30 tries: a server down
                # for an hour must not fill the log.
                # A deaf hub has said so once already (in _prove).
                if not isinstance(exc, Deaf) and (failures == 0 or (failures + 1) % 30 == 0):
                    what = "hub connection lost" if up_since is not None else "hub cannot connect"
                    self.log.warning(what, error=_one_line(exc), tries=failures + 1)
            finally:
                self._conn = None
                sender, self._sender = self._sender, None
                for each in (conn, sender):
                    if each is not None:
                        with suppress(Exception):
                            await each.close()
            # A connection that died at once does not reset the backoff, so a
            # server that accepts and drops is not hammered.
            stable = up_since is not None and loop.time() - up_since >= self.backoff_cap_s
            failures = 0 if stable else failures + 1
            # A deaf hub retries as soon as any other: a round trip lost to a
            # loaded server must not keep a process on polling for long (each
            # try waits ping_timeout_s anyway, so a pooler is not hammered).
            await asyncio.sleep(self._backoff(failures))


def _one_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__


@asynccontextmanager
async def listening(db: Database, enabled: bool = True) -> AsyncIterator[WakeSource]:
    """A started ``Hub`` for the length of the block, or a ``NullHub`` when
    LISTEN is disabled (e.g. behind a transaction pooler, which cannot LISTEN)."""
    if not enabled:
        yield NullHub()
        return
    from ledger.settings import get_settings

    hub = await Hub(db, ping_s=get_settings().hub_ping_s).start(
        timeout=max(10.0, db.wait_for_database_s))
    try:
        yield hub
    finally:
        await hub.stop()
