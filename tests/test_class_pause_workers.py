"""Pausing a class under real worker processes, from the command line, and the
registry of processes those workers keep (README "Operator controls").

Two ``ledger worker`` processes serve two classes; alpha has a large weight,
so while both have work nearly every claim's turn is alpha's. Alpha is paused
(``ledger classes pause``) while one of its attempts is in flight: that
attempt finishes, beta's campaigns opened after the pause are all attempted,
and alpha's stay ready; resumed (``ledger classes resume``), the workers take
alpha's campaigns at once. Meanwhile each worker (and its reaper) is in the
registry with what it holds; a worker killed with SIGKILL shows as gone.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from conftest import TEST_PREFIX, Actors, Admin
from drive import eventually
from ledger.config import load_config
from ledger.drills.paths import scripted_attempt

pytestmark = [pytest.mark.anyio, pytest.mark.cells]

SCRIPT = scripted_attempt()


class Shop:
    """A repository, a ledger.toml with classes alpha (blocking attempts) and
    beta (quick ones), and worker processes."""

    def __init__(self, root: Path, db_url: str):
        self.root, self.db_url = root, db_url
        self.repo = root / "repo"
        self.markers = root / "markers"
        self.markers.mkdir()
        self.procs: list[subprocess.Popen[bytes]] = []
        subprocess.run(["git", "init", "-q", "-b", "main", str(self.repo)], check=True)
        (self.repo / "README").write_text("a repository under repair\n")
        git = ["git", "-C", str(self.repo), "-c", "user.name=t", "-c", "user.email=t@t"]
        subprocess.run([*git, "add", "."], check=True)
        subprocess.run([*git, "commit", "-qm", "start"], check=True)
        plans = {"alpha": {"default": [["write", "fix.txt", "alpha"], ["block"], ["exit", 0]]},
                 "beta": {"default": [["write", "fix.txt", "beta"], ["exit", 0]]}}
        classes = []
        for name, plan in plans.items():
            (self.markers / f"{name}.json").write_text(json.dumps(plan))
            classes.append(f"""
[classes.{name}]
repository = "{self.repo}"
attempt_command = ["{sys.executable}", "{SCRIPT}", "{self.markers / f'{name}.json'}"]
attempt_timeout_s = 60
lease_s = 10
heartbeat_s = 1
weight = {1000 if name == "alpha" else 1}
backoff = {{ base_s = 0, jitter = 0 }}
cell = {{ writable = ["{self.markers}"] }}
""")
        self.config = root / "ledger.toml"
        self.config.write_text("".join(classes))

    def env(self) -> dict[str, str]:
        return {**os.environ, "LEDGER_DATABASE_URL": self.db_url, "LEDGER_ROLE_PREFIX": TEST_PREFIX,
                "LEDGER_DATA_DIR": str(self.root / "data"), "LEDGER_CONFIG": str(self.config)}

    def worker(self) -> subprocess.Popen[bytes]:
        log = open(self.root / f"worker-{len(self.procs)}.log", "wb")
        proc = subprocess.Popen([sys.executable, "-m", "ledger", "worker", "--poll", "0.2",
                                 "--grace", "0.3", "--drain-timeout", "10"],
                                env=self.env(), stdout=log, stderr=subprocess.STDOUT)
        self.procs.append(proc)
        return proc

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "ledger", *args], env=self.env(),
                              capture_output=True, text=True, timeout=60)

    def release(self, campaign: int, attempt: int = 1) -> None:
        (self.markers / f"release-{campaign}-{attempt}").write_text("go")

    def started(self, campaign: int, attempt: int = 1) -> bool:
        return (self.markers / f"started-{campaign}-{attempt}").exists()

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


@pytest.fixture
async def shop(tmp_path: Path, db_url: str, actors: Actors) -> AsyncIterator[Shop]:
    s = Shop(tmp_path, db_url)
    op = await actors("operator")
    config = load_config(s.config)
    for name in ("alpha", "beta"):
        await op.register_class(name, **config.campaign_class(name).registration())
    yield s
    s.stop_all()


def _states(admin: Admin, ids: list[int]) -> list[str]:
    rows = admin.execute("SELECT id, state FROM ledger.campaign WHERE id = ANY(%s)", (ids,)).fetchall()
    by = {r["id"]: r["state"] for r in rows}
    return [by[i] for i in ids]


async def test_workers_skip_a_paused_class_finish_its_attempt_and_take_it_back(
        shop: Shop, actors: Actors, admin: Admin) -> None:
    sensor = await actors("sensor")

    async def open_(cls: str, n: int) -> list[int]:
        return [(await sensor.open_campaign(cls, f"{cls}-{os.urandom(4).hex()}", "repo")).campaign_id
                for _ in range(n)]

    [first] = await open_("alpha", 1)
    workers = [shop.worker(), shop.worker()]
    await eventually(lambda: shop.started(first), timeout=30, what="alpha's first attempt to start")

    # The registry: both workers and their reapers, the holder of `first` says so.
    reads = await actors.reads()

    async def holder() -> bool:
        rows = await reads.processes()
        return any(r.role == "worker" and r.status == "live"
                   and [h["id"] for h in r.holds] == [first] for r in rows)
    await eventually(holder, timeout=30, what="the worker holding alpha's attempt in the registry")

    async def everyone_live() -> bool:
        # the second worker may still be starting when the first already holds
        live = [r.role for r in await reads.processes() if r.status == "live"]
        return live.count("worker") == 2 and live.count("reaper") == 2
    await eventually(everyone_live, timeout=30, what="both workers and their reapers in the registry")
    rows = await reads.processes()
    assert {r.pid for r in rows if r.role == "worker"} == {p.pid for p in workers}
    held_by = next(r for r in rows if r.role == "worker" and r.holds)
    lease_owner = admin.execute("SELECT lease_owner FROM ledger.campaign WHERE id = %s",
                                (first,)).fetchone()["lease_owner"]
    assert held_by.identity == lease_owner and held_by.holds[0]["attempt"] == 1

    paused = shop.cli("classes", "pause", "alpha", "--reason", "new agent rolling out")
    assert paused.returncode == 0, paused.stderr
    assert "paused class alpha" in paused.stderr
    waiting = await open_("alpha", 3)
    quick = await open_("beta", 3)
    # The free worker takes every beta campaign; alpha's, whose turn nearly
    # every claim would be (weight 1000 to 1), stay ready while paused.
    await eventually(lambda: _states(admin, quick) == ["attempted"] * 3, timeout=60,
                     what="beta's campaigns attempted while alpha is paused")
    assert _states(admin, waiting) == ["ready"] * 3
    assert admin.execute("SELECT count(*) AS n FROM ledger.attempt WHERE campaign_id = ANY(%s)",
                         (waiting,)).fetchone()["n"] == 0
    # The attempt in flight finishes.
    shop.release(first)
    await eventually(lambda: _states(admin, [first]) == ["attempted"], timeout=30,
                     what="the attempt in flight to finish while its class is paused")
    assert _states(admin, waiting) == ["ready"] * 3

    listed = shop.cli("classes", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    assert {c["name"]: c["paused_at"] is not None for c in json.loads(listed.stdout)} == {
        "alpha": True, "beta": False}
    resumed = shop.cli("classes", "resume", "alpha")
    assert resumed.returncode == 0 and "resumed class alpha" in resumed.stderr
    await eventually(lambda: all(shop.started(c) for c in waiting[:2]), timeout=30,
                     what="alpha's campaigns claimed again after the resume")
    for cid in waiting:
        shop.release(cid)
    await eventually(lambda: _states(admin, waiting) == ["attempted"] * 3, timeout=60,
                     what="alpha's campaigns attempted after the resume")

    journal = await reads.class_events("alpha")
    assert [(e.type, e.actor.startswith("cli:"), e.reason) for e in journal] == [
        ("class.resumed", True, None), ("class.paused", True, "new agent rolling out")]
    assert shop.cli("classes", "pause", "no-such-class").returncode == 6  # NotFound's exit code

    # A worker killed outright stops reporting and shows as gone; one stopped
    # with SIGTERM says so on its way out.
    killed, stopped = workers
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    stopped.send_signal(signal.SIGTERM)
    assert stopped.wait(timeout=30) == 0

    async def settled() -> bool:
        by = {(r.role, r.pid): r.status for r in await reads.processes()}
        return by.get(("worker", killed.pid)) == "gone" and by.get(("worker", stopped.pid)) == "stopped"
    await eventually(settled, timeout=30, what="the killed worker gone and the stopped one stopped")
