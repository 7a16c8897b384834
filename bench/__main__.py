"""Run every benchmark section in one invocation, against one server, and
write ``bench/results/<stamp>.json`` and ``<stamp>.md``.

usage: python -m bench [--quick] [--only cycle,wake,...] [--database-url URL]

Sections (each also runs alone: ``python -m bench.<name>``):
  compare    the fair comparison: the raw loop, Ledger, PGQueuer and Procrastinate at N = 1, 2, 4, 8
             and in batches of 10 and 100, interleaved round by round (ratios within a round)
  cost       one N=1 cycle and a batch of 100, Ledger beside the raw loop: round trips,
             client CPU (and its top functions), server CPU, waiting
  cycle      Ledger's claim+record cycle against the raw-SQL limit (N = 1, 2, 4, 8),
             and batch claims of 10 and 100
  peers      Procrastinate and PGQueuer draining no-op jobs on the same server
  wake       open -> claimed with an idle worker: the hub and poll-only
  scale      claim latency at 1k, 100k and 1M campaigns, and the claim's plan
  heartbeat  leases heartbeating at their interval: sustained rate, database CPU
  journal    an attempt printing 10,000 lines/s: journal rows, bytes, tail lag
  fair       a small class behind a 100,000 backlog of another: claims until it is drained
  rowcost    backend CPU per cycle, and what each index and the CHECKs of campaign cost
  cell       the attempt cell: a command's start-up in a cell against bare, and an attempt's workspace
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import os
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from bench.harness import (
    Context,
    Section,
    Target,
    add_server_arguments,
    describe_machine,
    describe_server,
    server,
)
from ledger import logs

SECTIONS = ("compare", "cost", "cycle", "peers", "wake", "scale", "heartbeat", "journal", "fair", "rowcost", "cell",
            "limits")
RESULTS = Path(__file__).parent / "results"


def cross_targets(sections: dict[str, Section]) -> list[Target]:
    """Targets that compare two sections of this run: Ledger against its
    peers from ``cycle`` and ``peers`` (run apart: figures only, the fair
    ratios are ``compare``'s), and the wake latency."""
    cycle, peers = sections.get("cycle"), sections.get("peers")
    if not cycle or not peers:
        return []
    out = []
    ledger_one = {r["concurrency"]: r["per_s"] for r in cycle.rows if r["what"] == "ledger claim+record"}
    peer_one: dict[str, dict[int, float]] = {}
    peer_batch: dict[int, float] = {}
    for r in peers.rows:
        if r.get("mode") == "one-at-a-time":
            peer_one.setdefault(r["peer"], {})[r["concurrency"]] = r["jobs_per_s"]
        elif r.get("peer") == "pgqueuer" and str(r.get("mode", "")).startswith("batch"):
            peer_batch[int(str(r["mode"]).split()[-1])] = r["jobs_per_s"]
    for peer, rates in peer_one.items():
        common = sorted(set(rates) & set(ledger_one))
        if common:
            ratios = {n: ledger_one[n] / rates[n] for n in common}
            out.append(Target(f"Ledger / {peer}, one at a time (sections run apart)", "> 1 at every N",
                              ", ".join(f"N={n}: {r:.2f}" for n, r in ratios.items()),
                              min(ratios.values()) > 1))
    # PGQueuer's batches are set against its better configuration: N
    # QueueManagers (the rows) or one (extra), whichever drained faster.
    for mode, jobs_per_s in peers.extra.get("pgqueuer_batch_one_worker_jobs_per_s", {}).items():
        k = int(str(mode).split()[-1])
        peer_batch[k] = max(peer_batch.get(k, 0.0), jobs_per_s)
    ledger_batch = {r["batch"]: r["per_s"] for r in cycle.rows if r["what"] == "ledger batch"}
    for k in sorted(set(ledger_batch) & set(peer_batch)):
        out.append(Target(f"Ledger batch {k} / PGQueuer batch {k} (sections run apart)", "> 1",
                          f"{ledger_batch[k] / peer_batch[k]:.2f} ({ledger_batch[k]:.0f} vs {peer_batch[k]:.0f}/s)",
                          ledger_batch[k] > peer_batch[k]))
    wake = peers.extra.get("wake", {})
    hub = sections.get("wake")
    if hub and hub.rows and wake:
        ours = hub.rows[0]["p50"]
        for peer, lat in wake.items():
            if "p50" in lat:
                out.append(Target(f"wake p50: Ledger hub vs {peer}", "≤ peer",
                                  f"{ours} vs {lat['p50']} ms", ours <= lat["p50"]))
    return out


def _cell(value: Any) -> str:
    """A table cell: percentiles as 'p50 x / p99 y ms', everything else as is."""
    if isinstance(value, dict) and "p50" in value:
        # Sections state the upper percentile they measured (p90 for few samples).
        upper = next((k for k in ("p99", "p95", "p90") if k in value), None)
        tail = f" / {upper} {value[upper]}" if upper else ""
        return f"p50 {value['p50']}{tail} ms"
    return str(value)


def markdown(report: dict[str, Any], sections: list[Section], cross: list[Target]) -> str:
    lines = [f"# Ledger benchmarks, {report['stamp']}", "",
             f"{'quick smoke run' if report['quick'] else 'full run'}; "
             f"PostgreSQL {report['server'].get('server_version')}; "
             f"{report['machine']['cpus']} CPUs ({report['machine']['cpu']}), "
             f"{report['machine']['memory_gib']} GiB; Python {report['machine']['python']}; "
             f"{report['seconds']:.0f} s", "",
             "Server settings: " + ", ".join(f"{k}={v}" for k, v in report["server"].items()), ""]
    targets = [t for s in sections for t in s.targets] + cross
    if targets:
        lines += ["## Targets", "", "| target | goal | this run | met |", "|---|---|---|---|"]
        lines += [f"| {t.name} | {t.goal} | {t.value} | "
                  f"{'yes' if t.met else 'no' if t.met is not None else 'n/a'} |" for t in targets]
        lines.append("")
    for s in sections:
        lines += [f"## {s.title}", ""]
        load = s.extra.get("load_1min")
        if load:
            lines += [f"Load (1-minute average): {load['before']} at the start, {load['after']} at the end.", ""]
        if s.rows:
            keys = list(dict.fromkeys(k for r in s.rows for k in r))
            lines += ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
            lines += ["| " + " | ".join(_cell(r.get(k, "")) for k in keys) + " |" for r in s.rows]
            lines.append("")
        lines += [f"- {n}" for n in s.notes]
        plan = s.extra.get("claim_plan_at_largest")
        if plan:
            lines += ["", "```", *plan, "```"]
        lines.append("")
    return "\n".join(lines)


def entry() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_server_arguments(parser)
    parser.add_argument("--only", help="comma-separated sections (default: all)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="where to write the results")
    args = parser.parse_args()
    names = [n.strip() for n in args.only.split(",")] if args.only else list(SECTIONS)
    unknown = set(names) - set(SECTIONS)
    if unknown:
        parser.error(f"unknown section(s): {', '.join(sorted(unknown))}; choose from {', '.join(SECTIONS)}")
    logs.configure("warning")
    with server(args.database_url) as url:
        return asyncio.run(main(args, names, Context(url, quick=args.quick)))


async def main(args: argparse.Namespace, names: list[str], ctx: Context) -> int:
    started = time.perf_counter()
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    report: dict[str, Any] = {"stamp": stamp, "quick": args.quick, "machine": describe_machine(),
                              "server": describe_server(ctx.admin_url), "sections": {}}
    done: dict[str, Section] = {}
    failed: list[str] = []
    for name in names:
        print(f"[{time.perf_counter() - started:6.1f} s] {name} ...", flush=True)
        module = importlib.import_module(f"bench.{name}")
        load_before = os.getloadavg()[0]
        try:
            done[name] = await module.run(ctx)
        except Exception as exc:  # one broken section must not lose the others' figures
            failed.append(name)
            done[name] = Section(name, name, notes=[f"failed: {type(exc).__name__}: {exc}"])
            print(f"    {name} failed: {type(exc).__name__}: {exc}", flush=True)
        # The machine is shared: every section says how busy it was.
        load = {"before": round(load_before, 1), "after": round(os.getloadavg()[0], 1)}
        done[name].extra["load_1min"] = load
        print(f"    load (1-minute average) {load['before']} -> {load['after']}", flush=True)
        for t in done[name].targets:
            print(f"    {t.line()}", flush=True)
    cross = cross_targets(done)
    for t in cross:
        print(f"    {t.line()}")
    report["seconds"] = time.perf_counter() - started
    report["sections"] = {n: s.to_json() for n, s in done.items()}
    report["cross_targets"] = [t.__dict__ for t in cross]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{stamp}.json").write_text(json.dumps(report, indent=2, default=str, ensure_ascii=False))
    md = markdown(report, list(done.values()), cross)
    (args.out / f"{stamp}.md").write_text(md)
    print()
    print(md)
    print(f"wrote {args.out / stamp}.json and .md")
    # Missed targets are figures to read, not failures; a section that could
    # not run at all is.
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(entry())
