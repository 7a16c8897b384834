"""What every benchmark shares: a server, throwaway databases on it, the
machine's description, and the shape of a result.

Benchmarks print figures and never assert. Each section module exposes
``async def run(ctx: Context) -> Section``; ``python -m bench`` runs them in
one invocation against one server so their ratios are comparable, and writes
``bench/results/<stamp>.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import signal
import statistics
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from ledger import Database, logs
from ledger.db import migrations
from ledger.db.embedded import create_database, discard, drop_database, server_url

PREFIX = os.environ.get("LEDGER_BENCH_ROLE_PREFIX", "ledgerbench_")
SETTINGS = ("server_version", "shared_buffers", "synchronous_commit", "fsync", "wal_level",
            "max_connections", "work_mem", "checkpoint_timeout", "max_wal_size", "jit")


@dataclass
class Target:
    """One goal of the issue, as measured in this run."""
    name: str
    goal: str
    value: str
    met: bool | None  # None: not measured in this run

    def line(self) -> str:
        """One printed line: what was measured against the goal."""
        verdict = {True: "met", False: "MISSED", None: "n/a"}[self.met]
        return f"{self.name}: {self.value} (goal {self.goal}) -> {verdict}"


@dataclass
class Section:
    """One benchmark's figures: a table (rows of equal keys), its targets and notes."""
    name: str
    title: str
    rows: list[dict[str, Any]] = field(default_factory=list)
    targets: list[Target] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Context:
    """Where and how big: the admin URL of the server every section uses."""
    admin_url: str
    quick: bool = False
    concurrency: Sequence[int] = (1, 2, 4, 8)

    @contextmanager
    def database(self, *, migrated: bool = True) -> Iterator[str]:
        """A fresh database (migrated for Ledger unless told otherwise), dropped after."""
        name = f"ledgerbench_{uuid.uuid4().hex[:8]}"
        url = create_database(self.admin_url, name)
        try:
            if migrated:
                migrations.upgrade(url, PREFIX)
            yield url
        finally:
            drop_database(self.admin_url, name)

    @contextmanager
    def ledger(self) -> Iterator[Database]:
        """A fresh migrated database as a Ledger ``Database``."""
        with self.database() as url:
            yield self.as_ledger(url)

    @staticmethod
    def as_ledger(url: str) -> Database:
        """A migrated database's URL as a Ledger ``Database`` (bench roles)."""
        return Database(url, role_prefix=PREFIX)


def _exit_on_signal(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


@contextmanager
def server(explicit: str | None = None) -> Iterator[str]:
    """The admin URL of the server to measure: ``explicit``,
    LEDGER_BENCH_DATABASE_URL, or a throwaway embedded PostgreSQL 18 that is
    stopped and deleted when the block ends.

    The embedded library stops its server only from an ``atexit`` hook, which
    a process ended by SIGTERM or SIGHUP never runs: a benchmark stopped that
    way left its server running. Inside the block those signals end the run
    as an exit, through the block's own cleanup."""
    url = explicit or os.environ.get("LEDGER_BENCH_DATABASE_URL")
    if url:
        yield url
        return
    root = Path(tempfile.mkdtemp(prefix="ledger-bench-pg-"))
    previous = {sig: signal.signal(sig, _exit_on_signal) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield server_url(root, cleanup="delete")
    finally:
        discard(root)
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@contextmanager
def bench_database() -> Iterator[Database]:
    """A fresh migrated database on the default server (for single scripts)."""
    with server() as url, Context(url).ledger() as db:
        yield db


def server_version(db: Database) -> str:
    """The server's version string, for the printout."""
    with db.connect_sync(None) as conn:
        return conn.execute("SHOW server_version").fetchone()["server_version"]


def describe_server(url: str) -> dict[str, str]:
    """The settings that decide throughput, as the server reports them."""
    with psycopg.connect(url) as conn:
        return {name: conn.execute(f"SHOW {name}").fetchone()[0] for name in SETTINGS}


def describe_machine() -> dict[str, Any]:
    """Enough of the machine to compare runs: CPUs, memory, Python."""
    try:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        mem = None
    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"host": platform.node(), "cpus": os.cpu_count(), "cpu": cpu,
            "memory_gib": round(mem / 2**30, 1) if mem else None,
            "python": platform.python_version(), "platform": platform.platform()}


def percentiles(values: Sequence[float], scale: float = 1000.0) -> dict[str, float]:
    """p50/p95/p99/max of ``values`` (seconds), in milliseconds by default."""
    ordered = sorted(values)
    if not ordered:
        return {"n": 0}

    def at(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * scale, 3)
    return {"n": len(ordered), "p50": round(statistics.median(ordered) * scale, 3),
            "p95": at(0.95), "p99": at(0.99), "max": round(ordered[-1] * scale, 3)}


def add_server_arguments(parser: argparse.ArgumentParser) -> None:
    """``--quick`` and ``--database-url``, as every entry point takes them."""
    parser.add_argument("--quick", action="store_true", help="a smoke run: small sizes, few samples")
    parser.add_argument("--database-url", help="admin URL of the server to measure "
                        "(default: LEDGER_BENCH_DATABASE_URL, else a throwaway embedded PostgreSQL 18)")


def cli(run: Callable[[Context], Awaitable[Section]], doc: str | None) -> None:
    """Run one section alone: ``python -m bench.<name> [--quick] [--database-url URL]``."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_server_arguments(parser)
    args = parser.parse_args()
    logs.configure("warning")
    started = time.perf_counter()
    with server(args.database_url) as url:
        section = asyncio.run(run(Context(url, quick=args.quick)))
    print(f"== {section.title} ({time.perf_counter() - started:.1f} s)")
    for row in section.rows:
        print(json.dumps(row, default=str, ensure_ascii=False))
    for t in section.targets:
        print(f"target {t.line()}")
    for note in section.notes:
        print(f"note: {note}")
    for key, value in section.extra.items():
        print(f"{key}: {json.dumps(value, default=str, ensure_ascii=False)}")
