"""The fair comparison: for each N (1, 2, 4, 8) and each batch size (10,
100), every contender -- the raw-SQL loop, Ledger, PGQueuer, Procrastinate
(one at a time only: it has no batch claim) -- drains the same number of
jobs, **interleaved**: round after round, each round running every contender
once in an order that rotates, so a noisy spell of a shared machine lands on
all of them alike. Each run records the 1-minute load around it; each
contender is reported as the median and the best of its runs; and a ratio is
taken between runs **of the same round** (Ledger's run against the peer's run
next to it), reported as the median of the rounds.

Peers: PGQueuer in batches is set against its better configuration in the
round (N QueueManagers, or one), as a user would tune it.

usage: python -m bench.compare [--quick] [--database-url URL]
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from typing import Any

from bench.cycle import ledger_drain, raw_limit
from bench.harness import Context, Section, Target, cli
from bench.peers import PgQueuerPeer, ProcrastinatePeer, missing, quiet_peers

Run = Callable[[], Awaitable[float]]  # one drain: jobs per second


async def run(ctx: Context) -> Section:
    quiet_peers()
    section = Section("compare", "Ledger, the raw loop and the peers, interleaved on one server")
    n = 1000 if ctx.quick else 4000
    rounds = 2 if ctx.quick else 5
    levels = list(ctx.concurrency)
    top = max(levels)
    async with AsyncExitStack() as stack:
        raw_url = stack.enter_context(ctx.database(migrated=False))
        db = ctx.as_ledger(stack.enter_context(ctx.database()))
        await ledger_drain(db, 2, min(n, 1000))  # untimed: statistics on attempt and journal
        pgq = procr = None
        if not missing("pgqueuer", "asyncpg"):
            pgq = await stack.enter_async_context(PgQueuerPeer(stack.enter_context(ctx.database(migrated=False))))
        else:
            section.notes.append("pgqueuer not installed (the bench extra): not compared")
        if not missing("procrastinate"):
            procr = await stack.enter_async_context(
                ProcrastinatePeer(stack.enter_context(ctx.database(migrated=False)), pool_size=top + 2))
        else:
            section.notes.append("procrastinate not installed (the bench extra): not compared")

        def rate(drain: Callable[[], Awaitable[Any]]) -> Run:
            async def one() -> float:
                result = await drain()
                if isinstance(result, tuple):  # (items, seconds)
                    return float(result[0] / result[1])
                if result.problems:
                    section.notes.extend(sorted(set(result.problems))[:3])
                return float(result.jobs / result.seconds)
            return one

        modes: list[tuple[str, dict[str, Run]]] = []
        for level in levels:
            contenders: dict[str, Run] = {
                "raw": rate(lambda lv=level: raw_limit(raw_url, lv, n)),
                "ledger": rate(lambda lv=level: ledger_drain(db, lv, n)),
            }
            if pgq:
                contenders["pgqueuer"] = rate(lambda lv=level: pgq.drain(n, lv, 1))
            if procr:
                contenders["procrastinate"] = rate(lambda lv=level: procr.drain(n, lv))
            modes.append((f"N={level}", contenders))
        for k in (10, 100):
            contenders = {"ledger": rate(lambda k=k: ledger_drain(db, top, n, k))}
            if pgq:
                async def best_pgq(k: int = k) -> float:
                    many = await rate(lambda: pgq.drain(n, top, k))()
                    one = await rate(lambda: pgq.drain(n, 1, k))() if top != 1 else 0.0
                    return max(many, one)
                contenders["pgqueuer"] = best_pgq
            modes.append((f"batch {k} (N={top})", contenders))

        for mode, contenders in modes:
            names = list(contenders)
            runs: dict[str, list[float]] = {c: [] for c in names}
            loads: dict[str, list[float]] = {c: [] for c in names}
            for r in range(rounds):
                order = names[r % len(names):] + names[:r % len(names)]  # rotate who goes first
                for name in order:
                    before = os.getloadavg()[0]
                    runs[name].append(await contenders[name]())
                    loads[name].append(round((before + os.getloadavg()[0]) / 2, 1))
            for name in names:
                section.rows.append({
                    "mode": mode, "contender": name, "median_per_s": round(statistics.median(runs[name])),
                    "best_per_s": round(max(runs[name])), "runs_per_s": [round(x) for x in runs[name]],
                    "load": loads[name]})
            for peer in ("raw", "pgqueuer", "procrastinate"):
                if peer in runs and "ledger" in runs:
                    ratios = [a / b for a, b in zip(runs["ledger"], runs[peer], strict=True) if b]
                    section.extra.setdefault("ratios", {}).setdefault(peer, {})[mode] = {
                        "median": round(statistics.median(ratios), 2), "rounds": [round(x, 2) for x in ratios]}

    ratios = section.extra.get("ratios", {})
    for peer, by_mode in ratios.items():
        if peer == "raw":
            one = by_mode.get("N=1")
            if one:
                section.targets.append(Target("Ledger / raw loop at N=1, same round", "≥ 0.5×",
                                              f"{one['median']} (rounds {one['rounds']})",
                                              one["median"] >= 0.5))
            continue
        section.targets.append(Target(
            f"Ledger / {peer}, same round", "≥ 1.0 in every mode",
            ", ".join(f"{m}: {v['median']}" for m, v in by_mode.items()),
            min(v["median"] for v in by_mode.values()) >= 1.0))
    section.notes.append(
        f"{n:,} pre-made jobs (or campaigns) per run, {rounds} rounds; in each round every contender "
        "runs once, the first of the round rotating; a ratio is Ledger's run over the peer's run of the "
        "same round, reported as the median of the rounds (extra.ratios has each round's); load is the "
        "1-minute average around each run.")
    section.extra["when"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return section


if __name__ == "__main__":
    cli(run, __doc__)
