"""The drill framework (``ledger drill``): fault-injection scenarios an
operator runs against their own deployment.

Each drill (in ``ledger.drills``, the repository's drills/ folder) gets a throwaway database on
the operator's server (or a throwaway cluster it starts itself, when it must
restart the server), a workspace with a real git repository, and real
``ledger`` processes it starts, signals and kills. It narrates a timeline, checks
expectations, and ends with a verdict:

* **pass** -- every expectation held;
* **fail** -- at least one did not;
* **under-exercised** -- the fault never met the path it was meant to test
  (say, no campaign became eligible); such a run proves nothing and never
  counts as a pass.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import psycopg
from psycopg.rows import dict_row
from rich.console import Console

from ledger.config import LedgerConfig, load_config
from ledger.db import migrations
from ledger.db.database import Database, Session
from ledger.db.embedded import create_database, drop_database
from ledger.db.kernel import Kernel
from ledger.settings import KNOBS, inherited_environment

if TYPE_CHECKING:
    from ledger.ops.cluster import Replicated
    from ledger.ops.patroni import PatroniCluster

Verdict = Literal["pass", "fail", "under-exercised"]
#: A drill that needs more than this is broken; the runner stops it.
DRILL_TIMEOUT_S = 240.0


class UnderExercised(Exception):
    """Raised by a drill when the fault never met the path it tests."""


@dataclass
class Expectation:
    """One thing that must hold."""

    what: str
    held: bool
    detail: str = ""


@dataclass
class DrillReport:
    """The outcome of one drill run (JSON in ``--report``)."""

    name: str
    verdict: Verdict
    duration_s: float
    timeline: list[dict[str, Any]] = field(default_factory=list)
    expectations: list[dict[str, Any]] = field(default_factory=list)
    note: str = ""


class Drill:
    """A drill: subclasses set the class attributes and implement ``run``."""

    name: str = ""
    summary: str = ""  # setup -> fault -> what must hold, in one line
    #: needs a cluster of its own (it restarts the server)
    own_cluster: bool = False
    #: needs a primary and a streaming standby of its own (``ctx.pair``; it kills the primary)
    replicated: bool = False
    #: needs a Patroni-managed cluster of its own (``ctx.patroni``; etcd and two members)
    patroni: bool = False
    #: its throwaway database is migrated to this code's head before it runs (False:
    #: left empty, for a drill that migrates it itself: the upgrade drill)
    migrated: bool = True

    def timeout_s(self, scale: float, minutes: float | None) -> float:
        """How long the runner lets it run before stopping it."""
        return DRILL_TIMEOUT_S

    async def run(self, ctx: DrillContext) -> None:  # pragma: no cover - abstract
        raise NotImplementedError


@dataclass
class Proc:
    """A ``ledger`` process a drill started."""

    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def signal(self, sig: signal.Signals) -> None:
        """Send a signal (a process already gone is fine)."""
        try:
            os.kill(self.popen.pid, sig)
        except ProcessLookupError:
            pass

    def wait(self, timeout: float) -> int | None:
        """The exit code, or ``None`` if it is still running after ``timeout``."""
        try:
            return self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


class DrillContext:
    """What a drill works with: its database, workspace, processes and report."""

    def __init__(self, drill: Drill, db: Database, workspace: Path, console: Console, scale: float,
                 cluster: Path | None = None, *, pair: Replicated | None = None, minutes: float | None = None,
                 patroni: PatroniCluster | None = None):
        self.drill = drill
        self.cluster = cluster
        self.pair = pair
        self.patroni = patroni
        #: ``ledger drill --minutes``: how long a soak drill (chaos) runs its faults
        self.minutes = minutes
        self.db = db
        self.workspace = workspace
        self.console = console
        self.scale = scale
        self.started = time.monotonic()
        self.timeline: list[dict[str, Any]] = []
        self.expectations: list[Expectation] = []
        self.procs: list[Proc] = []
        self._sessions: dict[str, Session] = {}
        self.data_dir = workspace / "data"
        self.config_path = workspace / "ledger.toml"

    # -- narration ---------------------------------------------------------

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def step(self, text: str) -> None:
        """One line of the timeline."""
        self.timeline.append({"t": round(self.elapsed(), 3), "step": text})
        self.console.print(f"  [dim]{self.elapsed():6.2f}s[/]  {text}", highlight=False)

    def expect(self, held: bool, what: str, detail: str = "") -> bool:
        """Record an expectation; returns whether it held."""
        self.expectations.append(Expectation(what, bool(held), detail))
        mark = "[green]ok  [/]" if held else "[red]FAIL[/]"
        self.console.print(f"  [dim]{self.elapsed():6.2f}s[/]  {mark} {what}"
                           + (f" [dim]({detail})[/]" if detail else ""), highlight=False)
        return bool(held)

    # -- the database ------------------------------------------------------

    async def kernel(self, actor: str) -> Kernel:
        """A kernel acting as ``actor`` (pools are opened once per drill)."""
        if actor not in self._sessions:
            self._sessions[actor] = await self.db.session(actor, max_size=8).open()
        return Kernel(self._sessions[actor])

    def sql(self, query: str, *params: Any) -> list[dict[str, Any]]:
        """Look underneath as the administrator (drills verify the rows themselves;
        without the greeting: the upgrade drill looks at a previous release's schema)."""
        with psycopg.connect(self.db.url, row_factory=dict_row) as conn:
            return conn.execute(query, params).fetchall()

    async def close(self) -> None:
        for session in self._sessions.values():
            await session.close()
        for proc in self.procs:
            if proc.popen.poll() is None:
                proc.signal(signal.SIGCONT)
                proc.popen.kill()
                proc.popen.wait()

    # -- the workspace -----------------------------------------------------

    def repository(self, files: dict[str, str] | None = None, name: str = "repo") -> Path:
        """A git repository (non-bare, main checked out) with ``files`` committed."""
        repo = self.workspace / name
        env = {**inherited_environment(), "GIT_AUTHOR_NAME": "Drill", "GIT_AUTHOR_EMAIL": "drill@localhost",
               "GIT_COMMITTER_NAME": "Drill", "GIT_COMMITTER_EMAIL": "drill@localhost"}
        subprocess.run(["git", "init", "-q", "-b", "main", str(repo)], check=True, env=env)
        subprocess.run(["git", "-C", str(repo), "config", "core.logAllRefUpdates", "always"], check=True)
        for path, text in (files or {"README": "a repository under repair\n"}).items():
            (repo / path).parent.mkdir(parents=True, exist_ok=True)
            (repo / path).write_text(text)
        subprocess.run(["git", "-C", str(repo), "add", "."], check=True, env=env)
        subprocess.run(["git", "-C", str(repo), "commit", "-qm", "start"], check=True, env=env)
        return repo

    @property
    def markers(self) -> Path:
        """The one directory of the drill's that attempt cells may write
        (``cell.writable``): the scripted attempt's plan and its markers."""
        path = self.workspace / "markers"
        path.mkdir(exist_ok=True)
        return path

    def plan(self, plan: dict[str, list[list[Any]]]) -> Path:
        """Write the scripted attempt command's plan (see drills/scripted_attempt.py)."""
        path = self.markers / "plan.json"
        path.write_text(json.dumps(plan))
        return path

    def marker(self, kind: str, campaign: int, attempt: int) -> Path:
        """A file the scripted attempt writes (started, child) or waits for (release)."""
        return self.markers / f"{kind}-{campaign}-{attempt}"

    def write_config(self, text: str) -> LedgerConfig:
        """Write ledger.toml for the drill's processes; returns it parsed."""
        self.config_path.write_text(text)
        return load_config(self.config_path)

    async def register(self, config: LedgerConfig) -> None:
        """Register the config's classes (as the operator)."""
        operator = await self.kernel("operator")
        for name, cls in config.classes.items():
            await operator.register_class(name, **cls.registration())
        await config.sync_limits(operator, operator="drill")

    def env(self, **extra: str) -> dict[str, str]:
        """The environment of the drill's processes."""
        settings = {KNOBS[name].envvar: value for name, value in (
            ("database_url", self.db.url), ("role_prefix", self.db.role_prefix),
            ("data_dir", str(self.data_dir)), ("config", str(self.config_path)),
            ("log_level", "info"))}
        return {**inherited_environment(), **settings, "NO_COLOR": "1", **extra}

    def spawn(self, name: str, *args: str, **env: str) -> Proc:
        """Start ``ledger <args>`` as a real process, logging to the workspace."""
        log = self.workspace / f"{name}.log"
        popen = subprocess.Popen([sys.executable, "-m", "ledger", *args], env=self.env(**env),
                                 stdout=log.open("ab"), stderr=subprocess.STDOUT)
        proc = Proc(name, popen, log)
        self.procs.append(proc)
        self.step(f"started {name} (pid {popen.pid}): ledger {' '.join(args)}")
        return proc

    async def until(self, check: Callable[[], Any], what: str, timeout: float = 30.0,
                    interval: float = 0.05) -> bool:
        """Wait for a condition (polled); ``False`` if it never came."""
        deadline = time.monotonic() + timeout
        while True:
            result = check()
            if inspect.isawaitable(result):
                result = await result
            if result:
                return True
            if time.monotonic() > deadline:
                self.step(f"gave up waiting for {what} after {timeout:g}s")
                return False
            await asyncio.sleep(interval)

    def stop_server(self, mode: Literal["fast", "immediate"] = "fast") -> None:
        """Stop the drill's own cluster (every connection dies; immediate: a crash)."""
        self._pg_ctl("-w", "stop", "-m", mode)

    def start_server(self) -> None:
        """Start the drill's own cluster again, as it was started (Unix socket only)."""
        from ledger.db.embedded import server_of

        assert self.cluster is not None, "only own-cluster drills may start the server"
        server = server_of(self.cluster)
        assert server is not None, "the drill's cluster was started by this process"
        socket_dir = str(psycopg.conninfo.conninfo_to_dict(self.db.url)["host"])
        deadline = time.monotonic() + 30
        while True:
            try:
                self._pg_ctl("-w", "-o", '-h ""', "-o", f"-k {socket_dir}", "-l", str(server.log), "start")
                return
            except subprocess.CalledProcessError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)  # the old server's processes are still exiting; nothing signals that

    def _pg_ctl(self, *args: str) -> None:
        from ledger.db.embedded import pg_ctl, server_of

        assert self.cluster is not None, "only own-cluster drills may stop or start the server"
        server = server_of(self.cluster)
        assert server is not None, "the drill's cluster was started by this process"
        pg_ctl(server, *args)

    def restart_server(self) -> None:
        """Restart the drill's own cluster (fast shutdown: every connection dies)."""
        from ledger.db.embedded import pg_ctl, server_of

        assert self.cluster is not None, "only own-cluster drills may restart the server"
        server = server_of(self.cluster)
        assert server is not None, "the drill's cluster was started by this process"
        pg_ctl(server, "-w", "restart", "-m", "fast", timeout=60)

    # -- common reads ------------------------------------------------------

    def state(self, campaign_id: int) -> str:
        state: str = self.sql("SELECT state FROM ledger.campaign WHERE id = %s", campaign_id)[0]["state"]
        return state

    def attempts(self, campaign_id: int) -> list[dict[str, Any]]:
        return self.sql("SELECT attempt_no, generation, worker, outcome, verdict, fingerprint, failure_reason "
                        "FROM ledger.attempt WHERE campaign_id = %s ORDER BY attempt_no", campaign_id)

    def transitions(self, campaign_id: int) -> list[str]:
        return [r["t"] for r in self.sql(
            "SELECT payload->>'transition' AS t FROM ledger.campaign_event WHERE campaign_id = %s "
            "AND type = 'transition' ORDER BY seq", campaign_id)]


def pid_marker() -> str:
    """What a process writes so that a test on the host can find it even in a
    cell's PID namespace: its pid there and that namespace (``host_pid``)."""
    return f"{os.getpid()} {os.readlink('/proc/self/ns/pid')}"


def host_pid(marker: str) -> int:
    """The host's pid of the process that wrote ``marker`` (``pid_marker``):
    its own pid when it ran in this PID namespace, else the process of that
    namespace whose innermost pid it is (``NSpid`` in /proc/<pid>/status);
    -1 when it is gone."""
    words = marker.split()
    pid = int(words[0])
    namespace = words[1] if len(words) > 1 else os.readlink("/proc/self/ns/pid")
    if namespace == os.readlink("/proc/self/ns/pid"):
        return pid
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.readlink(f"/proc/{entry}/ns/pid") != namespace:
                continue
            status = Path(f"/proc/{entry}/status").read_text()
        except OSError:
            continue
        for line in status.splitlines():
            if line.startswith("NSpid:") and int(line.split()[-1]) == pid:
                return int(entry)
    return -1


def process_gone(pid: int) -> bool:
    """Whether a process has exited (a zombie awaiting its reaper counts as gone)."""
    if pid < 0:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except OSError:
        return True


def drill_python() -> str:
    """The interpreter drills give to scripted commands."""
    return sys.executable


# --- running --------------------------------------------------------------------


async def _throwaway_database(admin_url: str, name: str, role_prefix: str,
                              migrated: bool = True) -> Database:
    url = create_database(admin_url, name)
    if not migrated:
        return Database(url, role_prefix=role_prefix)
    migrations.upgrade(url, role_prefix)
    with psycopg.connect(url, autocommit=True) as conn:
        # A drill database is the drill's own: it may pin the clock to force races.
        conn.execute("UPDATE ledger.meta SET value = 'true' WHERE key = 'clock_pinnable'")
    return Database(url, role_prefix=role_prefix)


def _drop_database(admin_url: str, name: str) -> None:
    try:
        drop_database(admin_url, name)
    except psycopg.Error:
        pass  # the cluster may be gone (own-cluster drills)


async def run_drill(drill: Drill, *, admin_url: str | None, role_prefix: str, console: Console,
                    scale: float = 1.0, keep: bool = False, minutes: float | None = None) -> DrillReport:
    """Run one drill on a throwaway database (or cluster); never raises for the
    drill's own failures -- they are the report."""
    workspace = Path(tempfile.mkdtemp(prefix=f"ledger-drill-{drill.name}-"))
    console.print(f"[bold]drill {drill.name}[/]: {drill.summary}")
    started = time.monotonic()
    name = f"ledger_drill_{drill.name.replace('-', '_')}_{uuid.uuid4().hex[:6]}"
    ctx: DrillContext | None = None
    note = ""
    cluster = None
    pair = None
    patroni = None
    limit = drill.timeout_s(scale, minutes)
    try:
        if drill.replicated:
            from ledger.ops.cluster import Replicated

            pair = await asyncio.to_thread(Replicated, workspace / "pair")
            admin_url = pair.url
            console.print(f"  [dim]primary 127.0.0.1:{pair.primary.port}, synchronous standby "
                          f"127.0.0.1:{pair.standby.port}[/]", highlight=False)
        elif drill.patroni:
            from ledger.ops.patroni import PatroniCluster, missing

            if (why := missing()) is not None:
                raise UnderExercised(f"no Patroni cluster can be made here: {why}")
            patroni = await asyncio.to_thread(PatroniCluster, workspace / "patroni")
            admin_url = patroni.url
            console.print("  [dim]Patroni members " + ", ".join(
                f"{m.name} 127.0.0.1:{m.pg_port}" for m in patroni.members) + f" (PostgreSQL from "
                f"{patroni.bin_dir}), etcd 127.0.0.1:{patroni.etcd_port}[/]", highlight=False)
        elif drill.own_cluster or admin_url is None:
            from ledger.db.embedded import server_url

            cluster = workspace / "cluster"
            admin_url = server_url(cluster, cleanup="delete")
        db = await _throwaway_database(admin_url, name, role_prefix, drill.migrated)
        ctx = DrillContext(drill, db, workspace, console, scale, cluster, pair=pair, minutes=minutes,
                           patroni=patroni)
        await asyncio.wait_for(drill.run(ctx), limit)
    except UnderExercised as exc:
        note = f"under-exercised: {exc}"
    except TimeoutError:
        note = f"the drill did not finish within {limit:g}s"
        if ctx:
            ctx.expect(False, "the drill finishes", note)
    except Exception as exc:  # a crash of the drill is a failed drill, with its trace
        note = f"the drill crashed: {exc!r}"
        console.print(traceback.format_exc(), highlight=False, markup=False)
        if ctx:
            ctx.expect(False, "the drill runs to the end", repr(exc))
    finally:
        if ctx is not None:
            await ctx.close()
        if admin_url is not None:
            _drop_database(admin_url, name)
        if cluster is not None:
            _stop_cluster(cluster)
        if pair is not None:
            pair.close()
        if patroni is not None:
            patroni.close()
        if not keep:
            shutil.rmtree(workspace, ignore_errors=True)
    expectations = ctx.expectations if ctx else []
    if any(not e.held for e in expectations):
        verdict: Verdict = "fail"
    elif note.startswith("under-exercised") or not expectations:
        verdict = "under-exercised"
        note = note or "no expectation was checked"
    else:
        verdict = "pass"
    colour = {"pass": "green", "fail": "red", "under-exercised": "yellow"}[verdict]
    console.print(f"  verdict: [bold {colour}]{verdict}[/]" + (f" -- {note}" if note else "") + "\n",
                  highlight=False)
    return DrillReport(drill.name, verdict, round(time.monotonic() - started, 2),
                       ctx.timeline if ctx else [], [asdict(e) for e in expectations], note)


def _stop_cluster(cluster: Path) -> None:
    """Stop a drill's own cluster (the library only stops it at process exit)."""
    from ledger.db.embedded import server_of

    server = server_of(cluster)
    if server is not None:
        server.cleanup()
    shutil.rmtree(cluster, ignore_errors=True)


def load_drills() -> dict[str, Drill]:
    """Every installed drill, by name, in their declared order.

    Drills are plugins of the ``ledger.drills`` entry-point group (the
    ``ledger.drills`` package, the repository's drills/, declares its list there), so the
    library never imports the drills that are built on it.
    """
    from importlib.metadata import entry_points

    found: dict[str, Drill] = {}
    for point in entry_points(group="ledger.drills"):
        for d in point.load():
            found[d.name] = d
    return found


def write_report(path: Path, reports: list[DrillReport]) -> None:
    """The JSON report of a run."""
    path.write_text(json.dumps({"drills": [asdict(r) for r in reports],
                                "verdicts": {r.name: r.verdict for r in reports}}, indent=2))

