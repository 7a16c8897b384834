"""The command line's start-up, as whole processes: ``ledger --help``,
``ledger --version`` and simple reads (``ledger list --json``, ``ledger status
--json``) against a migrated database, each started the way a user starts it
-- a fresh ``ledger`` process -- several times after a warm-up. Wall time per
run (min / median / max) and the children's CPU time (user + sys, median).

The goal is under 0.3 s for ``--help``; a read also connects to PostgreSQL and
imports the database layer, so it is reported, not held to that goal.

usage: python -m bench.cli [--runs 10]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench.harness import PREFIX, bench_database

GOAL_HELP_S = 0.3


def ledger_command() -> list[str]:
    """The installed ``ledger`` script next to this interpreter (what a user runs)."""
    script = Path(sys.executable).with_name("ledger")
    return [str(script)] if script.exists() else [sys.executable, "-m", "ledger"]


def time_process(argv: list[str], env: dict[str, str], runs: int) -> dict[str, float]:
    """Run ``argv`` once to warm the file cache, then ``runs`` times; wall and CPU seconds."""
    walls, cpus = [], []
    for i in range(runs + 1):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.perf_counter()
        proc = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              text=True, check=False)
        wall = time.perf_counter() - started
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if proc.returncode != 0:
            raise SystemExit(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr}")
        if i:  # the first run is the warm-up
            walls.append(wall)
            cpus.append((after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime))
    return {"min": min(walls), "median": statistics.median(walls), "max": max(walls),
            "cpu_median": statistics.median(cpus)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10, help="counted runs per command")
    args = parser.parse_args()
    ledger = ledger_command()
    with bench_database() as db:
        env = {**os.environ, "LEDGER_DATABASE_URL": db.url, "LEDGER_ROLE_PREFIX": PREFIX,
               "NO_COLOR": "1"}
        rows = [(" ".join(["ledger", *extra]), time_process([*ledger, *extra], env, args.runs))
                for extra in (["--help"], ["--version"], ["list", "--json"],
                              ["status", "--json"])]
    print(f"{'command':<22} {'wall min':>9} {'median':>9} {'max':>9} {'cpu median':>11}")
    for name, t in rows:
        print(f"{name:<22} {t['min']:>8.3f}s {t['median']:>8.3f}s {t['max']:>8.3f}s "
              f"{t['cpu_median']:>10.3f}s")
    help_median = rows[0][1]["median"]
    verdict = "met" if help_median < GOAL_HELP_S else "missed"
    print(f"ledger --help median {help_median:.3f}s; goal < {GOAL_HELP_S}s: {verdict}")


if __name__ == "__main__":
    main()
