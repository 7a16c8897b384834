"""Heartbeat load: many live leases keeping themselves alive through Ledger's own
API (``Kernel.heartbeat(campaign_id, generation)``, fenced by generation), and
what that costs the database.

Setup: N campaigns are opened and claimed (N leases, one attempt row each).
Then every lease runs its own heartbeat loop, as ``AttemptRun._keep_lease``
does, through a ``Session`` acting as the worker role:

- **paced** -- each lease heartbeats every ``interval`` seconds on a fixed
  schedule (random phase, so the offered load is a steady N/interval per
  second). Production's default is ``heartbeat_s = 10``; the intervals here
  are 20-80x shorter so that the offered load is >= 1,500/s (quick: 200 leases
  every 0.125 s = 1,600/s; full: 1,000 leases every 0.5 s = 2,000/s, and 200
  leases every 0.125 s).
- **max** -- the same N loops with no interval at all (each heartbeats again as
  soon as the last one returned): the ceiling of this client and server.

Connections: the leases are spread round-robin over ``WORKERS`` simulated
worker processes, each a ``Session`` (connection pool) of ``POOL`` connections
acting as the worker role -- a worker process shares its pool between its
claim loop and all its attempts' heartbeats and journal writes, so a handful
of connections serve many leases (8 x 2 = 16 connections for up to 1,000
leases). All of them live in this one Python process, so the client's CPU is
that of the whole fleet.

Reported per run: heartbeats completed per second (sustained), the offered
rate, latency percentiles of one ``Kernel.heartbeat`` call (pool wait
included), lost beats (failed, or a scheduled beat skipped because the one
before it was still running a whole interval later) and late beats (completed
more than one interval after their scheduled time), and CPU: the PostgreSQL
backends serving this benchmark's own connections (``db_cpu_cores``: their
CPU seconds, from psutil, over wall seconds), every postgres process on the
machine (``db_cpu_cores_all``: includes other databases' load, noisy on a
shared server), and this client process (``client_cpu_cores``).

usage: python -m bench.heartbeat [--quick] [--database-url URL]
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from dataclasses import dataclass, field
from typing import Any

import psutil

from bench.harness import Context, Section, Target, cli, percentiles
from ledger import Database, Kernel
from ledger.db.database import Session

WORKERS = 8  # simulated worker processes (Sessions)
POOL = 2  # connections per worker process
LEASE_S = 600  # long enough that no lease can expire during a run


# --- CPU accounting (shared with bench.journal) --------------------------------


def _cpu(proc: psutil.Process) -> float | None:
    try:
        t = proc.cpu_times()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return None
    return t.user + t.system


def _postgres_processes() -> dict[int, float]:
    """CPU seconds of every postgres process on this machine, by pid."""
    seen: dict[int, float] = {}
    for proc in psutil.process_iter(["name", "cmdline"]):
        name = proc.info.get("name") or ""
        cmd = proc.info.get("cmdline") or []
        if name.startswith("postgres") or (cmd and cmd[0].startswith("postgres")):
            cpu = _cpu(proc)
            if cpu is not None:
                seen[proc.pid] = cpu
    return seen


class CpuMeter:
    """CPU seconds spent between ``start()`` and ``stop()`` by: the backends of
    one database (pids read from pg_stat_activity at start; the benchmark's
    connections are long-lived), every postgres process, and this process.

    Backends that connect during the run count with all their CPU; those that
    disconnect before ``stop()`` are missed. The backends' figure is this
    benchmark's own; the all-postgres figure
    also counts background processes (WAL writer, checkpointer) and any other
    database's load on a shared server."""

    def __init__(self, db: Database):
        self.db = db
        self.result: dict[str, float] = {}

    def _backends(self) -> list[int]:
        with self.db.connect_sync(None) as conn:
            rows = conn.execute("SELECT pid FROM pg_stat_activity "
                                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
                                ).fetchall()
        return [r["pid"] for r in rows]

    def start(self) -> None:
        self._ours = {pid: psutil.Process(pid) for pid in self._backends() if psutil.pid_exists(pid)}
        self._ours_t0 = {pid: _cpu(p) for pid, p in self._ours.items()}
        self._all_t0 = _postgres_processes()
        self._me = psutil.Process(os.getpid())
        self._me_t0 = _cpu(self._me) or 0.0
        self._wall0 = time.perf_counter()

    def stop(self) -> dict[str, float]:
        wall = time.perf_counter() - self._wall0
        ours = 0.0
        for pid, proc in self._ours.items():
            t0, t1 = self._ours_t0.get(pid), _cpu(proc)
            if t0 is not None and t1 is not None:
                ours += t1 - t0
        # backends connected during the run (a pool growing): all their CPU is the run's
        for pid in set(self._backends()) - set(self._ours):
            try:
                ours += _cpu(psutil.Process(pid)) or 0.0
                self._ours[pid] = psutil.Process(pid)
            except psutil.NoSuchProcess:
                pass
        all_t1 = _postgres_processes()
        every = sum(t1 - self._all_t0.get(pid, 0.0) for pid, t1 in all_t1.items())
        me = (_cpu(self._me) or 0.0) - self._me_t0
        self.result = {"wall_s": round(wall, 3), "db_backends": len(self._ours),
                       "db_cpu_s": round(ours, 3), "db_cpu_cores": round(ours / wall, 3),
                       "db_cpu_cores_all": round(every / wall, 3),
                       "client_cpu_cores": round(me / wall, 3)}
        return self.result


# --- setup -----------------------------------------------------------------------


def lease(db: Database, n: int, workers: int) -> list[tuple[int, int]]:
    """Open and claim ``n`` campaigns; their (campaign_id, generation)."""
    with db.connect_sync(None) as admin:
        admin.execute("SELECT ledger_api.register_class('bench', p_lease_seconds => %s)", (LEASE_S,))
        admin.execute("SELECT ledger_api.open_campaign('bench', 'hb-' || i, 'target-' || i) "
                      "FROM generate_series(1, %s) i", (n,))
    with db.connect_sync("worker") as w:
        # Set-based, as the worker role: one claim (and one attempt row) per lease.
        w.execute("SELECT ledger_api.claim_campaign(p_worker => 'bench-worker-' || (i %% %s)) "
                  "FROM generate_series(1, %s) i", (workers, n))
        rows = w.execute("SELECT id, generation FROM ledger_api.campaigns "
                         "WHERE state = 'leased' ORDER BY id").fetchall()
    with db.connect_sync(None) as admin:
        admin.execute("VACUUM ANALYZE ledger.campaign")
        admin.execute("VACUUM ANALYZE ledger.attempt")
    assert len(rows) == n, f"claimed {len(rows)} of {n}"
    return [(r["id"], r["generation"]) for r in rows]


def table_updates(db: Database) -> dict[str, int]:
    """Updates and HOT updates of campaign and attempt so far (pg_stat_user_tables)."""
    with db.connect_sync(None) as conn:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        rows = conn.execute("SELECT relname, n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables "
                            "WHERE schemaname = 'ledger' AND relname IN ('campaign', 'attempt')"
                            ).fetchall()
    out: dict[str, int] = {}
    for r in rows:
        out[f"{r['relname']}_upd"] = r["n_tup_upd"]
        out[f"{r['relname']}_hot"] = r["n_tup_hot_upd"]
    return out


# --- the loops -----------------------------------------------------------------------


@dataclass
class Beats:
    latencies: list[float] = field(default_factory=list)
    completed: int = 0
    failed: int = 0
    skipped: int = 0
    late: int = 0
    last_end: float = 0.0
    errors: dict[str, int] = field(default_factory=dict)

    def fail(self, exc: BaseException) -> None:
        self.failed += 1
        key = type(exc).__name__
        self.errors[key] = self.errors.get(key, 0) + 1

    async def beat(self, kernel: Kernel, cid: int, gen: int) -> float | None:
        """One timed heartbeat; its end time, or ``None`` if it failed."""
        start = time.perf_counter()
        try:
            await kernel.heartbeat(cid, gen)
        except Exception as exc:  # noqa: BLE001 -- counted, not raised: a lost beat
            self.fail(exc)
            return None
        end = time.perf_counter()
        self.latencies.append(end - start)
        self.completed += 1
        self.last_end = max(self.last_end, end)
        return end


async def paced(kernel: Kernel, cid: int, gen: int, interval: float, t0: float, t_end: float,
                beats: Beats) -> None:
    """Heartbeat at t0 + phase + k * interval until t_end (fixed rate, as a
    lease keeper with a steady timer would)."""
    phase = random.uniform(0, interval)
    k = 0
    while True:
        sched = t0 + phase + k * interval
        if sched >= t_end:
            return
        delay = sched - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        end = await beats.beat(kernel, cid, gen)
        if end is not None and end - sched > interval:
            beats.late += 1
        k += 1
        # A beat whose whole slot has passed while the one before ran is lost.
        now = time.perf_counter()
        while t0 + phase + k * interval + interval <= now and t0 + phase + k * interval < t_end:
            beats.skipped += 1
            k += 1


async def flat_out(kernel: Kernel, cid: int, gen: int, t_end: float, beats: Beats) -> None:
    """Heartbeat again as soon as the last one returned, until t_end."""
    while time.perf_counter() < t_end:
        await beats.beat(kernel, cid, gen)


async def measure(db: Database, sessions: list[Session], leases: list[tuple[int, int]],
                  interval: float | None, duration: float) -> dict[str, Any]:
    """One run: every lease heartbeating (every ``interval``, or flat out)."""
    kernels = [Kernel(s) for s in sessions]
    beats = Beats()
    meter = CpuMeter(db)
    before = table_updates(db)
    meter.start()
    t0 = time.perf_counter()
    t_end = t0 + duration
    if interval is None:
        loops = [flat_out(kernels[i % len(kernels)], cid, gen, t_end, beats)
                 for i, (cid, gen) in enumerate(leases)]
    else:
        loops = [paced(kernels[i % len(kernels)], cid, gen, interval, t0, t_end, beats)
                 for i, (cid, gen) in enumerate(leases)]
    await asyncio.gather(*loops)
    elapsed = max(t_end, beats.last_end) - t0
    cpu = meter.stop()
    after = table_updates(db)
    n = len(leases)
    row: dict[str, Any] = {
        "mode": "max" if interval is None else "paced",
        "leases": n,
        "connections": sum(s._pool.max_size for s in sessions),  # noqa: SLF001
        "interval_s": interval,
        "duration_s": round(elapsed, 2),
        "offered_per_s": None if interval is None else round(n / interval),
        "heartbeats_per_s": round(beats.completed / elapsed),
        "completed": beats.completed,
        "lost": beats.failed + beats.skipped,
        "late": beats.late,
        "latency_ms": percentiles(beats.latencies),
        **{k: v for k, v in cpu.items() if k != "wall_s"},
        # pg_stat counters are flushed lazily (~1 s): indicative only
        "campaign_hot_pct": _hot_pct(before, after, "campaign"),
        "attempt_hot_pct": _hot_pct(before, after, "attempt"),
    }
    if beats.errors:
        row["errors"] = beats.errors
    return row


def _hot_pct(before: dict[str, int], after: dict[str, int], table: str) -> float | None:
    upd = after.get(f"{table}_upd", 0) - before.get(f"{table}_upd", 0)
    hot = after.get(f"{table}_hot", 0) - before.get(f"{table}_hot", 0)
    return round(100.0 * hot / upd, 1) if upd else None


async def _scenario(ctx: Context, n: int, runs: list[tuple[float | None, float]]) -> list[dict[str, Any]]:
    rows = []
    with ctx.ledger() as db:
        leases = lease(db, n, WORKERS)
        sessions = [db.session("worker", min_size=POOL, max_size=POOL) for _ in range(WORKERS)]
        for s in sessions:
            await s.open()
        try:
            # a short warm-up: pools filled, statements prepared (psycopg prepares
            # a statement after 5 executions on a connection)
            await measure(db, sessions, leases[: 4 * WORKERS * POOL], None, 0.3)
            for interval, duration in runs:
                rows.append(await measure(db, sessions, leases, interval, duration))
        finally:
            for s in sessions:
                await s.close()
    return rows


async def run(ctx: Context) -> Section:
    section = Section(name="heartbeat", title="Heartbeat load: N live leases heartbeating "
                      "through Kernel.heartbeat (fenced by generation)")
    if ctx.quick:
        plan = [(200, [(0.125, 5.0), (None, 2.0)])]
    else:
        plan = [(1000, [(0.5, 20.0), (None, 5.0)]), (200, [(0.125, 10.0), (None, 5.0)])]
    for n, runs in plan:
        section.rows.extend(await _scenario(ctx, n, runs))
    main = section.rows[0]  # the paced run of the largest N
    rate = main["heartbeats_per_s"]
    section.targets.append(Target(
        name="heartbeats/s sustained", goal="≥ 1,000/s",
        value=(f"{rate:,}/s of {main['offered_per_s']:,}/s offered ({main['leases']} leases every "
               f"{main['interval_s']:g} s; {main['lost']} lost, {main['late']} late; "
               f"db {main['db_cpu_cores']} cores)"),
        met=rate >= 1000))
    ceiling = max((r for r in section.rows if r["mode"] == "max"), key=lambda r: r["heartbeats_per_s"])
    section.notes += [
        f"{WORKERS} simulated worker processes x {POOL} connections (Sessions acting as the "
        "worker role), leases spread round-robin; all in one Python process, so "
        "client_cpu_cores is the whole fleet's client CPU.",
        "paced: fixed-rate schedule with random phase per lease; lost = failed + beats skipped "
        "because the previous one was still running a whole interval later; late = completed "
        "more than one interval after its scheduled time.",
        f"ceiling (max mode): {ceiling['heartbeats_per_s']:,}/s with {ceiling['leases']} loops "
        f"at once, db {ceiling['db_cpu_cores']} cores, client {ceiling['client_cpu_cores']} cores.",
        "Each heartbeat is one transaction of two UPDATEs (campaign: lease_expires_at and, via "
        "the guard trigger, updated_at -- both indexed, so never HOT; attempt: heartbeat "
        "columns, HOT-able) and a WAL flush at commit (synchronous_commit as the server has it).",
        "db_cpu_cores counts only the backends of this benchmark's connections; "
        "db_cpu_cores_all is every postgres process on the machine (other databases included).",
    ]
    return section


# --- running alone ------------------------------------------------------------------


if __name__ == "__main__":
    cli(run, __doc__)
