"""The worker runtime with real processes, real signals and real git:
SIGKILL, SIGSTOP/SIGCONT, abandon, SIGTERM drain, acquire-before-pull and
"the next attempt must differ"."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from conftest import TEST_PREFIX, Actors, Admin
from drive import eventually
from ledger.config import load_config
from ledger.drills.paths import scripted_attempt
from ledger.git import bundle as bundles
from ledger.ops.drill import host_pid, process_gone

pytestmark = [pytest.mark.anyio, pytest.mark.cells]

SCRIPT = scripted_attempt()
CLASS = "work"
LEASE_S, HEARTBEAT_S, GRACE_S = 2.0, 0.4, 0.3


class Workshop:
    """A git repository, a ledger.toml whose attempt command follows a plan,
    and worker processes to run against the test database."""

    def __init__(self, root: Path, db_url: str):
        self.root, self.db_url = root, db_url
        self.repo = root / "repo"
        self.data = root / "data"
        # the plan and the attempt's markers: the one host directory its cell may write
        self.markers = root / "markers"
        self.markers.mkdir()
        self.plan_file = self.markers / "plan.json"
        self.procs: list[subprocess.Popen[bytes]] = []
        subprocess.run(["git", "init", "-q", "-b", "main", str(self.repo)], check=True)
        (self.repo / "README").write_text("a repository under repair\n")
        git = ["git", "-C", str(self.repo), "-c", "user.name=t", "-c", "user.email=t@t"]
        subprocess.run([*git, "add", "."], check=True)
        subprocess.run([*git, "commit", "-qm", "start"], check=True)
        self.config = root / "ledger.toml"
        self.config.write_text(f"""
[classes.{CLASS}]
repository = "{self.repo}"
base_ref = "main"
attempt_command = ["{sys.executable}", "{SCRIPT}", "{self.plan_file}"]
attempt_timeout_s = 60
max_attempts = 3
lease_s = {LEASE_S}
heartbeat_s = {HEARTBEAT_S}
backoff = {{ base_s = 0, jitter = 0 }}
cell = {{ writable = ["{self.markers}"] }}
""")
        self.plan({})

    def plan(self, plan: dict[str, list[list[object]]]) -> None:
        self.plan_file.write_text(json.dumps(plan))

    def marker(self, kind: str, campaign: int, attempt: int) -> Path:
        return self.markers / f"{kind}-{campaign}-{attempt}"

    def release(self, campaign: int, attempt: int) -> None:
        self.marker("release", campaign, attempt).write_text("go")

    def env(self) -> dict[str, str]:
        return {**os.environ, "LEDGER_DATABASE_URL": self.db_url, "LEDGER_ROLE_PREFIX": TEST_PREFIX,
                "LEDGER_DATA_DIR": str(self.data), "LEDGER_CONFIG": str(self.config)}

    def worker(self, *args: str, concurrency: int = 1, drain: float = 10.0,
               poll: float = 0.2) -> subprocess.Popen[bytes]:
        log = open(self.root / f"worker-{len(self.procs)}.log", "wb")
        proc = subprocess.Popen(
            [sys.executable, "-m", "ledger", "worker", "--concurrency", str(concurrency),
             "--poll", str(poll), "--grace", str(GRACE_S), "--drain-timeout", str(drain), *args],
            env=self.env(), stdout=log, stderr=subprocess.STDOUT)
        self.procs.append(proc)
        return proc

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGCONT)
                proc.kill()
                proc.wait()

    def logs(self) -> str:
        return "\n".join(p.read_text() for p in sorted(self.root.glob("worker-*.log")))


@pytest.fixture
async def shop(tmp_path: Path, db_url: str, actors: Actors) -> AsyncIterator[Workshop]:
    w = Workshop(tmp_path, db_url)
    op = await actors("operator")
    await op.register_class(CLASS, **load_config(w.config).campaign_class(CLASS).registration())
    yield w
    w.stop_all()


async def _open(actors: Actors, n: int = 1) -> list[int]:
    sensor = await actors("sensor")
    return [(await sensor.open_campaign(CLASS, f"objective-{i}", "repo")).campaign_id for i in range(n)]


def _rows(admin: Admin, sql: str, *params: object) -> list[dict]:
    return admin.execute(sql, params).fetchall()


def _attempts(admin: Admin, cid: int) -> list[tuple]:
    return [(r["attempt_no"], r["outcome"]) for r in _rows(
        admin, "SELECT attempt_no, outcome FROM ledger.attempt WHERE campaign_id = %s ORDER BY attempt_no", cid)]


def _transitions(admin: Admin, cid: int) -> list[str]:
    return [r["t"] for r in _rows(
        admin, "SELECT payload->>'transition' AS t FROM ledger.campaign_event "
               "WHERE campaign_id = %s AND type = 'transition' ORDER BY seq", cid)]


def _state(admin: Admin, cid: int) -> str:
    return _rows(admin, "SELECT state FROM ledger.campaign WHERE id = %s", cid)[0]["state"]


def _gone(pid: int) -> Callable[[], bool]:
    return lambda: process_gone(pid)


def _workdirs(shop: Workshop) -> list[Path]:
    root = shop.data / "attempts"
    return sorted(root.iterdir()) if root.exists() else []


async def test_sigkilled_worker_loses_the_attempt_not_the_campaign(shop: Workshop, actors: Actors, admin: Admin) -> None:
    shop.plan({"1": [["write", "fix.txt", "one"], ["block"], ["exit", 0]],
               "2": [["write", "fix.txt", "two"], ["exit", 0]]})
    [cid] = await _open(actors)
    first = shop.worker()
    started = shop.marker("started", cid, 1)
    await eventually(started.exists, what="attempt 1 to start")
    command_pid = host_pid(started.read_text())
    first.send_signal(signal.SIGKILL)
    first.wait()
    await eventually(_gone(command_pid), what="the attempt command to die with its worker")

    second = shop.worker()
    await eventually(lambda: _state(admin, cid) == "attempted", timeout=20, what="attempt 2 recorded")
    assert _attempts(admin, cid) == [(1, "lost"), (2, "attempted")]
    assert _transitions(admin, cid) == ["open", "claim", "expire_lease", "claim", "record_attempt"]
    row = _rows(admin, "SELECT attempt_count, generation FROM ledger.campaign WHERE id = %s", cid)[0]
    assert row == {"attempt_count": 2, "generation": 3}
    # The killed worker's worktree was swept by the next worker at boot.
    await eventually(lambda: _workdirs(shop) == [], what="orphaned workdirs swept")
    second.send_signal(signal.SIGTERM)
    assert second.wait(timeout=20) == 0


async def test_zombie_worker_writes_nothing_after_its_reap(shop: Workshop, actors: Actors, admin: Admin) -> None:
    shop.plan({"1": [["write", "fix.txt", "zombie"], ["lines", 50], ["block"], ["exit", 0]],
               "default": [["exit", 1]]})
    [cid] = await _open(actors)
    zombie = shop.worker()
    started = shop.marker("started", cid, 1)
    await eventually(started.exists, what="attempt 1 to start")
    zombie.send_signal(signal.SIGSTOP)

    reaper = await actors("reaper")
    reaped: list = []

    async def reap() -> bool:
        reaped.extend(await reaper.expire_leases(GRACE_S))
        return bool(reaped)
    await eventually(reap, timeout=20, what="the stopped worker's lease to be reaped")
    cut = _rows(admin, "SELECT max(seq) AS s FROM ledger.campaign_event WHERE campaign_id = %s", cid)[0]["s"]

    # Tempt the zombie: its command finishes with a change it would record.
    shop.release(cid, 1)
    zombie.send_signal(signal.SIGCONT)
    await eventually(lambda: _workdirs(shop) == [], timeout=20, what="the zombie to remove its worktree")
    # Once resumed, the process may claim the (ready) campaign afresh under a
    # new generation; the zombie *lease* (generation 1) must write nothing.
    later = _rows(admin, "SELECT seq, type FROM ledger.campaign_event WHERE campaign_id = %s "
                         "AND seq > %s AND generation = 1", cid, cut)
    assert later == [], "the zombie wrote to the journal after its reap"
    assert _attempts(admin, cid)[0] == (1, "lost")
    assert _rows(admin, "SELECT count(*) AS n FROM ledger.attempt WHERE campaign_id = %s "
                        "AND generation = 1 AND outcome <> 'lost'", cid)[0]["n"] == 0
    assert _rows(admin, "SELECT count(*) AS n FROM ledger.side_effect")[0]["n"] == 0
    zombie.send_signal(signal.SIGTERM)
    assert zombie.wait(timeout=20) == 0
    # It stood down: told by the database, or by its own clock first.
    assert "standing down" in shop.logs() or "self-fenced" in shop.logs()


async def test_next_attempt_must_differ(shop: Workshop, actors: Actors, admin: Admin) -> None:
    shop.plan({"1": [["write", "fix.txt", "A"], ["exit", 1]],
               "2": [["write", "fix.txt", "A"], ["exit", 0]],
               "3": [["write", "fix.txt", "B"], ["exit", 0]]})
    [cid] = await _open(actors)
    worker = shop.worker()
    await eventually(lambda: _state(admin, cid) == "attempted", timeout=30, what="a recorded attempt")
    rows = _rows(admin, "SELECT attempt_no, outcome, fingerprint, failure_reason, bundle_digest "
                        "FROM ledger.attempt WHERE campaign_id = %s ORDER BY attempt_no", cid)
    assert [r["outcome"] for r in rows] == ["failed", "failed", "attempted"]
    assert rows[0]["fingerprint"] == rows[1]["fingerprint"] is not None
    assert "exited with 1" in rows[0]["failure_reason"]
    assert "must differ" in rows[1]["failure_reason"]
    assert rows[2]["fingerprint"] not in (rows[0]["fingerprint"], None)
    # The candidate's bundle and diff are in the database, checked by the digest on the row,
    # and the candidate is published under its ledger ref.
    [row] = _rows(admin, "SELECT bundle, diff, candidate_sha, candidate_ref FROM ledger.attempt "
                         "WHERE campaign_id = %s AND attempt_no = 3", cid)
    frozen = bundles.verify(row["bundle"], row["diff"], rows[2]["bundle_digest"])
    assert frozen.fingerprint == rows[2]["fingerprint"] == bundles.fingerprint_of(row["diff"])
    assert b"+B" in row["diff"]
    assert row["candidate_ref"] == f"refs/heads/ledger/{cid}/3"
    assert subprocess.run(["git", "-C", str(shop.repo), "rev-parse", row["candidate_ref"]], check=True,
                          capture_output=True, text=True).stdout.strip() == row["candidate_sha"]
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=20) == 0


async def test_a_saturated_worker_never_claims(shop: Workshop, actors: Actors, admin: Admin) -> None:
    shop.plan({"default": [["block"], ["exit", 1]]})
    cids = await _open(actors, 10)
    worker = shop.worker(concurrency=2, drain=0.5)

    def leased() -> int:
        return _rows(admin, "SELECT count(*) AS n FROM ledger.campaign WHERE state = 'leased'")[0]["n"]

    await eventually(lambda: len(list(shop.markers.glob("started-*"))) == 2, what="two attempts running")
    # Observe across several poll ticks: never a third lease.
    samples = []
    deadline = time.monotonic() + 1.5
    while time.monotonic() < deadline:
        samples.append(leased())
        time.sleep(0.05)
    assert set(samples) == {2}
    # A slot frees: exactly one more claim.
    first = sorted(shop.markers.glob("started-*"))[0]
    shop.markers.joinpath(first.name.replace("started", "release")).write_text("go")
    await eventually(lambda: len(list(shop.markers.glob("started-*"))) == 3, what="a third attempt")
    assert leased() == 2
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=20) == 0
    # Past the drain budget the leftovers are handed back, never stuck in leased.
    assert leased() == 0
    states = {r["state"] for r in _rows(admin, "SELECT state FROM ledger.campaign WHERE id = ANY(%s)", cids)}
    assert states == {"ready"}
    assert _rows(admin, "SELECT count(*) AS n FROM ledger.attempt WHERE outcome = 'drained'")[0]["n"] == 2


async def test_free_slots_are_filled_by_one_batch_claim(shop: Workshop, actors: Actors, admin: Admin) -> None:
    """A worker with several free slots claims for all of them in one
    statement (claim_campaigns), each campaign with its own lease
    and attempt; one claim per slot would stamp each with its own time."""
    shop.plan({"default": [["block"], ["exit", 1]]})
    cids = await _open(actors, 3)
    worker = shop.worker(concurrency=3, drain=0.5)
    await eventually(lambda: len(list(shop.markers.glob("started-*"))) == 3, what="three attempts running")
    rows = _rows(admin, "SELECT campaign_id, generation, claimed_at FROM ledger.attempt "
                        "WHERE campaign_id = ANY(%s) ORDER BY campaign_id", cids)
    assert [r["campaign_id"] for r in rows] == sorted(cids)
    assert len({r["claimed_at"] for r in rows}) == 1  # one statement
    assert {r["generation"] for r in rows} == {1}
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=20) == 0
    assert {_state(admin, cid) for cid in cids} == {"ready"}  # drained and handed back


async def test_sigterm_lets_a_short_attempt_finish_and_claims_nothing_new(shop: Workshop, actors: Actors, admin: Admin) -> None:
    shop.plan({"default": [["write", "fix.txt", "done"], ["block"], ["exit", 0]]})
    first, second = await _open(actors, 2)
    worker = shop.worker(drain=30)
    await eventually(shop.marker("started", first, 1).exists, what="the first attempt")
    worker.send_signal(signal.SIGTERM)
    await eventually(lambda: "stopping" in shop.logs(), what="the worker to begin stopping")
    shop.release(first, 1)
    assert worker.wait(timeout=30) == 0
    assert _state(admin, first) == "attempted"
    assert _state(admin, second) == "ready"
    assert _attempts(admin, second) == []


async def test_sigterm_past_the_drain_budget_hands_the_campaign_back(shop: Workshop, actors: Actors, admin: Admin) -> None:
    shop.plan({"default": [["block"], ["exit", 0]]})
    [cid] = await _open(actors)
    worker = shop.worker(drain=0.3)
    started = shop.marker("started", cid, 1)
    await eventually(started.exists, what="the attempt")
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0
    assert _state(admin, cid) == "ready"
    assert _attempts(admin, cid) == [(1, "drained")]
    row = _rows(admin, "SELECT attempt_count FROM ledger.campaign WHERE id = %s", cid)[0]
    assert row["attempt_count"] == 0, "a drained attempt must not use up the budget"
    await eventually(_gone(host_pid(started.read_text())), what="the attempt command to be killed")
    assert _workdirs(shop) == []


async def test_abandon_kills_the_attempt_within_a_heartbeat(shop: Workshop, actors: Actors, admin: Admin) -> None:
    shop.plan({"default": [["child"], ["write", "fix.txt", "x"], ["block"], ["exit", 0]]})
    [cid] = await _open(actors)
    worker = shop.worker()
    started = shop.marker("started", cid, 1)
    await eventually(started.exists, what="the attempt")
    command, grandchild = host_pid(started.read_text()), host_pid(shop.marker("child", cid, 1).read_text())
    cut = _rows(admin, "SELECT max(seq) AS s FROM ledger.campaign_event WHERE campaign_id = %s", cid)[0]["s"]

    began = time.monotonic()
    await (await actors("operator")).abandon(cid, "not needed any more")
    await eventually(_gone(command), timeout=10, interval=0.02, what="the attempt command to die")
    elapsed = time.monotonic() - began
    await eventually(_gone(grandchild), what="the command's own children to die")
    assert elapsed < HEARTBEAT_S + 1.0, f"took {elapsed:.2f}s, heartbeat is {HEARTBEAT_S}s"
    await eventually(lambda: _workdirs(shop) == [], what="the worktree to be removed")

    assert _state(admin, cid) == "abandoned"
    assert _attempts(admin, cid) == [(1, "abandoned")]
    after = _rows(admin, "SELECT type FROM ledger.campaign_event WHERE campaign_id = %s AND seq > %s", cid, cut)
    assert [r["type"] for r in after] == ["transition"]  # the abandon itself, nothing from the worker
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=20) == 0


async def test_a_burst_of_output_is_coalesced_and_kept_whole(shop: Workshop, actors: Actors, admin: Admin) -> None:
    shop.plan({"default": [["lines", 2000], ["write", "fix.txt", "ok"], ["exit", 0]]})
    [cid] = await _open(actors)
    worker = shop.worker()
    await eventually(lambda: _state(admin, cid) == "attempted", timeout=30, what="the attempt")
    outputs = _rows(admin, "SELECT payload->>'text' AS text FROM ledger.campaign_event "
                           "WHERE campaign_id = %s AND type = 'output' ORDER BY seq", cid)
    text = "".join(r["text"] for r in outputs)
    assert text == "".join(f"line {i} of attempt {cid}-1\n" for i in range(2000))
    assert 1 <= len(outputs) <= 20, f"{len(outputs)} rows for 2000 lines"
    kinds = [r["type"] for r in _rows(admin, "SELECT type FROM ledger.campaign_event WHERE campaign_id = %s "
                                             "ORDER BY seq", cid)]
    assert kinds[kinds.index("command.started"):].count("command.exited") == 1
    assert kinds.index("command.exited") > max(i for i, k in enumerate(kinds) if k == "output")
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=20) == 0


async def test_an_idle_worker_wakes_on_notify_not_on_its_poll_tick(shop: Workshop, actors: Actors, admin: Admin) -> None:
    shop.plan({"default": [["write", "fix.txt", "x"], ["exit", 0]]})
    worker = shop.worker("--log-level", "debug", poll=10.0)
    await eventually(lambda: "idle: nothing to claim" in shop.logs(), what="the worker to go idle")
    [cid] = await _open(actors)  # opened by another process: this test's sensor connection
    await eventually(lambda: _state(admin, cid) != "ready", timeout=5, what="the claim")
    row = _rows(admin, "SELECT extract(epoch FROM a.claimed_at - c.created_at) AS latency FROM ledger.attempt a "
                       "JOIN ledger.campaign c ON c.id = a.campaign_id WHERE c.id = %s", cid)[0]
    assert float(row["latency"]) < 1.0, f"claimed after {row['latency']}s with a 10 s poll tick"
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=20) == 0


async def test_a_leftover_child_and_nul_output_do_not_stall_or_break_the_attempt(shop: Workshop, actors: Actors, admin: Admin) -> None:
    # The grandchild keeps stdout open and sleeps for minutes; the attempt must
    # end when the command exits, and the grandchild must die with its cell.
    # A process left running is what the cell reports: a security event, and
    # the candidate refused.
    shop.plan({"1": [["child"], ["print", "binary junk: \u0000 end\n"], ["write", "fix.txt", "y"],
                     ["exit", 0]]})
    [cid] = await _open(actors)
    worker = shop.worker()
    await eventually(lambda: _attempts(admin, cid)[:1] == [(1, "failed")], timeout=20,
                     what="the attempt to end")
    await eventually(_gone(host_pid(shop.marker("child", cid, 1).read_text())), what="the grandchild to be killed")
    [reason] = [r["failure_reason"] for r in _rows(
        admin, "SELECT failure_reason FROM ledger.attempt WHERE campaign_id = %s AND attempt_no = 1", cid)]
    assert "cell.leftover_processes" in reason
    assert [r["action"] for r in _rows(admin, "SELECT action FROM ledger.security_event WHERE campaign_id = %s",
                                       cid)] == ["cell.leftover_processes"]
    output = "".join(r["t"] for r in _rows(admin, "SELECT payload->>'text' AS t FROM ledger.campaign_event "
                                                   "WHERE campaign_id = %s AND type = 'output' ORDER BY seq", cid))
    assert "binary junk: \ufffd end" in output
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=20) == 0


async def test_a_claim_whose_attempt_cannot_start_is_handed_back_not_held(
        shop: Workshop, actors: Actors, admin: Admin) -> None:
    """The worker claims (the claim is recorded) but cannot make the attempt's
    directory: the claim is released without charge -- not kept alive by
    heartbeats with no attempt behind it, nor left to expire and be charged."""
    shop.plan({"default": [["write", "fix.txt", "one"], ["exit", 0]]})
    shop.data.mkdir(parents=True, exist_ok=True)
    (shop.data / "attempts").write_text("a file where the attempts' directory goes")
    [cid] = await _open(actors)
    proc = shop.worker()
    await eventually(lambda: "release" in _transitions(admin, cid), timeout=20,
                     what="the claim to be handed back")
    row = _rows(admin, "SELECT state, attempt_count, waiting_on, waiting_reason FROM ledger.campaign "
                       "WHERE id = %s", cid)[0]
    assert (row["attempt_count"], row["waiting_on"]) == (0, "system_fault"), row
    assert "could not" in row["waiting_reason"] or "Ledger's worker failed" in row["waiting_reason"], row
    assert _transitions(admin, cid)[:3] == ["open", "claim", "release"]
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == 0
