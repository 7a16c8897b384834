"""Journal amplification: what a chatty attempt costs the journal, whether its
output survives intact, and how far behind a live tail follows.

One claimed campaign (a live attempt) produces 10,000 output lines per second
for 10 s (quick: 3 s). The output goes through Ledger's ``JournalWriter``
exactly as ``AttemptRun`` wires it: ``attempt.started`` and
``command.started`` written at once, the command's output handed to
``JournalWriter.output`` as the byte chunks a pipe delivers (every 10 ms,
split at arbitrary byte offsets, UTF-8 characters cut in two included), so
output is coalesced and flushed at most every 250 ms, then
``command.exited`` and ``close()``. The writer's ``Kernel`` is a worker-role
``Session`` (pool of concurrency + 2, as ``Worker.run`` opens it).

Meanwhile a follower runs Ledger's ``tail`` iterator over the journal, as the
HTTP API's event stream and ``ledger journal --follow`` do: a reader-role
``Session`` and a ``Hub`` (LISTEN/NOTIFY wake-ups, 1 s poll tick).

Reported: journal rows written (output rows, all rows, append calls), rows per
second per live attempt (target <= 4), bytes (text produced; octet_length of
the stored payloads; their on-disk size, pg_column_size; the growth of
pg_total_relation_size of ``ledger.campaign_event``; WAL written -- server-wide,
so other databases' load on a shared server is included), whether the full
text is preserved (the text joined from the journal's output rows, in seq
order, equals the produced text byte for byte; checked both from the table
after the run and from what the tail yielded), and the tail's lag: from the
moment a line was handed to the writer to the moment the tail yielded the
event that completes it (p50/p95/p99/max). Also 10 concurrent attempts at
1,000 lines/s each (one worker process, one pool; 10 tails over one hub).

The writer is given ``limit_bytes`` large enough for the whole output (as a
class with a large ``log_limit_bytes`` would): the default class limit is
256 KiB per attempt, beyond which the output is deliberately not journaled
(the full run also measures that default, where "preserved" is then false by
design).

usage: python -m bench.journal [--quick] [--database-url URL]
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Sequence
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any

from bench.harness import Context, Section, Target, cli, percentiles
from bench.heartbeat import CpuMeter
from ledger import Database, Kernel, Reads
from ledger.db.hub import Hub
from ledger.roles.journal import CHUNK_CHARS, JournalWriter
from ledger.tail import Keepalive, tail

TICK_S = 0.01  # a pipe read every 10 ms
BIG_LIMIT = 256 * 1024 * 1024  # journal everything
DEFAULT_LIMIT = 256 * 1024  # CampaignClassConfig.log_limit_bytes' default
WORDS = ("PASSED", "FAILED", "ok", "compiling", "collected", "warning: unused variable",
         "Downloading", "résumé ✓", "test_", "[debug]")


def line(i: int) -> str:
    """Line ``i`` of a plausible build/test log, 60-100 bytes, newline-terminated;
    every 7th carries multi-byte UTF-8."""
    word = WORDS[i % len(WORDS)]
    pad = "." * (i * 7919 % 37)
    return f"{i:08d} tests/test_module_{i % 97:02d}.py::test_case_{i % 1013} {word}{pad} [{i % 100:3d}%]\n"


class CountingKernel(Kernel):
    """The same Kernel; counts the journal append calls (statements)."""

    def __init__(self, executor: Any):
        super().__init__(executor)
        self.appends = 0

    async def append_events(self, campaign_id: int, generation: int,
                            events: Sequence[dict[str, Any]], **options: Any) -> int:
        self.appends += 1
        return await super().append_events(campaign_id, generation, events, **options)


@dataclass
class Attempt:
    campaign_id: int
    generation: int
    produced_at: list[float] = field(default_factory=list)  # per line: when handed to the writer
    produced: list[str] = field(default_factory=list)  # the text, as produced
    tail_text: list[str] = field(default_factory=list)
    lags: list[float] = field(default_factory=list)
    live_s: float = 0.0
    rows_written: int = 0
    appends: int = 0


async def produce(writer: JournalWriter, attempt: Attempt, rate: float, duration: float) -> None:
    """Hand ``rate`` lines/s to the writer for ``duration`` s, in pipe-sized
    byte chunks cut anywhere, as ``run_command``'s protocol would."""
    rng = random.Random(attempt.campaign_id)
    total = int(rate * duration)
    t0 = time.perf_counter()
    done, k = 0, 0
    while done < total:
        k += 1
        delay = t0 + k * TICK_S - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        now = time.perf_counter()
        upto = min(total, int(rate * (now - t0)))
        if upto <= done:
            continue
        text = "".join(line(i) for i in range(done, upto))
        data = text.encode()
        cut = rng.randrange(1, len(data)) if len(data) > 1 else len(data)
        attempt.produced.append(text)
        attempt.produced_at.extend([now] * (upto - done))
        writer.output(data[:cut])
        writer.output(data[cut:])
        done = upto


async def follow(reads: Reads, hub: Hub, attempt: Attempt, ready: asyncio.Event) -> None:
    """Follow the journal until ``command.exited``; time every completed line."""
    line_no = 0
    produced_at = attempt.produced_at
    started = False
    async with aclosing(tail(reads, hub, attempt.campaign_id, keepalive_s=15.0,
                             poll_s=1.0)) as items:
        async for item in items:
            if not started:  # the tail is subscribed and reading
                started = True
                ready.set()
            if isinstance(item, Keepalive):
                continue
            now = time.perf_counter()
            if item.type == "output":
                text = item.payload.get("text", "")
                attempt.tail_text.append(text)
                for _ in range(text.count("\n")):
                    if line_no < len(produced_at):
                        attempt.lags.append(now - produced_at[line_no])
                    line_no += 1
            elif item.type == "command.exited":
                return


async def live_attempt(kernel: CountingKernel, attempt: Attempt, rate: float, duration: float,
                       limit_bytes: int) -> None:
    """One attempt's journal, as AttemptRun writes it."""
    writer = JournalWriter(kernel, attempt.campaign_id, attempt.generation, limit_bytes=limit_bytes)
    t0 = time.perf_counter()
    await writer.event("attempt.started", {"attempt_no": 1, "worker": "bench"})
    await writer.event("command.started", {"argv": ["bench-output"]})
    await produce(writer, attempt, rate, duration)
    await writer.event("command.exited", {"exit_code": 0, "duration_s": duration})
    await writer.close()
    attempt.live_s = time.perf_counter() - t0
    attempt.rows_written = writer.rows_written


def journal_figures(db: Database, ids: list[int]) -> dict[str, Any]:
    with db.connect_sync(None) as conn:
        r = conn.execute(
            "SELECT count(*) AS rows, count(*) FILTER (WHERE type = 'output') AS output_rows, "
            "coalesce(sum(octet_length(payload::text)), 0) AS payload_bytes, "
            "coalesce(sum(pg_column_size(payload)), 0) AS stored_bytes "
            "FROM ledger.campaign_event WHERE campaign_id = ANY(%s) AND type <> 'transition'",
            (ids,)).fetchone()
        texts = {cid: "".join(t["text"] for t in conn.execute(
            "SELECT payload ->> 'text' AS text FROM ledger.campaign_event "
            "WHERE campaign_id = %s AND type = 'output' ORDER BY seq", (cid,)).fetchall())
            for cid in ids}
    return {**r, "texts": texts}


def relation_size(db: Database) -> tuple[int, int]:
    with db.connect_sync(None) as conn:
        r = conn.execute("SELECT pg_total_relation_size('ledger.campaign_event') AS size, "
                         "pg_current_wal_lsn() - '0/0'::pg_lsn AS lsn").fetchone()
    return int(r["size"]), int(r["lsn"])


async def measure(ctx: Context, label: str, attempts_n: int, rate: float, duration: float,
                  limit_bytes: int = BIG_LIMIT) -> dict[str, Any]:
    with ctx.ledger() as db:
        with db.connect_sync(None) as admin:
            admin.execute("SELECT ledger_api.register_class('bench', p_lease_seconds => 600)")
            admin.execute("SELECT ledger_api.open_campaign('bench', 'journal-' || i, 't') "
                          "FROM generate_series(1, %s) i", (attempts_n,))
        async with db.session("worker", max_size=attempts_n + 2) as work, \
                db.session("reader") as reading, Hub(db) as hub:
            kernel = CountingKernel(work)
            attempts = []
            for _ in range(attempts_n):
                claim = await kernel.claim_campaign("bench-worker", ["bench"])
                assert claim is not None
                attempts.append(Attempt(claim.campaign_id, claim.generation))
            reader = Reads(reading)
            size0, wal0 = relation_size(db)
            ready = [asyncio.Event() for _ in attempts]
            followers = [asyncio.create_task(follow(reader, hub, a, r))
                         for a, r in zip(attempts, ready)]
            # the tails are following before any output is produced (their first
            # item is the claim's transition event)
            async with asyncio.timeout(10):
                await asyncio.gather(*(r.wait() for r in ready))
            meter = CpuMeter(db)
            meter.start()
            t0 = time.perf_counter()
            await asyncio.gather(*(live_attempt(kernel, a, rate, duration, limit_bytes)
                                   for a in attempts))
            async with asyncio.timeout(15):
                await asyncio.gather(*followers)
            wall = time.perf_counter() - t0
            cpu = meter.stop()
            size1, wal1 = relation_size(db)
        figures = journal_figures(db, [a.campaign_id for a in attempts])
    produced = {a.campaign_id: "".join(a.produced) for a in attempts}
    in_table = all(figures["texts"][cid] == text for cid, text in produced.items())
    in_tail = all("".join(a.tail_text) == produced[a.campaign_id] for a in attempts)
    lines = sum(len(a.produced_at) for a in attempts)
    text_bytes = sum(len(t.encode()) for t in produced.values())
    live_s = sum(a.live_s for a in attempts) / len(attempts)
    rows = figures["rows"]
    return {
        "run": label,
        "attempts": attempts_n,
        "lines_per_s_each": rate,
        "seconds": duration,
        "limit_bytes": limit_bytes,
        "lines": lines,
        "text_bytes": text_bytes,
        "journal_rows": rows,
        "output_rows": figures["output_rows"],
        "append_calls": kernel.appends,
        "rows_per_s_per_attempt": round(rows / attempts_n / live_s, 2),
        "output_rows_per_s_per_attempt": round(figures["output_rows"] / attempts_n / live_s, 2),
        "appends_per_s_per_attempt": round(kernel.appends / attempts_n / live_s, 2),
        "payload_bytes": int(figures["payload_bytes"]),
        "stored_bytes": int(figures["stored_bytes"]),
        "relation_growth_bytes": size1 - size0,
        "wal_bytes_server_wide": wal1 - wal0,
        "preserved_in_table": in_table,
        "preserved_in_tail": in_tail,
        "tail_lag_ms": percentiles([lag for a in attempts for lag in a.lags]),
        "wall_s": round(wall, 2),
        **{k: v for k, v in cpu.items() if k not in ("wall_s", "db_backends", "db_cpu_s")},
    }


async def run(ctx: Context) -> Section:
    section = Section(name="journal", title="Journal amplification: 10,000 lines/s of output "
                      "through JournalWriter, followed live by a tail")
    seconds = 3.0 if ctx.quick else 10.0
    section.rows.append(await measure(ctx, "one attempt", 1, 10_000, seconds))
    section.rows.append(await measure(ctx, "10 attempts", 10, 1_000, 2.0 if ctx.quick else 10.0))
    if not ctx.quick:
        section.rows.append(await measure(ctx, "one attempt, default 256 KiB limit", 1, 10_000,
                                          3.0, limit_bytes=DEFAULT_LIMIT))
    main_row = section.rows[0]
    rps = main_row["rows_per_s_per_attempt"]
    section.targets += [
        # The burst's rows are its output rows; the attempt's three lifecycle
        # events (attempt started, command started and exited) come once per
        # attempt, not per second, and are shown beside them.
        Target(name="journal rows/s per live attempt under the burst", goal="≤ 4",
               value=(f"{main_row['output_rows_per_s_per_attempt']}/s of output "
                      f"({main_row['output_rows']} rows in {main_row['seconds']:g} s of 10,000 lines/s; "
                      f"{rps}/s with the attempt's {main_row['journal_rows'] - main_row['output_rows']} "
                      f"lifecycle events; {main_row['append_calls']} appends)"),
               met=main_row["output_rows_per_s_per_attempt"] <= 4),
        Target(name="full text preserved", goal="yes",
               value=("yes" if main_row["preserved_in_table"] and main_row["preserved_in_tail"]
                      else f"no (table: {main_row['preserved_in_table']}, "
                           f"tail: {main_row['preserved_in_tail']})"),
               met=main_row["preserved_in_table"] and main_row["preserved_in_tail"]),
    ]
    lag = main_row["tail_lag_ms"]
    section.notes += [
        f"tail lag (one attempt): p50 {lag.get('p50')} ms, p95 {lag.get('p95')} ms, "
        f"p99 {lag.get('p99')} ms, max {lag.get('max')} ms -- the 250 ms coalescing window "
        "is most of it.",
        "journal_rows counts every row the attempt wrote (structural events included, the "
        f"claim's transition excluded); output rows carry at most {CHUNK_CHARS:,} characters each.",
        "Producer, writer and tail share one Python process and event loop (in production the "
        "tail runs in the API or CLI process), so the lag includes their contention.",
        "wal_bytes_server_wide is the WAL position's advance on the whole server: other "
        "databases' writes during the run are included.",
    ]
    return section


if __name__ == "__main__":
    cli(run, __doc__)
