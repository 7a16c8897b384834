"""Ledger behind PgBouncer in transaction mode (issue 15): many worker
connections through a few server connections, against the same workers
connected directly.

- **direct**: N workers, each with its own connection to the server, drain
  pre-opened campaigns (``claim_campaign`` + ``record_attempt``, as in
  ``bench.cycle``).
- **pooled**: the same N workers, each with its own client connection to a
  PgBouncer (``pool_mode=transaction``, ``default_pool_size=M``) started here
  on a free port in front of the same server; no server-side prepared
  statements (``Database.pooled``).

The figures: campaigns/s for each, and the server connections the pooled run
used at most (``pg_stat_activity``, sampled while it runs).

usage: python -m bench.pooler [--quick] [--database-url URL]
(needs Debian's ``pgbouncer``; run as root it drops to ``nobody``)
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from bench.cycle import SHA, fill, timed
from bench.harness import PREFIX, Context, Section, cli
from ledger import Database, Kernel


@contextmanager
def pgbouncer(server_url: str, pool_size: int) -> Iterator[dict[str, str]]:
    """A PgBouncer in transaction mode in front of ``server_url``; yields the
    host and port to connect to instead."""
    binary = shutil.which("pgbouncer") or shutil.which("pgbouncer", path="/usr/sbin")
    if binary is None:
        raise SystemExit("pgbouncer is not installed (apt-get install pgbouncer)")
    server = conninfo_to_dict(server_url)
    work = Path(tempfile.mkdtemp(prefix="ledger-bench-pgbouncer-"))
    work.chmod(0o777)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    (work / "users.txt").write_text(f'"{server.get("user") or "postgres"}" "{server.get("password") or ""}"\n')
    target = " ".join(f"{k}={server[k]}" for k in ("host", "port") if server.get(k))
    (work / "pgbouncer.ini").write_text(
        f"[databases]\n* = {target}\n[pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = {port}\n"
        f"unix_socket_dir =\nauth_type = trust\nauth_file = {work / 'users.txt'}\n"
        f"pool_mode = transaction\ndefault_pool_size = {pool_size}\nmax_client_conn = 1000\n"
        f"logfile = {work / 'pgbouncer.log'}\n")
    command = [binary, *(["-u", "nobody"] if os.geteuid() == 0 else []), str(work / "pgbouncer.ini")]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while True:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("pgbouncer did not start")
            time.sleep(0.05)
        yield {"host": "127.0.0.1", "port": str(port)}
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        shutil.rmtree(work, ignore_errors=True)


async def drain(db: Database, workers: int, n: int, sample: Database) -> tuple[int, float, int]:
    """``n`` fresh campaigns drained by ``workers`` workers, one connection
    each; (done, seconds, most server connections seen on the database)."""
    class_ = fill(sample, n)
    sessions = [await db.session("worker", min_size=1, max_size=1).open() for _ in range(workers)]
    seen = 0
    running = True

    async def watch() -> None:
        nonlocal seen
        async with await psycopg.AsyncConnection.connect(sample.url, autocommit=True) as conn:
            while running:
                row = await (await conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND pid <> pg_backend_pid()")).fetchone()
                seen = max(seen, int(row[0]) if row else 0)
                await asyncio.sleep(0.05)

    async def loop(i: int) -> int:
        kernel, done = Kernel(sessions[i]), 0
        while claim := await kernel.claim_campaign(f"bench-{i}", [class_]):
            await kernel.record_attempt(claim.campaign_id, claim.generation, base_sha=SHA,
                                        candidate_sha=SHA, fingerprint=f"bench:{claim.campaign_id:08d}")
            done += 1
        return done

    watcher = asyncio.create_task(watch())
    try:
        done, seconds = await timed(workers, loop)
    finally:
        running = False
        await watcher
        for s in sessions:
            await s.close()
    return done, seconds, seen


async def run(ctx: Context) -> Section:
    n = 1000 if ctx.quick else 4000
    workers, pool = (16, 4) if ctx.quick else (64, 8)
    section = Section("pooler", f"{workers} workers through PgBouncer (transaction mode, "
                                f"{pool} server connections) and direct")
    with ctx.database() as url, pgbouncer(url, pool) as bouncer:
        direct = Database(url, role_prefix=PREFIX)
        pooled = Database(make_conninfo(url, **bouncer), role_prefix=PREFIX, pooled=True)
        for what, db in (("direct", direct), ("pooled", pooled), ("direct", direct), ("pooled", pooled)):
            done, seconds, servers = await drain(db, workers, n, direct)
            section.rows.append({"what": what, "workers": workers, "campaigns": done,
                                 "seconds": round(seconds, 2), "per_s": round(done / seconds),
                                 "server_connections_max": servers})
    section.notes.append("each worker: its own client connection and claim_campaign + "
                         "record_attempt per campaign; server_connections_max: the most "
                         "backends on the database while draining, the sampler not counted")
    return section


if __name__ == "__main__":
    cli(run, __doc__)
