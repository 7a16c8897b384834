"""What the attempt cell costs: starting a command in a cell against starting
it bare, for ``/bin/true`` and for ``python -c pass`` (the interpreter most
acceptance commands start), and the cell with the egress proxy; what the
cell's cgroup adds (the same cell on rlimits only), what the workspace's
quota adds (a watched workspace of 50 files against the same unwatched),
and what a judge's face adds (a guised cell); and the attempt's workspace
(a clone of the base, its commits bundled and imported) on a small
repository. Needs no database.

usage: python -m bench --only cell [--quick]
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.harness import Context, Section, Target, cli
from ledger.git.repository import LEDGER, Repository
from ledger.sandbox import cell as cells
from ledger.sandbox import cgroups, processes
from ledger.sandbox import guise as guises
from ledger.sandbox.processes import cell_environment, run_command


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


@contextlib.contextmanager
def _without_cgroups() -> Iterator[None]:
    """Cells on rlimits only, as on a host that offers no cgroup."""
    saved = cgroups.host
    cgroups.host = lambda: cgroups.Host("rlimits", reason="turned off for the benchmark")  # type: ignore[assignment]
    try:
        yield
    finally:
        cgroups.host = saved  # type: ignore[assignment]


class _NoWatch:
    """A watch that watches nothing (what the cell costs without its quota)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def start(self) -> None:
        pass

    def stop(self) -> dict[str, Any]:
        return {}


@contextlib.contextmanager
def _without_quota() -> Iterator[None]:
    saved = processes.Watch
    processes.Watch = _NoWatch  # type: ignore[assignment,misc]
    try:
        yield
    finally:
        processes.Watch = saved  # type: ignore[misc]


def _files(root: Path, n: int = 50) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        (root / f"module_{i}.py").write_text(f"def f{i}():\n    return {i}\n" * 20)
    return root


async def _turns(argv: list[str], runs: int, *variants: tuple[cells.CellSpec, Any]
                 ) -> list[dict[str, float]]:
    """``argv`` in each variant's cell (a spec, and a context to run it in), in turns."""
    samples: list[list[float]] = [[] for _ in variants]
    for _ in range(runs):
        for i, (spec, context) in enumerate(variants):
            with context():
                t0 = time.perf_counter()
                result = await run_command(argv, "/", timeout_s=60, cell=spec)
                samples[i].append(time.perf_counter() - t0)
            if not result.passed:
                raise RuntimeError(f"{argv} failed: {result.output[-300:]}")
    return [_ms(s) for s in samples]


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
    # What each new part adds, measured in turns with the same cell without
    # it (so a change of the machine's load falls on both alike).
    mode = cgroups.host().mode
    true = ["/bin/true"]
    with tempfile.TemporaryDirectory() as scratch:
        work = _files(Path(scratch) / "work")
        watched = cells.CellSpec(cells.CellPolicy(), (cells.Binding(work, cells.INSIDE_WORK, True),),
                                 env=cell_environment())
        guise = guises.draw("verifier", "calc")
        judged = cells.CellSpec(cells.CellPolicy(), (cells.Binding(work, guise.checkout, True),),
                                cwd=guise.checkout, env=cell_environment(), guise=guise)
        pairs = [
            (f"/bin/true, its cgroup ({mode})", spec, contextlib.nullcontext,
             "/bin/true, rlimits only", spec, _without_cgroups),
            ("/bin/true, a workspace of 50 files, watched (the quota)", watched, contextlib.nullcontext,
             "/bin/true, the same workspace unwatched", watched, _without_quota),
            ("/bin/true, the same, in a judge's face (guise)", judged, contextlib.nullcontext,
             "/bin/true, the same, without a face", watched, contextlib.nullcontext),
        ]
        for name, with_spec, with_ctx, base_name, base_spec, base_ctx in pairs:
            with_it, without = await _turns(true, runs, (with_spec, with_ctx), (base_spec, base_ctx))
            section.rows.append({"command": name, "bare_ms": "", "cell_ms": with_it,
                                 "overhead_ms": round(with_it["p50"] - without["p50"], 1)})
            section.rows.append({"command": base_name, "bare_ms": "", "cell_ms": without, "overhead_ms": ""})
    with tempfile.TemporaryDirectory(prefix="ledger-bench-cell-") as scratch:
        workspace = await asyncio.to_thread(_workspace, Path(scratch), max(runs // 4, 3))
    section.rows.append({"command": "attempt workspace (clone, bundle, import, candidate)",
                         "bare_ms": "", "cell_ms": workspace, "overhead_ms": ""})
    overhead = section.rows[0]["overhead_ms"]
    section.targets.append(Target("cell start-up overhead", "< 250 ms p50", f"{overhead} ms",
                                  overhead < 250))
    section.notes.append("one cell per attempt command, per acceptance command and per sensor "
                         "check; the attempt also pays the workspace row once")
    section.notes.append(f"cgroup mode on this host: {mode}. Each overhead below the proxy row is "
                         "measured in turns against the row after it: what the cgroup adds (made, joined, "
                         "read and removed per cell), what the workspace's quota adds (counted at the "
                         "start, a thread looking every 0.1 s), what a judge's face adds (its /etc files, "
                         "its uid and host name)")
    return section


if __name__ == "__main__":
    cli(run, __doc__)
