"""Where one cycle's time goes: round trips, client CPU, server CPU and
waiting, for Ledger's claim + record and for the raw loop, side by side.

One claimer (N = 1), first one campaign per cycle (``claim_campaign`` +
``record_attempt``), then batches of 100 (``claim_campaigns`` +
``record_attempts``); the raw loop does the same with its one-statement claim
and completion (and their batch forms). For each:

- **round trips per cycle**: how often the client waits for the server,
  counted by a proxy that reads the protocol in a separate, untimed pass: a
  Sync or simple Query sent while nothing is outstanding starts a round trip,
  one sent behind an unanswered one rides along (a pipeline). Also the server
  transactions per cycle (Syncs and Queries answered).
- **client CPU per campaign**: this process's CPU time (``time.process_time``)
  over the drain, and in a second pass, sampled (``ITIMER_PROF``, 1 ms), the
  functions it is spent in.
- **server CPU per campaign**: the on-CPU time of the backends serving the
  drain (``/proc/<pid>/schedstat``, nanoseconds; the server must run on this
  machine), and the statements per cycle when the server has
  ``pg_stat_statements`` loaded (nested statements included with
  ``pg_stat_statements.track = all``).
- **waiting**: wall time neither process spent on a CPU (the network, commit
  flushes, the scheduler): wall - client CPU - server CPU.

A later change that adds a round trip or a millisecond shows here at once.

usage: python -m bench.cost [--quick] [--database-url URL]
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
import signal
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from bench.cycle import RAW_CLAIM, RAW_COMPLETE, RAW_SETUP, SHA, fill
from bench.harness import Context, Section, cli
from ledger import Database, Kernel
from ledger.db.models import Claim
from ledger.db.named_queries import Query

RAW_CLAIM_BATCH = """
UPDATE bench_raw SET state = 'leased', generation = generation + 1, lease_owner = %s,
       lease_expires_at = now() + interval '60 seconds'
 WHERE id IN (SELECT id FROM bench_raw WHERE state = 'ready'
               ORDER BY priority DESC, created_at, id LIMIT %s FOR UPDATE SKIP LOCKED)
RETURNING id, generation"""
RAW_COMPLETE_BATCH = """
UPDATE bench_raw r SET state = 'attempted', lease_owner = NULL, lease_expires_at = NULL, candidate = %s
  FROM unnest(%s::bigint[], %s::bigint[]) AS u(id, generation)
 WHERE r.id = u.id AND r.generation = u.generation AND r.state = 'leased'"""


# --------------------------------------------------------------------------- round trips


@dataclass
class Wire:
    """What one proxied connection's client sent and waited for."""
    round_trips: int = 0
    syncs: int = 0  # Sync and simple Query messages: each ends a server transaction (autocommit)
    outstanding: int = 0
    started: bool = False  # past the start-up packet (which has no type byte)
    client_buffer: bytearray = field(default_factory=bytearray)
    server_buffer: bytearray = field(default_factory=bytearray)

    def from_client(self, data: bytes) -> None:
        self.client_buffer += data
        buf = self.client_buffer
        while True:
            if not self.started:
                if len(buf) < 4:
                    return
                size = int.from_bytes(buf[:4], "big")
                if len(buf) < size:
                    return
                del buf[:size]
                self.started = True
                continue
            if len(buf) < 5:
                return
            size = int.from_bytes(buf[1:5], "big")
            if len(buf) < 1 + size:
                return
            kind = buf[0:1]
            del buf[:1 + size]
            if kind in (b"S", b"Q"):
                if self.outstanding == 0:
                    self.round_trips += 1
                self.outstanding += 1
                self.syncs += 1

    def from_server(self, data: bytes) -> None:
        self.server_buffer += data
        buf = self.server_buffer
        while len(buf) >= 5:
            size = int.from_bytes(buf[1:5], "big")
            if len(buf) < 1 + size:
                return
            kind = buf[0:1]
            del buf[:1 + size]
            if kind == b"Z":  # ReadyForQuery: the answer to one Sync or Query
                self.outstanding = max(0, self.outstanding - 1)


class CountingProxy:
    """A TCP proxy in this event loop that counts each connection's round
    trips (``Wire``). Used only in the untimed pass: it costs CPU here."""

    def __init__(self, url: str):
        params = conninfo_to_dict(url)
        self.host = str(params.get("host") or "127.0.0.1")
        self.port = int(params.get("port") or 5432)
        self.wires: list[Wire] = []
        self._server: asyncio.base_events.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.listen_port = 0

    async def __aenter__(self) -> CountingProxy:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.listen_port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def url(self, url: str) -> str:
        """``url`` through this proxy (plain TCP: the proxy reads the protocol)."""
        params = conninfo_to_dict(url)
        params.update(host="127.0.0.1", port=str(self.listen_port), sslmode="disable",
                      gssencmode="disable")
        return make_conninfo("", **params)

    def reset(self) -> None:
        for w in self.wires:
            w.round_trips = w.syncs = 0

    def totals(self) -> tuple[int, int]:
        return sum(w.round_trips for w in self.wires), sum(w.syncs for w in self.wires)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        server_r, server_w = await asyncio.open_connection(self.host, self.port)
        wire = Wire()
        self.wires.append(wire)

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter,
                       see: Callable[[bytes], None]) -> None:
            try:
                while data := await src.read(65536):
                    see(data)
                    dst.write(data)
                    await dst.drain()
            except (ConnectionError, asyncio.CancelledError):
                pass
            finally:
                dst.close()
        for t in (asyncio.create_task(pipe(reader, server_w, wire.from_client)),
                  asyncio.create_task(pipe(server_r, writer, wire.from_server))):
            self._tasks.add(t)
            t.add_done_callback(self._tasks.discard)


# --------------------------------------------------------------------------- CPU


def backend_cpu_ns(pid: int) -> int:
    """A server process's time on a CPU so far (nanoseconds; ticks as a fallback)."""
    try:
        return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) * 1_000_000_000 // os.sysconf("SC_CLK_TCK")


class Sampler:
    """A sampling profiler of this process's CPU: every ``interval_s`` of CPU
    time (``ITIMER_PROF``) the running Python function is counted; time in C
    (libpq, the event loop's selector) counts for the Python function that
    called it. Cheap enough not to change the ranking it reports."""

    def __init__(self, interval_s: float = 0.001):
        self.interval_s = interval_s
        self.own: collections.Counter[str] = collections.Counter()
        self.areas: collections.Counter[str] = collections.Counter()
        self.samples = 0

    @staticmethod
    def _name(frame: FrameType) -> str:
        code = frame.f_code
        path = code.co_filename
        for marker in ("site-packages/", "/src/", "/lib/python3"):
            if marker in path:
                path = path.split(marker, 1)[1]
                break
        return f"{getattr(code, 'co_qualname', code.co_name)} ({path}:{code.co_firstlineno})"

    @staticmethod
    def _area(frame: FrameType) -> str:
        path = frame.f_code.co_filename
        for name in ("psycopg_pool", "psycopg", "pydantic", "ledger", "tenacity", "asyncio", "bench"):
            if f"/{name}/" in path:
                return name
        return "other"

    def _sample(self, signum: int, frame: FrameType | None) -> None:
        if frame is None:
            return
        self.samples += 1
        self.own[self._name(frame)] += 1
        self.areas[self._area(frame)] += 1

    @contextmanager
    def running(self) -> Iterator[None]:
        previous = signal.signal(signal.SIGPROF, self._sample)
        signal.setitimer(signal.ITIMER_PROF, self.interval_s, self.interval_s)
        try:
            yield
        finally:
            signal.setitimer(signal.ITIMER_PROF, 0, 0)
            signal.signal(signal.SIGPROF, previous)

    def top(self, n: int = 8) -> list[str]:
        total = max(self.samples, 1)
        return [f"{100 * c / total:.0f}% {name}" for name, c in self.own.most_common(n)]

    def by_area(self) -> dict[str, int]:
        total = max(self.samples, 1)
        return {a: round(100 * c / total) for a, c in self.areas.most_common()}


# --------------------------------------------------------------------------- the contenders


@dataclass
class Drain:
    """One drain: campaigns and cycles done, and what they cost."""
    campaigns: int
    cycles: int
    wall_s: float
    client_s: float
    server_s: float


Loop = Callable[[], Awaitable[int]]  # one claim + record cycle; campaigns done (0: nothing left)


async def _drain(step: Loop, backends: Callable[[], Awaitable[list[int]]]) -> Drain:
    pids = await backends()
    server0 = {p: backend_cpu_ns(p) for p in pids}
    wall0, client0 = time.perf_counter(), time.process_time()
    campaigns = cycles = 0
    while done := await step():
        campaigns += done
        cycles += 1
    wall, client = time.perf_counter() - wall0, time.process_time() - client0
    server = sum(backend_cpu_ns(p) - server0[p] for p in server0) / 1e9
    return Drain(campaigns, cycles, wall, client, server)


class Raw:
    """The raw loop on one connection (autocommit), one row or ``batch`` per cycle."""

    def __init__(self, url: str, batch: int):
        self.url, self.batch = url, batch
        self.conn: psycopg.AsyncConnection[Any] | None = None

    def fill(self, n: int) -> None:
        with psycopg.connect(self.url, autocommit=True) as admin:
            admin.execute(RAW_SETUP)
            admin.execute("INSERT INTO bench_raw (state) SELECT 'ready' FROM generate_series(1, %s)", (n,))
            admin.execute("VACUUM ANALYZE bench_raw")

    async def open(self, url: str) -> None:
        self.conn = await psycopg.AsyncConnection.connect(url, autocommit=True)

    async def close(self) -> None:
        if self.conn is not None:
            await self.conn.close()

    async def backends(self) -> list[int]:
        assert self.conn is not None
        return [self.conn.info.backend_pid]

    async def step(self) -> int:
        conn = self.conn
        assert conn is not None
        if self.batch == 1:
            row = await (await conn.execute(RAW_CLAIM, ("raw",))).fetchone()
            if row is None:
                return 0
            await conn.execute(RAW_COMPLETE, (SHA, row[0], row[1]))
            return 1
        rows = await (await conn.execute(RAW_CLAIM_BATCH, ("raw", self.batch))).fetchall()
        if not rows:
            return 0
        await conn.execute(RAW_COMPLETE_BATCH, (SHA, [r[0] for r in rows], [r[1] for r in rows]))
        return len(rows)


class Ledger:
    """Ledger's cycle through ``Kernel`` on a one-connection worker session."""

    def __init__(self, db: Database, batch: int):
        self.db, self.batch = db, batch
        self.class_ = ""
        self.session: Any = None
        self.kernel: Kernel | None = None

    def fill(self, n: int) -> None:
        self.class_ = fill(self.db, n)

    async def open(self, url: str) -> None:
        db = Database(url, role_prefix=self.db.role_prefix)
        self.session = await db.session("worker", min_size=1, max_size=1).open()
        self.kernel = Kernel(self.session)

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()

    async def backends(self) -> list[int]:
        rows = await self.session.fetch(_PID)
        return [int(r["pid"]) for r in rows]

    async def step(self) -> int:
        kernel = self.kernel
        assert kernel is not None
        leased: list[Claim]
        if self.batch == 1:
            claim = await kernel.claim_campaign("bench-cost", [self.class_])
            if claim is None:
                return 0
            await kernel.record_attempt(claim.campaign_id, claim.generation, base_sha=SHA,
                                        candidate_sha=SHA, fingerprint=f"bench:{claim.campaign_id:08d}")
            return 1
        leased = await kernel.claim_campaigns("bench-cost", [self.class_], limit=self.batch)
        if not leased:
            return 0
        await kernel.record_attempts([
            {"campaign_id": c.campaign_id, "generation": c.generation, "base_sha": SHA,
             "candidate_sha": SHA, "fingerprint": f"bench:{c.campaign_id:08d}"} for c in leased])
        return len(leased)


_PID = Query("SELECT pg_catalog.pg_backend_pid() AS pid")


def track_statements(url: str) -> bool:
    """Whether the server counts statements (``pg_stat_statements`` loaded):
    then its view is made available in this database."""
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            conn.execute("SELECT 1 FROM pg_stat_statements LIMIT 1")
        return True
    except psycopg.Error:
        return False


async def _statements(url: str) -> dict[str, int] | None:
    """Statements executed so far in this database (pg_stat_statements), or
    None when the server does not have it loaded."""
    try:
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            cur = await conn.execute("SELECT coalesce(sum(calls), 0)::bigint, "
                                     "coalesce(sum(calls) FILTER (WHERE toplevel), 0)::bigint "
                                     "FROM pg_stat_statements WHERE dbid = "
                                     "(SELECT oid FROM pg_database WHERE datname = current_database())")
            row = await cur.fetchone()
            assert row is not None
            return {"all": int(row[0]), "top": int(row[1])}
    except psycopg.Error:
        return None


async def measure(contender: Raw | Ledger, url: str, n: int, *, counted: int, sampled: bool,
                  statements: bool) -> dict[str, Any]:
    """The contender's figures: a timed drain of ``n`` campaigns (best of the
    rounds' least CPU), an untimed proxied drain of ``counted`` campaigns for
    the round trips, and optionally a sampled drain for the top functions."""
    out: dict[str, Any] = {}
    # warm-up: plans, prepared statements, statistics
    contender.fill(min(n, 200))
    await contender.open(url)
    try:
        while await contender.step():
            pass
    finally:
        await contender.close()

    # round trips, through the counting proxy
    async with CountingProxy(url) as proxy:
        contender.fill(counted)
        await contender.open(proxy.url(url))
        try:
            proxy.reset()
            statements0 = await _statements(url) if statements else None
            cycles = 0
            while await contender.step():
                cycles += 1
            await asyncio.sleep(0.05)  # hints still in their coalescing window
            trips, syncs = proxy.totals()
            statements1 = await _statements(url) if statements else None
        finally:
            await contender.close()
    cycles = max(cycles, 1)
    # less the drain's last, empty claim: one round trip, one transaction
    out["round_trips_per_cycle"] = round((trips - 1) / cycles, 2)
    out["server_transactions_per_cycle"] = round((syncs - 1) / cycles, 2)
    if statements0 is not None and statements1 is not None:
        # (less the one statement the first count ran)
        out["statements_per_cycle"] = round((statements1["all"] - statements0["all"] - 1) / cycles, 1)

    # the timed drain
    contender.fill(n)
    await contender.open(url)
    try:
        drain = await _drain(contender.step, contender.backends)
    finally:
        await contender.close()
    per = max(drain.campaigns, 1)
    out.update({
        "campaigns": drain.campaigns,
        "per_s": round(drain.campaigns / drain.wall_s),
        "wall_us": round(drain.wall_s / per * 1e6),
        "client_cpu_us": round(drain.client_s / per * 1e6),
        "server_cpu_us": round(drain.server_s / per * 1e6),
        "waiting_us": round(max(drain.wall_s - drain.client_s - drain.server_s, 0.0) / per * 1e6),
    })

    if sampled:
        sampler = Sampler()
        contender.fill(n)
        await contender.open(url)
        try:
            with sampler.running():
                while await contender.step():
                    pass
        finally:
            await contender.close()
        out["client_top"] = sampler.top()
        out["client_areas_pct"] = sampler.by_area()
    return out


async def run(ctx: Context) -> Section:
    n, counted, n_batch = (300, 50, 1000) if ctx.quick else (3000, 200, 5000)
    section = Section("cost", "Where one cycle's time goes, N = 1 (per campaign; round trips per cycle)")
    with ctx.database() as url:
        db = ctx.as_ledger(url)
        statements = track_statements(url)
        for batch in (1, 100):
            for name, contender in (("raw loop", Raw(url, batch)), ("ledger", Ledger(db, batch))):
                figures = await measure(contender, url, n if batch == 1 else n_batch,
                                        counted=counted if batch == 1 else 500,
                                        sampled=name == "ledger", statements=statements)
                top = figures.pop("client_top", None)
                areas = figures.pop("client_areas_pct", None)
                section.rows.append({"what": name, "batch": batch, **figures})
                if top:
                    section.notes.append(f"{name}, batch {batch}: client CPU by area (% of samples) "
                                         + json.dumps(areas) + "; top functions: " + "; ".join(top))
                    section.extra[f"{name} batch {batch} client top"] = top
    section.notes.append(
        "CPU per campaign over one drain (client: time.process_time of this process; server: "
        "/proc/<pid>/schedstat of the connection's backend); waiting = wall - client - server; "
        "round trips and server transactions counted by a protocol-reading proxy in a separate "
        "untimed drain; statements (nested included) only where pg_stat_statements is loaded.")
    return section


if __name__ == "__main__":
    cli(run, __doc__)
