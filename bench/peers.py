"""Peers: two PostgreSQL job queues, Procrastinate and PGQueuer, measured on
the same server in the same run as Ledger, so that their figures can be set
beside Ledger's.

Each peer gets its own fresh database, with its schema installed through its
own API (Procrastinate's ``schema_manager.apply_schema_async()``, PGQueuer's
``Queries.install()``). The section measures:

* one-at-a-time throughput: how long it takes to drain the same number of
  pre-enqueued no-op jobs (quick: 1,000; full: 5,000) at matched concurrency N,
  for each N in ``ctx.concurrency``, with every claim taking one job. For
  Procrastinate that is one worker with ``concurrency=N`` (one fetch loop, up
  to N jobs in flight, a pool of max(N)+2 connections). For PGQueuer it is N
  ``QueueManager``s with ``batch_size=1``, each on its own connection, because
  one QueueManager claims serially on its one connection whatever its task
  limit. The clock runs from the worker's start (connections already open) to
  the last job's function running. Enqueueing is not timed.
* PGQueuer in batches of 10 and of 100: the same drain with N =
  max(``ctx.concurrency``) QueueManagers, each claiming up to a batch in one
  round trip and running its jobs concurrently. That N is the one Ledger's
  batch claimers use (bench/cycle.py), so these are the rows (mode
  "batch 10"/"batch 100") set against Ledger's batches. The same drain with a
  single QueueManager -- one PGQueuer worker, its natural batch setup, and on
  a small machine often the faster -- goes to
  ``extra["pgqueuer_batch_one_worker_jobs_per_s"]``.
* idle wake latency: an idle worker (Procrastinate concurrency 1 with
  ``listen_notify``; one PGQueuer QueueManager in continuous mode) is already
  waiting on LISTEN/NOTIFY. Jobs are enqueued one at a time, each after the
  previous one has started plus a jittered gap, so every job finds the worker
  idle. The latency runs from the enqueue call returning (committed) to the
  job function starting, both read with ``time.perf_counter()`` in this
  process.

Every run counts the jobs its function saw and checks the database afterwards
(Procrastinate: all rows ``succeeded``; PGQueuer: queue empty, every job logged
``successful``). A shortfall becomes a note, not a crash. The peers' loggers
are set to ERROR, so logging costs them no more than their own level checks.

PGQueuer is driven through asyncpg, its primary driver (``pip install asyncpg``).
Its psycopg driver is not used: it holds the connection's lock inside
``notifies(timeout=1.0)``, so every query on a listening connection waits for
the next NOTIFY or for that second, which puts its wake latency near 2 s.

usage: python -m bench.peers [--quick] [--database-url URL]
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from typing import Any, Self

import psycopg

from bench.harness import Context, Section, cli, percentiles

ENTRYPOINT = "bench_noop"
QUEUE = "bench"
DRAIN_TIMEOUT_S = 120.0  # a drain still unfinished by then is given up on (and noted)
WAKE_TIMEOUT_S = 5.0  # how long one wake sample may take before it is noted as lost


def library_versions() -> dict[str, str]:
    out = {}
    for name in ("procrastinate", "pgqueuer", "asyncpg", "psycopg", "psycopg-pool"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = "not installed"
    return out


def quiet_peers() -> None:
    """Both peers log every job (INFO/DEBUG) and Procrastinate warns when its
    App is built in ``__main__``: keep their loggers at ERROR."""
    for name in ("procrastinate", "pgqueuer"):
        logging.getLogger(name).setLevel(logging.ERROR)


@dataclass
class Tally:
    """What a run's job function saw: ``done`` fires when ``expected`` jobs
    ran, ``arrived`` at every job (the wake loop clears it before each enqueue)."""
    expected: int
    seen: int = 0
    last_at: float = 0.0
    started: dict[int, float] = field(default_factory=dict)
    done: asyncio.Event = field(default_factory=asyncio.Event)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)

    def hit(self, sample: int | None = None) -> None:
        now = time.perf_counter()
        if sample is not None:
            self.started[sample] = now
        self.seen += 1
        self.arrived.set()
        if self.seen >= self.expected:
            self.last_at = now
            self.done.set()


@dataclass
class Drain:
    """One measured drain: jobs run, seconds from the worker's start to the last job."""
    jobs: int
    seconds: float
    problems: list[str]


def rate(drain: Drain) -> float:
    return round(drain.jobs / drain.seconds, 1) if drain.seconds > 0 else 0.0


def drain_row(peer: str, mode: str, concurrency: int, drain: Drain) -> dict[str, Any]:
    return {"peer": peer, "mode": mode, "concurrency": concurrency, "jobs": drain.jobs,
            "seconds": round(drain.seconds, 3), "jobs_per_s": rate(drain)}


def wake_row(peer: str, stats: dict[str, float]) -> dict[str, Any]:
    """A wake row leaves out seconds and jobs_per_s (the report leaves those cells
    blank) and carries the latency percentiles in ms instead."""
    return {"peer": peer, "mode": "wake", "concurrency": 1, "jobs": int(stats.get("n", 0)),
            **{f"{k}_ms": stats[k] for k in ("p50", "p95", "p99", "max") if k in stats}}


async def settle(task: asyncio.Future[Any], stop: Callable[[], Any], grace_s: float) -> None:
    """Let a worker task end by itself within ``grace_s``; then ask it to stop,
    and past ten more seconds cancel it. Never raises the task's own error."""
    done, _ = await asyncio.wait({task}, timeout=grace_s) if grace_s > 0 else (set(), None)
    if not done and not task.done():
        stop()
        done, _ = await asyncio.wait({task}, timeout=10)
    if not done and not task.done():
        task.cancel()
    with contextlib.suppress(Exception, asyncio.CancelledError):
        await task


def task_error(task: asyncio.Future[Any]) -> str | None:
    if task.cancelled() or not task.done() or task.exception() is None:
        return None
    return repr(task.exception())


async def wake_samples(tally: Tally, samples: int, gap_s: float,
                       enqueue: Callable[[int], Awaitable[Any]]) -> tuple[list[float], list[str]]:
    """Enqueue ``samples`` jobs one at a time into an idle worker; return the
    latencies from each enqueue call's return to its job's start."""
    committed: dict[int, float] = {}
    problems: list[str] = []
    for i in range(samples):
        tally.arrived.clear()
        await enqueue(i)
        committed[i] = time.perf_counter()
        try:
            await asyncio.wait_for(tally.arrived.wait(), WAKE_TIMEOUT_S)
        except TimeoutError:
            problems.append(f"wake sample {i} did not start within {WAKE_TIMEOUT_S:g} s")
        # Jittered, so that no enqueue keeps landing at the same phase of a peer's timers.
        await asyncio.sleep(gap_s * random.uniform(0.75, 1.25))
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(tally.done.wait(), WAKE_TIMEOUT_S)
    if tally.seen != samples:
        problems.append(f"{samples} jobs enqueued, the function ran {tally.seen}")
    latencies = [tally.started[i] - t for i, t in committed.items() if i in tally.started]
    return latencies, problems


# --------------------------------------------------------------------------- Procrastinate


class ProcrastinatePeer:
    """An App on its own database (psycopg pool), with one async no-op task."""

    name = "procrastinate"

    def __init__(self, url: str, pool_size: int) -> None:
        import procrastinate

        self.url = url
        self.app = procrastinate.App(connector=procrastinate.PsycopgConnector(
            conninfo=url, min_size=pool_size, max_size=pool_size))
        self.tally = Tally(0)

        @self.app.task(name=ENTRYPOINT, queue=QUEUE)
        async def noop(i: int | None = None) -> None:
            self.tally.hit(i)

        self.task = noop

    async def __aenter__(self) -> Self:
        await self.app.open_async()
        await self.app.schema_manager.apply_schema_async()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.app.close_async()

    async def sql(self, query: str) -> list[tuple[Any, ...]]:
        async with await psycopg.AsyncConnection.connect(self.url, autocommit=True) as conn:
            cur = await conn.execute(query)
            return await cur.fetchall() if cur.description else []

    async def reset(self) -> None:
        await self.sql("TRUNCATE procrastinate_jobs, procrastinate_workers CASCADE")

    async def enqueue(self, n: int) -> None:
        for start in range(0, n, 1000):
            await self.task.batch_defer_async(*({} for _ in range(min(1000, n - start))))
        await self.sql("ANALYZE procrastinate_jobs")

    async def drain(self, n: int, concurrency: int) -> Drain:
        await self.reset()
        await self.enqueue(n)
        self.tally = Tally(n)
        start = time.perf_counter()
        # wait=False: the worker stops by itself once it finds the queue empty.
        worker = asyncio.ensure_future(self.app.run_worker_async(
            queues=[QUEUE], concurrency=concurrency, wait=False,
            install_signal_handlers=False, name=f"bench-{concurrency}"))
        finished = asyncio.ensure_future(self.tally.done.wait())
        await asyncio.wait({worker, finished}, timeout=DRAIN_TIMEOUT_S,
                           return_when=asyncio.FIRST_COMPLETED)
        end = self.tally.last_at if self.tally.done.is_set() else time.perf_counter()
        finished.cancel()
        await settle(worker, worker.cancel, DRAIN_TIMEOUT_S)
        problems = [f"worker raised {e}"] if (e := task_error(worker)) else []
        status = dict(await self.sql(
            "SELECT status::text, count(*) FROM procrastinate_jobs GROUP BY 1"))
        if self.tally.seen != n or status.get("succeeded", 0) != n:
            problems.append(f"{n} jobs enqueued, the function ran {self.tally.seen}, "
                            f"the jobs table says {status}")
        return Drain(self.tally.seen, end - start, problems)

    async def wake(self, samples: int, gap_s: float) -> tuple[list[float], list[str]]:
        await self.reset()
        self.tally = Tally(samples)
        worker = asyncio.ensure_future(self.app.run_worker_async(
            queues=[QUEUE], concurrency=1, wait=True, listen_notify=True,
            install_signal_handlers=False, name="bench-wake"))
        await asyncio.sleep(0.5)  # registered, listening, found nothing: idle
        try:
            latencies, problems = await wake_samples(
                self.tally, samples, gap_s, lambda i: self.task.defer_async(i=i))
        finally:
            await settle(worker, worker.cancel, 0)
        if e := task_error(worker):
            problems.append(f"worker raised {e}")
        return latencies, problems


# --------------------------------------------------------------------------- PGQueuer


def asyncpg_params(url: str) -> dict[str, Any]:
    """asyncpg does not read libpq conninfo strings (ctx.database() gives one):
    map one, or a URL, to asyncpg.connect()'s keywords."""
    from psycopg.conninfo import conninfo_to_dict

    names = {"host": "host", "hostaddr": "host", "port": "port", "user": "user",
             "password": "password", "dbname": "database"}
    out: dict[str, Any] = {names[k]: v for k, v in conninfo_to_dict(url).items()
                           if k in names and v}
    if "port" in out:
        out["port"] = int(out["port"])
    return out


class PgQueuerPeer:
    """A PGQueuer install on its own database. Consumers are QueueManagers on
    asyncpg connections of their own; the producer has one more."""

    name = "pgqueuer"

    def __init__(self, url: str) -> None:
        self.params = asyncpg_params(url)
        self.tally = Tally(0)
        self.producer: Any = None
        self.conn: Any = None

    async def connect(self) -> Any:
        import asyncpg

        return await asyncpg.connect(**self.params)

    async def __aenter__(self) -> Self:
        from pgqueuer import AsyncpgDriver, Queries

        self.conn = await self.connect()
        self.producer = Queries(AsyncpgDriver(self.conn))
        await self.producer.install()
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.conn is not None:
            await self.conn.close()

    @property
    def tables(self) -> Any:
        return self.producer.qbe.settings

    async def reset(self) -> None:
        t = self.tables
        await self.conn.execute(
            f"TRUNCATE {t.queue_table}, {t.queue_table_log}, {t.statistics_table}")

    async def enqueue(self, n: int) -> None:
        for start in range(0, n, 1000):
            k = min(1000, n - start)
            await self.producer.enqueue([ENTRYPOINT] * k, [None] * k, [0] * k)
        await self.conn.execute(f"ANALYZE {self.tables.queue_table}")

    def manager(self, conn: Any) -> Any:
        from pgqueuer import AsyncpgDriver, Job, Queries, QueueManager

        qm = QueueManager(Queries(AsyncpgDriver(conn)))

        async def noop(job: Job) -> None:
            self.tally.hit(int(job.payload) if job.payload else None)

        qm.entrypoint(ENTRYPOINT, accepts_context=False)(noop)
        return qm

    async def consumers(self, count: int, run: Callable[[Any], Awaitable[None]],
                        body: Callable[[list[asyncio.Future[None]]], Awaitable[None]],
                        ) -> list[str]:
        """Open ``count`` connections, run a QueueManager on each while ``body``
        runs (given their tasks), then shut every one down and close the
        connections; return what went wrong."""
        conns = []
        problems: list[str] = []
        try:
            for _ in range(count):
                conns.append(await self.connect())
            managers = [self.manager(c) for c in conns]
            tasks = [asyncio.ensure_future(run(qm)) for qm in managers]
            try:
                await body(tasks)
            finally:
                for qm, task in zip(managers, tasks, strict=True):
                    await settle(task, qm.shutdown.set, 0)
                    if e := task_error(task):
                        problems.append(f"consumer raised {e}")
        finally:
            for c in conns:
                await c.close()
        return problems

    async def drain(self, n: int, consumers: int, batch_size: int) -> Drain:
        from pgqueuer.types import QueueExecutionMode

        await self.reset()
        await self.enqueue(n)
        self.tally = Tally(n)
        clock: dict[str, float] = {}

        async def run(qm: Any) -> None:
            # drain: each QueueManager returns once it finds the queue empty.
            await qm.run(batch_size=batch_size, mode=QueueExecutionMode.drain)

        async def body(tasks: list[asyncio.Future[None]]) -> None:
            clock["start"] = time.perf_counter()
            finished = asyncio.ensure_future(self.tally.done.wait())
            # Over when every job ran, or when every consumer has quit (some jobs lost).
            await asyncio.wait({finished, asyncio.gather(*tasks, return_exceptions=True)},
                               timeout=DRAIN_TIMEOUT_S, return_when=asyncio.FIRST_COMPLETED)
            clock["end"] = self.tally.last_at if self.tally.done.is_set() else time.perf_counter()
            finished.cancel()

        problems = await self.consumers(consumers, run, body)
        left = await self.conn.fetchval(f"SELECT count(*) FROM {self.tables.queue_table}")
        logged = await self.conn.fetchval(
            f"SELECT count(*) FROM {self.tables.queue_table_log} WHERE status = 'successful'")
        if self.tally.seen != n or left or logged != n:
            problems.append(f"{n} jobs enqueued, the function ran {self.tally.seen}, "
                            f"{left} left in the queue, {logged} logged successful")
        return Drain(self.tally.seen, clock["end"] - clock["start"], problems)

    async def wake(self, samples: int, gap_s: float) -> tuple[list[float], list[str]]:
        await self.reset()
        self.tally = Tally(samples)
        out: dict[str, Any] = {}

        async def run(qm: Any) -> None:
            await qm.run(batch_size=1)  # continuous: idles on LISTEN/NOTIFY

        async def body(tasks: list[asyncio.Future[None]]) -> None:
            await asyncio.sleep(0.5)  # listening, found nothing: idle
            out["latencies"], out["problems"] = await wake_samples(
                self.tally, samples, gap_s,
                lambda i: self.producer.enqueue(ENTRYPOINT, str(i).encode()))

        problems = await self.consumers(1, run, body)
        return out.get("latencies", []), out.get("problems", []) + problems


# --------------------------------------------------------------------------- the section


async def best_drain(rounds: int, drain: Callable[[], Awaitable[Drain]]) -> Drain:
    """The fastest of ``rounds`` drains (the machine is shared; the fastest is
    the least disturbed), with every run's problems."""
    runs = [await drain() for _ in range(rounds)]
    best = max(runs, key=rate)
    return Drain(best.jobs, best.seconds, [p for r in runs for p in r.problems])


def missing(*modules: str) -> list[str]:
    return [m for m in modules if importlib.util.find_spec(m) is None]


async def run(ctx: Context) -> Section:
    quiet_peers()
    section = Section(name="peers", title="Peers: Procrastinate and PGQueuer on the same server")
    section.extra["versions"] = library_versions()
    n = 1000 if ctx.quick else 5000
    rounds = 1 if ctx.quick else 3  # best of, as bench/cycle.py does for Ledger
    samples = 50 if ctx.quick else 200
    gap_s = 0.03 if ctx.quick else 0.05
    levels = list(ctx.concurrency)
    top = max(levels)
    wake: dict[str, Any] = {}
    one_worker: dict[str, float] = {}

    def note(peer: str, what: str, problems: list[str]) -> None:
        section.notes.extend(f"{peer} {what}: {p}" for p in problems)

    if lacking := missing("procrastinate"):
        section.notes.append(f"procrastinate skipped: {', '.join(lacking)} not installed")
    else:
        try:
            with ctx.database(migrated=False) as url:
                async with ProcrastinatePeer(url, pool_size=top + 2) as peer:
                    for level in levels:
                        drain = await best_drain(rounds, lambda lv=level: peer.drain(n, lv))
                        note(peer.name, f"one-at-a-time N={level}", drain.problems)
                        section.rows.append(drain_row(peer.name, "one-at-a-time", level, drain))
                    latencies, problems = await peer.wake(samples, gap_s)
                    note(peer.name, "wake", problems)
                    wake[peer.name] = percentiles(latencies)
        except Exception as exc:  # noqa: BLE001 -- a broken peer must not stop the suite
            section.notes.append(f"procrastinate stopped early: {exc!r}")

    if lacking := missing("pgqueuer", "asyncpg"):
        section.notes.append(f"pgqueuer skipped: {', '.join(lacking)} not installed "
                             "(pip install pgqueuer asyncpg)")
    else:
        try:
            with ctx.database(migrated=False) as url:
                async with PgQueuerPeer(url) as peer:
                    for level in levels:
                        drain = await best_drain(rounds, lambda lv=level: peer.drain(n, lv, 1))
                        note(peer.name, f"one-at-a-time N={level}", drain.problems)
                        section.rows.append(drain_row(peer.name, "one-at-a-time", level, drain))
                    for batch in (10, 100):
                        drain = await best_drain(rounds, lambda b=batch: peer.drain(n, top, b))
                        note(peer.name, f"batch {batch} N={top}", drain.problems)
                        section.rows.append(drain_row(peer.name, f"batch {batch}", top, drain))
                        if top != 1:  # one QueueManager as well: into extra, not rows
                            drain = await best_drain(rounds, lambda b=batch: peer.drain(n, 1, b))
                            note(peer.name, f"batch {batch} N=1", drain.problems)
                            one_worker[f"batch {batch}"] = rate(drain)
                    latencies, problems = await peer.wake(samples, gap_s)
                    note(peer.name, "wake", problems)
                    wake[peer.name] = percentiles(latencies)
        except Exception as exc:  # noqa: BLE001 -- a broken peer must not stop the suite
            section.notes.append(f"pgqueuer stopped early: {exc!r}")

    if rounds > 1:
        section.notes.append(f"Each drain figure is the best of {rounds} runs, as Ledger's are.")
    section.rows.extend(wake_row(peer, stats) for peer, stats in wake.items())
    section.extra["wake"] = wake
    if one_worker:
        section.extra["pgqueuer_batch_one_worker_jobs_per_s"] = one_worker
    section.notes.append(
        f"Throughput: {n} pre-enqueued no-op jobs per run, timed from the worker's start to "
        "the last job's function running; enqueueing untimed. Procrastinate: one worker, "
        "concurrency=N, one job per fetch. PGQueuer one-at-a-time: N QueueManagers, one "
        f"connection each, batch_size=1. PGQueuer batches (rows): N={top} QueueManagers, "
        "the N of Ledger's batch claimers, each claiming up to the batch per dequeue and "
        "running those jobs concurrently; the same with one QueueManager is in "
        f"extra.pgqueuer_batch_one_worker_jobs_per_s: {one_worker or 'not run (N=1)'}.")
    section.notes.append(
        f"Wake: {samples} jobs, one at a time, each enqueued once the previous one had "
        f"started plus ~{gap_s * 1000:.0f} ms; latency from the enqueue call returning "
        "(committed) to the job function starting (time.perf_counter(), same process). "
        "Procrastinate: worker concurrency=1, listen_notify=True; PGQueuer: one "
        "QueueManager, batch_size=1, continuous mode. Both idle on LISTEN/NOTIFY.")
    return section


if __name__ == "__main__":
    cli(run, __doc__)
