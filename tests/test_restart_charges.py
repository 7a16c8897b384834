"""Faults that are not the attempt's cost nothing: a real
PostgreSQL stopped (fast, and immediate: a crash) and started again under a
real worker process, for longer than its lease -- during its attempt, and in
the window between its claim and its start -- charges nothing, and the agent
runs once per lease; a worker SIGKILLed mid-attempt still costs its attempt,
with a restart of the database and without. And a bare heartbeat on a short
lease against a silent server gives up within the lease."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from conftest import TEST_PREFIX
from drive import Driver, eventually, scaled
from ledger import Database, Kernel, Unavailable
from ledger.db import migrations
from ledger.db.embedded import create_database
from ledger.drills.paths import scripted_attempt
from ledger.ops.cluster import Cluster
from ledger.ops.faultproxy import FaultProxy
from ledger.ops.gitserver import GitDaemon, bare_repository

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

CLASS = "work"
LEASE_S = 3.0


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    c = Cluster(Path(tempfile.mkdtemp(prefix="ledger-test-cluster-")))
    yield c
    c.close()


class Fleet:
    """A database on the private cluster, a class whose attempt blocks until
    released, and worker processes against it."""

    def __init__(self, cluster: Cluster, work: Path, repository: str, lease_s: float = LEASE_S):
        self.cluster = cluster
        self.work = work
        self.url = create_database(cluster.url, "ledger_charges")
        migrations.upgrade(self.url, TEST_PREFIX)
        self.markers = work / "markers"
        self.markers.mkdir()
        plan = self.markers / "plan.json"
        plan.write_text(json.dumps({"default": [["block"], ["own", "own"], ["exit", 0]]}))
        q = json.dumps
        (work / "ledger.toml").write_text("\n".join([
            f"[classes.{CLASS}]", f"repository = {q(repository)}",
            f"attempt_command = {q([sys.executable, str(scripted_attempt()), str(plan)])}",
            "attempt_timeout_s = 120", "max_attempts = 3", f"lease_s = {lease_s}", "heartbeat_s = 0.5",
            "backoff = { base_s = 0, jitter = 0 }",
            'authority.worker = { refs = ["refs/heads/ledger/*"] }',
            f"acceptance = {{ commands = [[{q(sys.executable)}, '-c', 'pass']], timeout_s = 30 }}",
            f"cell = {{ writable = {q([str(self.markers)])} }}", ""]))
        self.env = {**{k: v for k, v in os.environ.items() if not k.startswith("LEDGER_")},
                    "LEDGER_DATABASE_URL": self.url, "LEDGER_ROLE_PREFIX": TEST_PREFIX,
                    "LEDGER_DATA_DIR": str(work / "data"), "LEDGER_CONFIG": str(work / "ledger.toml"),
                    "NO_COLOR": "1"}
        subprocess.run([sys.executable, "-m", "ledger", "classes", "sync"], env=self.env, check=True,
                       capture_output=True)
        self.procs: list[subprocess.Popen[bytes]] = []

    def worker(self, name: str = "worker") -> subprocess.Popen[bytes]:
        log = self.work / f"{name}.log"
        proc = subprocess.Popen([sys.executable, "-m", "ledger", "worker", "--poll", "0.3", "--grace", "0.5",
                                 "--wait-for-database", "120"], env=self.env,
                                stdout=log.open("ab"), stderr=subprocess.STDOUT)
        self.procs.append(proc)
        return proc

    def log(self, name: str = "worker") -> str:
        path = self.work / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def rows(self, query: str, *params: Any) -> list[dict[str, Any]]:
        with psycopg.connect(self.url, row_factory=dict_row) as conn:
            return conn.execute(query, params).fetchall()

    async def open(self) -> int:
        db = Database(self.url, role_prefix=TEST_PREFIX)
        async with db.session("sensor") as s:
            return (await Kernel(s).open_campaign(CLASS, f"objective-{time.monotonic_ns()}", "repo")).campaign_id

    def started(self, campaign: int, attempt: int) -> Path:
        return self.markers / f"started-{campaign}-{attempt}"

    def release(self, campaign: int, attempt: int) -> None:
        (self.markers / f"release-{campaign}-{attempt}").write_text("go")

    def charges(self, campaign: int) -> dict[str, Any]:
        row = self.rows("SELECT state, attempt_count FROM ledger.campaign WHERE id = %s", campaign)[0]
        events = self.rows("SELECT type, generation, payload->>'transition' AS t FROM ledger.campaign_event "
                           "WHERE campaign_id = %s ORDER BY seq", campaign)
        return {**row, "transitions": [e["t"] for e in events if e["type"] == "transition"],
                "starts": [e["generation"] for e in events if e["type"] == "attempt.started"],
                "renewed": sum(1 for e in events if e["type"] == "lease.renewed"),
                "outcomes": [r["outcome"] for r in self.rows(
                    "SELECT outcome FROM ledger.attempt WHERE campaign_id = %s ORDER BY attempt_no", campaign)]}

    def close(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGCONT)
                p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=scaled(30))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


@pytest.fixture
def local_repository(tmp_path: Path) -> str:
    (tmp_path / "remote").mkdir()
    return str(bare_repository(tmp_path / "remote", "repo.git", {"README": "under repair\n"}))


@pytest.fixture
def fleet(cluster: Cluster, tmp_path: Path, local_repository: str) -> Iterator[Fleet]:
    f = Fleet(cluster, tmp_path, local_repository)
    yield f
    f.close()


@pytest.mark.parametrize("mode", ["fast", "immediate"])
async def test_a_restart_longer_than_the_lease_during_an_attempt_charges_nothing(fleet: Fleet, mode: str) -> None:
    cid = await fleet.open()
    fleet.worker()
    await eventually(lambda: fleet.started(cid, 1).exists(), timeout=scaled(30), what="the attempt to start")
    fleet.cluster.stop(mode)  # type: ignore[arg-type]
    await eventually(lambda: "self-fenced" in fleet.log(), timeout=scaled(30),
                     what="the worker to stand down by its own clock, the server still down")
    fleet.cluster.start()
    # handed back once the server answers; the next attempt is its own lease
    await eventually(lambda: fleet.started(cid, 2).exists(), timeout=scaled(60),
                     what="the campaign handed back and claimed again")
    first = fleet.charges(cid)
    assert first["outcomes"][0] == "released", first
    assert "expire_lease" not in first["transitions"], first
    assert first["attempt_count"] == 0, first
    fleet.release(cid, 2)
    await eventually(lambda: fleet.charges(cid)["state"] == "attempted", timeout=scaled(60),
                     what="the second attempt to be recorded")
    after = fleet.charges(cid)
    assert after["attempt_count"] == 1 and after["outcomes"] == ["released", "attempted"], after
    assert len(after["starts"]) == len(set(after["starts"])) == 2, "a lease ran its attempt twice"


async def test_a_restart_shorter_than_the_lease_leaves_the_attempt_running(cluster: Cluster, tmp_path: Path,
                                                                          local_repository: str) -> None:
    """Leases in flight get their whole length again once the server is back
    (journaled), so a worker whose heartbeats failed through a restart goes on."""
    # A lease that outlasts the restart on a loaded machine too (stopping and
    # starting the server takes seconds there): what is tested is that the
    # attempt goes on through it, not how fast a restart is.
    lease_s = max(LEASE_S, scaled(6.0))
    fleet = Fleet(cluster, tmp_path, local_repository, lease_s=lease_s)
    try:
        cid = await fleet.open()
        fleet.worker()
        await eventually(lambda: fleet.started(cid, 1).exists(), timeout=scaled(30), what="the attempt to start")
        fleet.cluster.restart("fast", down_s=1.0)  # a second down: within what is left of the lease
        fleet.release(cid, 1)
        await eventually(lambda: fleet.charges(cid)["state"] == "attempted", timeout=scaled(60),
                         what="the attempt to be recorded")
        charges = fleet.charges(cid)
        assert charges["outcomes"] == ["attempted"] and "expire_lease" not in charges["transitions"], charges
        assert charges["attempt_count"] == 1 and charges["starts"] == [charges["starts"][0]]
    finally:
        fleet.close()


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[GitDaemon]:
    root = tmp_path / "served"
    root.mkdir()
    bare_repository(root, "repo.git", {"README": "under repair\n"})
    d = GitDaemon(root).start()
    try:
        yield d
    finally:
        d.close()


@pytest.mark.parametrize("mode", ["fast", "immediate"])
async def test_a_restart_between_the_claim_and_the_start_charges_nothing(
        cluster: Cluster, tmp_path: Path, daemon: GitDaemon, mode: str) -> None:
    """The worker claims, then waits on the repository (its server stopped
    with SIGSTOP) before it can write the attempt's start; the database goes
    down meanwhile, for longer than the lease. The claim is handed back,
    uncharged, once the server is back -- not left for the reaper."""
    fleet = Fleet(cluster, tmp_path, daemon.url("repo.git"))
    try:
        cid = await fleet.open()
        served = daemon._proc  # the git daemon's own process: a real process, really stopped
        assert served is not None
        os.kill(served.pid, signal.SIGSTOP)  # the repository stops answering
        fleet.worker()
        await eventually(lambda: fleet.charges(cid)["state"] == "leased", timeout=scaled(30),
                         what="the worker to claim the campaign")
        fleet.cluster.stop(mode)  # type: ignore[arg-type]
        os.kill(served.pid, signal.SIGCONT)  # the start now meets a database that is down
        await eventually(lambda: "out of reach" in fleet.log() or "self-fenced" in fleet.log(),
                         timeout=scaled(60), what="the worker to find the database out of reach")
        fleet.cluster.start()
        await eventually(lambda: fleet.started(cid, 2).exists(), timeout=scaled(60),
                         what="the claim handed back and the campaign claimed again")
        charges = fleet.charges(cid)
        assert charges["outcomes"][0] == "released", charges
        assert "expire_lease" not in charges["transitions"] and charges["attempt_count"] == 0, charges
        assert not fleet.started(cid, 1).exists(), "the first lease's agent must never have run"
        fleet.release(cid, 2)
    finally:
        fleet.close()


@pytest.mark.parametrize("restart", [False, True], ids=["no-restart", "with-restart"])
async def test_a_worker_killed_mid_attempt_still_costs_its_attempt_once(fleet: Fleet, restart: bool) -> None:
    cid = await fleet.open()
    worker = fleet.worker()
    await eventually(lambda: fleet.started(cid, 1).exists(), timeout=scaled(30), what="the attempt to start")
    worker.kill()  # SIGKILL: the worker is lost, not the system
    worker.wait()
    if restart:
        fleet.cluster.restart("immediate", down_s=0.5)
    fleet.worker("reaper")  # another worker process: its reaper reaps the lost lease
    await eventually(lambda: "expire_lease" in fleet.charges(cid)["transitions"], timeout=scaled(60),
                     what="the lost lease to be reaped")
    charges = fleet.charges(cid)
    assert charges["attempt_count"] == 1 and charges["outcomes"][0] == "lost", charges
    assert charges["transitions"].count("expire_lease") == 1, charges
    assert charges["renewed"] == (1 if restart else 0), charges  # the restart gave the lease its length once


async def test_a_bare_heartbeat_on_a_short_lease_gives_up_within_the_lease(
        db_url: str, actors: Any, admin: Any) -> None:
    """``Kernel.heartbeat`` without a timeout of its own, through a path that
    went silent: it raises within the lease's 5 s, not after the 30 s default."""
    op = await actors("operator")
    await op.register_class("short", lease_seconds=5, backoff_base_s=0, backoff_jitter=0)
    await Driver(actors, "short").open()
    with FaultProxy.before(db_url) as proxy:
        db = Database(proxy.url(db_url), role_prefix=TEST_PREFIX)
        async with db.session("worker") as session:
            kernel = Kernel(session)
            claim = await kernel.claim_campaign("worker-1", ["short"])
            assert claim is not None
            proxy.silence()
            started = time.monotonic()
            with pytest.raises(Unavailable):
                await kernel.heartbeat(claim.campaign_id, claim.generation)
            took = time.monotonic() - started
    assert took <= 5.5, f"the heartbeat gave up after {took:.1f}s on a 5 s lease"
