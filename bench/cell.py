"""What the attempt cell costs: starting a command in a cell against starting
it bare, for ``/bin/true`` and for ``python -c pass`` (the interpreter most
acceptance commands start), and the cell with the egress proxy; and the
attempt's workspace (a clone of the base, its commits bundled and imported)
on a small repository. Needs no database.

usage: python -m bench.cell [--quick]
"""

from __future__ import annotations

import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.harness import Context, Section, Target, cli
from ledger.sandbox import cell as cells
from ledger.sandbox.processes import cell_environment, run_command
from ledger.git.repository import LEDGER, Repository


def _ms(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {"p50": round(statistics.median(ordered) * 1000, 1),
            "p90": round(ordered[int(len(ordered) * 0.9) - 1] * 1000, 1)}


async def _time(argv: list[str], runs: int, spec: cells.CellSpec | None) -> dict[str, float]:
    samples = []
    for _ in range(runs):
        t0 = time.perf_counter()
        result = await run_command(argv, "/", timeout_s=60, cell=spec)
        samples.append(time.perf_counter() - t0)
        if not result.passed:
            raise RuntimeError(f"{argv} failed: {result.output[-300:]}")
    return _ms(samples)


def _workspace(root: Path, runs: int) -> dict[str, float]:
    repo = root / "repo"
    subprocess.run(["git", "init", "-q", "-b", "main", str(repo)], check=True)
    for i in range(50):
        (repo / f"module_{i}.py").write_text(f"def f{i}():\n    return {i}\n" * 20)
    git = ["git", "-C", str(repo), "-c", "user.name=b", "-c", "user.email=b@b"]
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "base"], check=True)
    r = Repository(str(repo))
    base = r.resolve("main")
    samples = []
    for n in range(runs):
        work = root / f"w{n}"
        t0 = time.perf_counter()
        r.seed_workspace(work, base, f"ledger/1/{n}", LEDGER)
        (work / "module_0.py").write_text("changed\n")
        subprocess.run(["git", "-C", str(work), "-c", "core.hooksPath=/dev/null", "commit", "-qam", "x"],
                       check=True, env={"GIT_AUTHOR_NAME": "a", "GIT_AUTHOR_EMAIL": "a@a",
                                        "GIT_COMMITTER_NAME": "a", "GIT_COMMITTER_EMAIL": "a@a",
                                        "PATH": "/usr/bin:/bin"})
        bundle = root / f"b{n}.bundle"
        subprocess.run(["git", "-C", str(work), "bundle", "create", "-q", str(bundle), f"{base}..HEAD"],
                       check=True)
        head = r.import_bundle(bundle, 1 << 24)
        r.make_candidate(head, base, "m", LEDGER, LEDGER)
        samples.append(time.perf_counter() - t0)
    return _ms(samples)


async def run(ctx: Context) -> Section:
    runs = 10 if ctx.quick else 40
    section = Section("cell", "The attempt cell: start-up cost")
    if cells.bubblewrap() is None:
        section.notes.append("bubblewrap is not installed: nothing measured")
        return section
    spec = cells.CellSpec(cells.CellPolicy(), (), cwd="/", env=cell_environment())
    proxied = cells.CellSpec(cells.CellPolicy(network="proxy", allow=["api.example.com:443"]), (),
                             cwd="/", env=cell_environment())
    for name, argv in (("/bin/true", ["/bin/true"]), ("python -c pass", [sys.executable, "-c", "pass"])):
        bare = await _time(argv, runs, None)
        inside = await _time(argv, runs, spec)
        section.rows.append({"command": name, "bare_ms": bare, "cell_ms": inside,
                             "overhead_ms": round(inside["p50"] - bare["p50"], 1)})
    proxy = await _time(["/bin/true"], runs, proxied)
    section.rows.append({"command": "/bin/true, network = proxy", "bare_ms": "",
                         "cell_ms": proxy, "overhead_ms": ""})
    with tempfile.TemporaryDirectory(prefix="ledger-bench-cell-") as scratch:
        workspace = await asyncio.to_thread(_workspace, Path(scratch), max(runs // 4, 3))
    section.rows.append({"command": "attempt workspace (clone, bundle, import, candidate)",
                         "bare_ms": "", "cell_ms": workspace, "overhead_ms": ""})
    overhead = section.rows[0]["overhead_ms"]
    section.targets.append(Target("cell start-up overhead", "< 250 ms p50", f"{overhead} ms",
                                  overhead < 250))
    section.notes.append("one cell per attempt command, per acceptance command and per sensor "
                         "check; the attempt also pays the workspace row once")
    return section


if __name__ == "__main__":
    cli(run, __doc__)
