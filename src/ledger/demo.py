"""``ledger demo``: the closed loop, end to end, in one command.

It makes a throwaway git repository whose unit test fails, a campaign class
whose attempt command (``examples/demo_attempt.py``) first makes a wrong fix and
then a different right one, and a sensor that runs the tests on ``main`` every
couple of seconds. Then it runs a sensor, a worker, a verifier and a dispatcher
in this process -- each as its own database role -- and narrates the campaign's
journal as it happens: opened, leased, attempt 1 rejected (and why), attempt 2,
verified, promoted (ref moved and read back), the next scheduled observation
green, confirmed. It prints the journal and exits 0; nothing keeps running --
except, with ``--ui``, the dashboard over the demo's database (``ledger.api``),
served from the start and, after the loop closes, until Ctrl-C. Where no
cell can be built (no bubblewrap, or a kernel refusing user namespaces), its
commands -- Ledger's own scripted agent and unit tests -- run outside one, and
one line says so; ``--require-sandbox`` refuses instead.

On the embedded default it uses a throwaway database of its own run
(``ledger_demo_<pid>``, dropped when it ends; one left by a killed run is
dropped by the next) so it leaves the real ``ledger`` database alone, and two
demos on one data directory leave each other's alone.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import psycopg
from rich.console import Console

from ledger import logs
from ledger.config import LedgerConfig, parse_config
from ledger.db import migrations
from ledger.db.database import Database
from ledger.db.embedded import create_database, drop_database, server_url
from ledger.db.hub import Hub
from ledger.db.kernel import Kernel
from ledger.db.models import Event
from ledger.db.reads import Reads
from ledger.identity import process_identity
from ledger.roles.sensors import Sensors
from ledger.roles.services import ReaperOptions, RunOptions, one_machine
from ledger.roles.worker import WorkerOptions
from ledger.runtime.host import Host, serve
from ledger.sandbox import cell as cells
from ledger.settings import Settings
from ledger.tail import SyntheticEvent, tail

DEMO_DATABASE = "ledger_demo"
DEMO_CLASS = "fix-tests"
DEMO_SENSOR = "unit-tests"
DEADLINE_S = 55.0

CALC = '''def add(a, b):
    """Add two numbers."""
    return a - b
'''
TEST_CALC = '''import unittest

from calc import add


class AddTest(unittest.TestCase):
    def test_add(self):
        self.assertEqual(add(2, 3), 5)

    def test_add_negative(self):
        self.assertEqual(add(-1, 1), 0)
'''


def examples_dir() -> Path:
    """The shipped examples: packaged in a wheel, or at the repository top."""
    packaged = Path(__file__).parent / "_examples"
    if packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parents[2] / "examples"


def demo_database_name(pid: int | None = None) -> str:
    """The embedded server's database for the demo run of process ``pid``: each
    run has its own, so two demos on one data directory never drop each other's."""
    return f"{DEMO_DATABASE}_{os.getpid() if pid is None else pid}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_demo_databases(admin_url: str) -> list[str]:
    """Drop the demo databases of runs whose process is gone (a run killed
    before it dropped its own); returns their names."""
    with psycopg.connect(admin_url, autocommit=True) as conn:
        names = [r[0] for r in conn.execute(
            "SELECT datname FROM pg_database WHERE datname ~ %s", (f"^{DEMO_DATABASE}_[0-9]+$",))]
    gone = [n for n in names if not _alive(int(n.rsplit("_", 1)[1]))]
    for name in gone:
        drop_database(admin_url, name)
    return gone


def prepare_database(settings: Settings) -> tuple[Database, Callable[[], None]]:
    """A migrated database for the demo, and what drops it when the run ends
    (nothing on a configured server: the demo uses that database as it is)."""
    if settings.database_url:
        url = settings.database_url
        done: Callable[[], None] = lambda: None  # noqa: E731
    else:
        admin = server_url(settings.data_dir)
        sweep_demo_databases(admin)
        name = demo_database_name()
        url = create_database(admin, name, replace=True)  # a stale one of a reused pid
        done = lambda: drop_database(admin, name)  # noqa: E731
    migrations.upgrade(url, settings.role_prefix)
    return Database(url, role_prefix=settings.role_prefix, role_urls=settings.role_urls()), done


def make_repository(root: Path) -> Path:
    """A bare repository whose ``main`` has a failing unit test."""
    work, bare = root / "work", root / "calc.git"
    env = {"GIT_AUTHOR_NAME": "Demo", "GIT_AUTHOR_EMAIL": "demo@localhost",
           "GIT_COMMITTER_NAME": "Demo", "GIT_COMMITTER_EMAIL": "demo@localhost", "PATH": "/usr/bin:/bin"}
    subprocess.run(["git", "init", "-q", "-b", "main", str(work)], check=True, env=env)
    (work / "calc.py").write_text(CALC)
    (work / "test_calc.py").write_text(TEST_CALC)
    subprocess.run(["git", "-C", str(work), "add", "."], check=True, env=env)
    subprocess.run(["git", "-C", str(work), "commit", "-qm", "calc: add (with a bug)"], check=True, env=env)
    subprocess.run(["git", "clone", "-q", "--bare", str(work), str(bare)], check=True, env=env)
    shutil.rmtree(work)
    return bare


def demo_config(repository: Path, sensor_every_s: float = 2.0, *,
                sandbox: bool = True) -> LedgerConfig:
    """The demo's class and sensor (what a ledger.toml would say). Without
    ``sandbox`` its commands -- the demo's own scripted agent and its unit
    tests, Ledger's code -- run outside a cell: ``cell.sandbox = false`` for
    this class and its sensor only."""
    examples = examples_dir()
    python = sys.executable
    cell = {} if sandbox else {"cell": {"sandbox": False}}
    return parse_config({
        "classes": {DEMO_CLASS: {**cell,
            "repository": str(repository), "base_ref": "main",
            "attempt_command": [python, str(examples / "demo_attempt.py")],
            "attempt_timeout_s": 30, "max_attempts": 3, "lease_s": 10, "heartbeat_s": 2,
            "backoff": {"base_s": 0, "jitter": 0},
            "acceptance": {"commands": [[python, "-m", "unittest", "-q"]], "timeout_s": 30,
                           **cell},
            "verifier": "command", "promote_to": "refs/heads/main",
            "authority": {"worker": {"refs": ["refs/heads/ledger/*"]}},
        }},
        "sensors": {DEMO_SENSOR: {**cell,
            "target": f"{repository}#main", "every_s": sensor_every_s,
            # run in a fresh export of the target's ref (main), in a cell
            "command": [python, "-m", "unittest", "-q"],
            "class": DEMO_CLASS, "objective": "tests-pass:{target}",
        }},
    }, "demo")


class Narrator:
    """Turns journal events into a readable timeline."""

    def __init__(self, console: Console):
        self.console = console
        self.start = time.monotonic()
        self.rejections: dict[int, str] = {}

    def line(self, what: str, detail: str = "") -> None:
        elapsed = time.monotonic() - self.start
        self.console.print(f"[dim]{elapsed:6.2f}s[/]  [bold]{what:<11}[/] {detail}", highlight=False)

    def event(self, e: Event) -> None:
        p = e.payload
        name = p.get("transition") if e.type == "transition" else e.type
        attempt = p.get("attempt_no")
        texts: dict[str, tuple[str, str]] = {
            "open": ("opened", f"sensor {e.actor} saw the tests fail on main"),
            "claim": ("leased", f"by {e.actor} (generation {e.generation})"),
            "attempt.started": ("attempt", f"{attempt} started in a fresh worktree on {p.get('branch')}"),
            "commit.made": ("committed", f"{str(p.get('candidate_sha'))[:12]} "
                                         f"(approach {str(p.get('fingerprint'))[:19]})"),
            "record_attempt": ("attempted", f"attempt {attempt} recorded; the bundle is frozen"),
            "fail_attempt": ("failed", f"attempt {attempt}: {p.get('reason')}"),
            "verification.started": ("checking", f"{e.actor} on a clean checkout"),
            "reject": ("rejected", f"attempt {attempt}: {p.get('reason')}"),
            "accept": ("verified", f"attempt {attempt} passed, judged by {e.actor}"),
            "side_effect.requested": ("intent", f"promote onto {p.get('target')} (recorded before acting)"),
            "side_effect.done": ("promoted", f"{p.get('target')} moved and read back at "
                                             f"{str((p.get('result') or {}).get('read_back', ''))[:12]}"),
            "side_effect.conflict": ("conflict", f"{p.get('target')} had moved; starting over"),
            "promote_failed": ("back", "to ready: the target moved"),
            "regress": ("regressed", "red after promotion"),
            "confirm": ("confirmed", f"the next scheduled observation (#{p.get('observation_id')}) "
                                     "was green"),
            "exhaust": ("exhausted", "attempts used up; a human decides"),
            "abandon": ("abandoned", str(p.get("reason"))),
        }
        if name in texts:
            self.line(*texts[name])

    def journal(self, events: list[Event]) -> None:
        self.console.print("\n[bold]journal[/]")
        for e in events:
            what = e.payload.get("transition") or e.type
            move = f"{e.payload.get('from') or '-'} -> {e.payload['to']}" if e.type == "transition" else ""
            self.console.print(f"  {e.seq:>3}  {what:<22} {move:<24} {e.actor}", highlight=False)


async def _find_campaign(reads: Reads, hub: Hub, objective: str) -> int:
    with hub.subscribe("ledger_ready") as ready:
        while True:
            found = await reads.campaigns(objective_key=objective, limit=1)
            if found:
                return found[0].id
            await ready.wait(1.0)


@asynccontextmanager
async def _dashboard(db: Database, config: LedgerConfig, port: int | None,
                     console: Console) -> AsyncIterator[Any]:
    """``--ui``: the dashboard over the demo's database while the block runs, with
    an operator token made for it (``None``: no dashboard)."""
    if port is None:
        yield None
        return
    from ledger.api import ApiOptions, TokenTable, create_app, hash_token, new_token
    from ledger.api.server import BackgroundServer

    token = new_token()
    app = create_app(db, TokenTable.parse(f"demo:operator:{hash_token(token)}"), ApiOptions(),
                     config)
    server = await BackgroundServer(app, port=port).start()
    console.print(f"[bold]dashboard[/]   {server.url}  (sign in with the token {token})",
                  highlight=False, soft_wrap=True)
    try:
        yield server
    finally:
        await server.stop()
        # stop() forces the exit (browsers' event streams would hold it open), which
        # skips the app's lifespan shutdown: run it, or the task waiting for it is
        # cancelled at exit and logged as a traceback (tests/test_dashboard_demo.py).
        await server._server.lifespan.shutdown()


class _Serving:
    """The dashboard keeps serving (in the background) until the host stops."""

    name = "dashboard"

    async def run_once(self) -> int:
        return 0

    async def run(self, stop: asyncio.Event) -> None:
        await stop.wait()


async def _serve_until_interrupted(console: Console) -> None:
    console.print("\nthe dashboard keeps serving; Ctrl-C to stop", highlight=False)
    await serve([_Serving()], name="demo")


def sandbox_problem() -> str | None:
    """Why no cell can be built here (``None``: one can)."""
    try:
        cells.check_available()
    except cells.SandboxUnavailable as exc:
        return exc.message
    return None


async def run_demo(settings: Settings, console: Console, *, sensor_every_s: float = 1.0,
                   ui_port: int | None = None, require_sandbox: bool = False) -> int:
    """Run the closed loop; returns the exit code. With ``ui_port`` (0: any free
    port) the dashboard is served too, and kept serving until Ctrl-C.

    Where no cell can be built, the demo's commands -- its own scripted agent
    and its unit tests, Ledger's code, never an agent of the user's -- run
    outside one (for the demo's class only), and one line says what is
    missing, what was skipped and how to get it; ``require_sandbox`` refuses
    instead (``SandboxUnavailable``, exit 78), before anything is made."""
    narrator = Narrator(console)
    problem = await asyncio.to_thread(sandbox_problem)
    if problem is not None and require_sandbox:
        raise cells.SandboxUnavailable(f"{problem}: the demo was not run",
                                       hint="apt-get install bubblewrap, or run the demo "
                                            "without --require-sandbox")
    db, drop = prepare_database(settings)
    try:
        return await _run_demo(db, narrator, console, sensor_every_s, ui_port, problem)
    finally:
        drop()


async def _run_demo(db: Database, narrator: Narrator, console: Console, sensor_every_s: float,
                    ui_port: int | None, no_cell: str | None) -> int:
    narrator.line("database", f"migrated to {migrations.current(db.url)}")
    if no_cell is not None:
        narrator.line("no cell", f"{no_cell}; the demo runs its own scripted agent and checks "
                                 "outside a cell, for its class only (what it skips: the "
                                 "sandbox; to have it: apt-get install bubblewrap; "
                                 "--require-sandbox refuses instead)")
    with tempfile.TemporaryDirectory(prefix="ledger-demo-") as tmp:
        root = Path(tmp)
        repository = make_repository(root)
        config = demo_config(repository, sensor_every_s, sandbox=no_cell is None)
        narrator.line("repository", f"{repository}: calc.add subtracts; its unit test fails")
        logs.configure("error")  # the narration is the output; errors still show
        async with Hub(db) as hub, db.session("reader") as reading, \
                db.session("operator") as operating, db.session("sensor") as sensing, \
                AsyncExitStack() as stack, _dashboard(db, config, ui_port, console) as dashboard:
            await Kernel(operating).register_class(DEMO_CLASS, **config.classes[DEMO_CLASS].registration())
            options = RunOptions(WorkerOptions(data_dir=root / "data", poll_s=1.0),
                                 ReaperOptions(grace_s=2.0, interval_s=2.0),
                                 verification_lease_s=15.0)
            # The narration runs beside the host, so Ctrl-C stays the demo's
            # (KeyboardInterrupt, exit 130): the host handles no signal here.
            host = Host(name="demo", policy="restart", handle_signals=False)
            for service in await one_machine(stack, db, config, options, hub):
                host.add(service)
            running = asyncio.create_task(host.run())
            # A new sensor's first tick is the next one on its schedule; rather than
            # wait for it, the sensor looks once now (as `ledger sensor run --once`).
            await Sensors(Kernel(sensing), config, [DEMO_SENSOR], process_identity("sensor"),
                          data_dir=root / "data").run_once()
            reader = Reads(reading)
            objective = config.sensors[DEMO_SENSOR].objective_key()
            try:
                async with asyncio.timeout(DEADLINE_S):
                    cid = await _find_campaign(reader, hub, objective)
                    async for item in tail(reader, hub, cid, keepalive_s=60.0):
                        if isinstance(item, Event) and not isinstance(item, SyntheticEvent):
                            narrator.event(item)
            except TimeoutError:
                console.print(f"[red]the loop did not close within {DEADLINE_S:g}s[/]")
                return 1
            finally:
                host.stop()
                await running
            final = await reader.campaign(cid)
            narrator.journal(await reader.events(cid))
            main = subprocess.run(["git", "-C", str(repository), "rev-parse", "main"],
                                  capture_output=True, text=True).stdout.strip()
            console.print(f"\ncampaign {cid} is [bold]{final.state}[/]; main is now {main[:12]} "
                          f"(promoted {str(final.promoted_sha)[:12]})")
            if dashboard is not None:
                await _serve_until_interrupted(console)
            return 0 if final.state == "confirmed" else 1

