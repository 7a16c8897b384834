"""The independent verifier (README "What a candidate is judged by") on real PostgreSQL, real git
repositories and real processes.

The worker is simulated with the kernel: it claims, commits a candidate in a
tiny repository, freezes a real bundle with ``ledger.git.bundle`` and records the
attempt -- exactly what the worker runtime hands the verifier.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from conftest import TEST_PREFIX
from drive import eventually, now, record_candidate
from ledger import Forbidden, Kernel, Reads, SameIdentity, verifiers
from ledger.db.models import Verification
from ledger.git import repository
from ledger.ops.drill import host_pid, process_gone
from ledger.roles.verifier import Verifier
from ledger.sandbox.processes import TAIL_BYTES, run_command
from ledger.verifiers.pytest_report import node_id, pytest_command

pytestmark = pytest.mark.anyio

PY = sys.executable
# Stray GIT_DIR / GIT_INDEX_FILE from a calling git would redirect the test repos.
GIT_ENV = {**{k: v for k, v in os.environ.items() if not k.startswith("GIT_")},
           **repository.LEDGER.env("AUTHOR"), **repository.LEDGER.env("COMMITTER")}

BASE_CODE = "def add(a, b):\n    return a + b\n\n\ndef mul(a, b):\n    return a + b\n"
TESTS = textwrap.dedent("""\
    from calc import add, mul


    def test_add():
        assert add(2, 3) == 5


    def test_mul():
        assert mul(2, 3) == 6
""")


# --- helpers -----------------------------------------------------------------


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], env=GIT_ENV, check=True,
                          capture_output=True, text=True).stdout.strip()


def make_repo(path: Path) -> tuple[Path, str]:
    """A repository whose ``main`` has a failing test (``mul`` is wrong)."""
    path.mkdir(parents=True)
    git(path, "init", "-q", "-b", "main")
    (path / "calc.py").write_text(BASE_CODE)
    (path / "test_calc.py").write_text(TESTS)
    git(path, "add", "-A")
    git(path, "commit", "-q", "-m", "base")
    return path, git(path, "rev-parse", "HEAD")


def candidate(repo: Path, base: str, code: str, message: str) -> str:
    """A commit on top of ``base`` with ``calc.py`` replaced."""
    git(repo, "checkout", "-q", "--detach", base)
    (repo / "calc.py").write_text(code)
    git(repo, "commit", "-q", "-am", message)
    sha = git(repo, "rev-parse", "HEAD")
    git(repo, "checkout", "-q", "main")
    return sha


class FakeWorker:
    """The worker's side of the contract, through the kernel."""

    def __init__(self, actors: Any, class_: str, repo: Path, base: str, data_dir: Path):
        self.actors, self.class_, self.repo, self.base, self.data_dir = actors, class_, repo, base, data_dir

    async def open(self, key: str) -> int:
        sensor = await self.actors("sensor")
        return (await sensor.open_campaign(self.class_, key, str(self.repo))).campaign_id

    async def attempt(self, campaign_id: int, sha: str, acceptance: dict[str, Any], *,
                      verifier: str = "command", worker: str = "worker-A") -> tuple[int, str]:
        """Claim, publish ``sha`` and record the attempt with its bundle;
        returns the attempt number and the bundle digest."""
        kernel = await self.actors("worker")
        claim = await kernel.claim_campaign(worker, [self.class_])
        assert claim is not None and claim.campaign_id == campaign_id
        n, digest = await record_candidate(kernel, claim, repo=self.repo, base=self.base, sha_=sha,
                                           acceptance=acceptance, verifier=verifier, worker=worker)
        assert n == claim.attempt_no
        return n, digest


async def verifications(actors: Any, campaign_id: int) -> list[Verification]:
    return (await (await actors.reads("reader")).campaign_detail(campaign_id)).verifications


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting for its reaper does not count)."""
    return not process_gone(pid)


@pytest.fixture
def repo(tmp_path: Path) -> tuple[Path, str]:
    return make_repo(tmp_path / "repo")


@pytest.fixture
def worker(actors: Any, test_class: str, repo: tuple[Path, str], tmp_path: Path) -> FakeWorker:
    return FakeWorker(actors, test_class, repo[0], repo[1], tmp_path / "data")


def passing(*extra: list[str], timeout_s: float = 60.0) -> dict[str, Any]:
    return {"commands": [[PY, "-c", "pass"], *extra], "timeout_s": timeout_s}


# --- a campaign: rejected, then accepted --------------------------------------


@pytest.mark.rollback  # only SQL: a transaction rolled back after the test
@pytest.mark.cells
async def test_bad_candidate_rejected_with_evidence_then_good_one_accepted(
        actors: Any, worker: FakeWorker, test_class: str, tmp_path: Path) -> None:
    acceptance = {"commands": [[PY, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_calc.py"]],
                  "timeout_s": 60.0}
    breaks_add = candidate(worker.repo, worker.base,
                           "def add(a, b):\n    return a - b\n\n\ndef mul(a, b):\n    return a * b\n",
                           "fix mul, break add")
    fixes = candidate(worker.repo, worker.base,
                      "def add(a, b):\n    return a + b\n\n\ndef mul(a, b):\n    return a * b\n",
                      "fix mul")
    work = tmp_path / "work"
    work.mkdir()
    verifier = Verifier(await actors("verifier"), model_family="family-v", classes=[test_class],
                        lease_s=10, work_dir=work)
    cid = await worker.open("calc-tests")

    n1, digest1 = await worker.attempt(cid, breaks_add, acceptance, verifier="pytest")
    assert await verifier.run_once() == 1
    (first,) = await verifications(actors, cid)
    assert first.status == "rejected" and first.verifier == verifier.identity
    assert first.model_family == "family-v"
    assert first.reason == "1 test(s) failed: test_calc.py::test_add"
    ev = first.evidence
    assert ev["failed_tests"] == ["test_calc.py::test_add"]
    assert ev["bundle_digest"] == digest1 and ev["candidate_sha"] == breaks_add
    assert ev["checked_out_sha"] == breaks_add
    assert ev["verifier"] == verifier.identity and ev["model_family"] == "family-v"
    (cmd,) = ev["commands"]
    assert cmd["exit_code"] == 1 and cmd["timed_out"] is False and cmd["duration_s"] > 0
    # run by the fixed judge: isolated mode, Ledger's launcher (under a name that says
    # nothing), a configuration outside the checkout
    assert cmd["argv"][:2] == [PY, "-I"] and cmd["argv"][2].startswith("/tmp/tmp") and "/lib/" in cmd["argv"][2]
    assert "ledger" not in " ".join(cmd["argv"]).lower()
    assert "-c" in cmd["argv"] and not any(a.startswith("--junitxml") for a in cmd["argv"])
    assert "test_add" in cmd["output"] and "1 failed, 1 passed" in cmd["output"]
    campaign = await (await actors.reads("reader")).campaign(cid)
    assert campaign.state == "ready"
    assert list(work.iterdir()) == []  # the clean checkout is gone

    n2, digest2 = await worker.attempt(cid, fixes, acceptance, verifier="pytest", worker="worker-B")
    assert await verifier.run_once() == 1
    assert await verifier.run_once() == 0  # nothing else is waiting
    first_again, second = await verifications(actors, cid)
    assert first_again == first
    assert second.status == "accepted" and second.reason is None
    assert second.evidence["failed_tests"] == [] and second.evidence["commands"][0]["exit_code"] == 0
    assert second.evidence["bundle_digest"] == digest2 and second.evidence["candidate_sha"] == fixes
    assert "2 passed" in second.evidence["commands"][0]["output"]
    assert list(work.iterdir()) == []

    detail = await (await actors.reads("reader")).campaign_detail(cid)
    assert detail.campaign.state == "verified"
    assert [(a.attempt_no, a.candidate_sha, a.verdict) for a in detail.attempts] == [
        (n1, breaks_add, "rejected"), (n2, fixes, "accepted")]
    moves = [(e.payload["transition"], e.payload["to"], e.payload.get("attempt_no"), e.actor)
             for e in await (await actors.reads("reader")).events(cid) if e.type == "transition"]
    assert moves == [
        ("open", "ready", None, moves[0][3]),
        ("claim", "leased", None, "worker-A"),
        ("record_attempt", "attempted", n1, "worker-A"),
        ("reject", "ready", n1, verifier.identity),
        ("claim", "leased", None, "worker-B"),
        ("record_attempt", "attempted", n2, "worker-B"),
        ("accept", "verified", n2, verifier.identity),
    ]


# --- identity and role --------------------------------------------------------


@pytest.mark.rollback  # only SQL: a transaction rolled back after the test
@pytest.mark.cells
async def test_verifier_never_judges_its_own_attempt_nor_acts_as_worker(
        actors: Any, worker: FakeWorker, test_class: str, admin: Any) -> None:
    identity = "agent:shared-identity"
    cid = await worker.open("identity")
    await worker.attempt(cid, worker.base, passing(), worker=identity)
    verifier_kernel = await actors("verifier")

    same = Verifier(verifier_kernel, identity=identity, classes=[test_class])
    assert await same.run_once() == 0  # never given the campaign its identity attempted
    assert await verifications(actors, cid) == []

    # Force it past the claim: a running verification under the worker's own
    # identity. ledger.current_verification refuses any verdict from it.
    attempt_id = admin.execute("SELECT id FROM ledger.attempt WHERE campaign_id = %s",
                               (cid,)).fetchone()["id"]
    forced = admin.execute(
        "INSERT INTO ledger.verification (campaign_id, attempt_id, generation, verifier, kind, "
        "claimed_at, lease_expires_at) SELECT id, %s, generation, %s, 'command', now(), "
        "now() + interval '1 hour' "
        "FROM ledger.campaign WHERE id = %s RETURNING id", (attempt_id, identity, cid)).fetchone()["id"]
    with pytest.raises(SameIdentity):
        await verifier_kernel.accept(forced, {"forced": True})
    with pytest.raises(SameIdentity):
        await verifier_kernel.reject(forced, "forced")
    assert (await (await actors.reads("reader")).campaign(cid)).state == "attempted"
    admin.execute("UPDATE ledger.verification SET status = 'lost', finished_at = now() WHERE id = %s",
                  (forced,))

    # Another identity gets it -- and the worker role can record no verdict on it.
    other = Verifier(verifier_kernel, identity="verifier-other", classes=[test_class])
    claim = await other.claim()
    assert claim is not None and claim.campaign_id == cid and claim.worker == identity
    worker_kernel = await actors("worker")
    with pytest.raises(Forbidden):
        await worker_kernel.accept(claim.verification_id, {"by": "worker"})
    with pytest.raises(Forbidden):
        await worker_kernel.reject(claim.verification_id, "by worker")
    with pytest.raises(Forbidden):  # ...nor can the verifier role claim like a worker
        await verifier_kernel.claim_campaign(identity, [test_class])
    assert await other.verify(claim) == "accepted"
    statuses = [(v.verifier, v.status) for v in await verifications(actors, cid)]
    assert statuses == [(identity, "lost"), ("verifier-other", "accepted")]


# --- tampering ----------------------------------------------------------------


@pytest.mark.parametrize("edited", ["bundle", "diff"])
async def test_a_recorded_bundle_edited_afterwards_is_rejected(
        actors: Any, admin: Any, worker: FakeWorker, test_class: str, edited: str) -> None:
    # The recorded acceptance fails; the edit would make it pass.
    failing = {"commands": [[PY, "-c", "raise SystemExit(1)"]], "timeout_s": 30.0}
    cid = await worker.open(f"tamper-{edited}")
    _, digest = await worker.attempt(cid, worker.base, failing)
    if edited == "bundle":
        admin.execute("UPDATE ledger.attempt SET bundle = jsonb_set(bundle, '{acceptance,commands}', "
                      "%s::jsonb) WHERE campaign_id = %s",
                      (json.dumps([[PY, "-c", "raise SystemExit(0)"]]), cid))
    else:
        admin.execute("UPDATE ledger.attempt SET diff = diff || '\\x0a'::bytea WHERE campaign_id = %s", (cid,))

    verifier = Verifier(await actors("verifier"), classes=[test_class])
    assert await verifier.run_once() == 1
    (v,) = await verifications(actors, cid)
    assert v.status == "rejected"
    assert v.reason is not None and v.reason.startswith("bundle tampered:")
    assert "does not match its digest" in v.reason and digest in v.reason
    assert "commands" not in v.evidence  # nothing from the edited bundle was run
    assert v.evidence["bundle_digest"] == digest
    detail = await (await actors.reads("reader")).campaign_detail(cid)
    assert detail.campaign.state == "ready" and detail.attempts[0].verdict == "rejected"
    assert "bundle tampered" in (detail.campaign.last_failure_reason or "")


@pytest.mark.rollback  # only SQL: a transaction rolled back after the test
async def test_a_bundle_naming_an_uninstalled_verifier_waits_saying_so(
        actors: Any, worker: FakeWorker, test_class: str) -> None:
    """A verifier implementation this host lacks is no verdict on the
    candidate: the verification is released, nothing is charged, and the
    campaign says why it waits."""
    cid = await worker.open("unknown-verifier")
    await worker.attempt(cid, worker.base, passing(), verifier="no_such_verifier")
    assert await Verifier(await actors("verifier"), classes=[test_class]).run_once() == 1
    (v,) = await verifications(actors, cid)
    assert v.status == "released" and "'no_such_verifier'" in (v.reason or "")
    campaign = await (await actors.reads("reader")).campaign(cid)
    assert campaign.state == "attempted" and campaign.attempt_count == 1
    assert campaign.waiting_on == "system_fault" and "no_such_verifier" in (campaign.waiting_reason or "")


# --- a verifier killed mid-check -----------------------------------------------

BLOCKING = textwrap.dedent("""\
    import os, sys, time, pathlib
    marker, release = map(pathlib.Path, sys.argv[1:3])
    tmp = marker.with_suffix(".tmp")
    tmp.write_text(f"{os.getpid()} {os.readlink('/proc/self/ns/pid')}")  # (ledger.ops.drill.host_pid)
    tmp.rename(marker)
    deadline = time.monotonic() + 120
    while not release.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    sys.exit(0 if release.exists() else 1)
""")


def blocking(tmp_path: Path) -> tuple[dict[str, Any], Path, Path]:
    """An acceptance that blocks until released, and its marker and release
    files: in the one host directory its cell may write."""
    markers = tmp_path / "markers"
    markers.mkdir(exist_ok=True)
    marker, release = markers / "checking.pid", markers / "release"
    return ({"commands": [[PY, "-c", BLOCKING, str(marker), str(release)]], "timeout_s": 120.0,
             "cell": {"writable": [str(markers)]}}, marker, release)


@pytest.mark.cells
async def test_killed_verifier_lapses_and_a_second_finishes_with_one_verdict(
        actors: Any, worker: FakeWorker, test_class: str, db_url: str, tmp_path: Path) -> None:
    acceptance, marker, release = blocking(tmp_path)
    cid = await worker.open("killed")
    await worker.attempt(cid, worker.base, acceptance)
    env = {**os.environ, "LEDGER_DATABASE_URL": db_url, "LEDGER_ROLE_PREFIX": TEST_PREFIX,
           "LEDGER_DATA_DIR": str(tmp_path / "data"), "NO_COLOR": "1"}
    log = (tmp_path / "verifier.log").open("w")
    proc = subprocess.Popen(
        [PY, "-m", "ledger", "verifier", "--once", "--lease", "30", "--class", test_class,
         "--model-family", "family-a"], env=env, stdout=log, stderr=subprocess.STDOUT)
    orphan = None
    try:
        await eventually(lambda: marker.exists() or proc.poll() is not None, what="the acceptance to start", timeout=30.0)
        assert proc.poll() is None, (tmp_path / "verifier.log").read_text()
        orphan = host_pid(marker.read_text())
        (running,) = await verifications(actors, cid)
        assert running.status == "running" and f":{proc.pid}:" in running.verifier

        proc.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL
        release.touch()  # let the orphaned acceptance command (its own session) exit
        await eventually(lambda: not alive(orphan), what="the orphaned acceptance command to exit", timeout=30.0)

        second = Verifier(await actors("verifier"), identity="verifier-second",
                          classes=[test_class], lease_s=10)
        assert await second.run_once() == 0  # the dead verifier's lease still holds it

        # Past the lease (clock pinned to just after it), the claim lapses and
        # the second verifier gets the campaign.
        session = actors.session("verifier")
        async with session.transaction(now=running.lease_expires_at + timedelta(seconds=1)) as tx:
            claim = await Kernel(tx).claim_verification(second.identity, lease_s=second.lease_s,
                                                        classes=[test_class])
        assert claim is not None and claim.campaign_id == cid
        assert await second.verify(claim) == "accepted"
    finally:
        release.touch()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if orphan is not None and alive(orphan):
            os.kill(orphan, signal.SIGKILL)
        log.close()

    rows = await verifications(actors, cid)
    assert [(v.verifier, v.status) for v in rows] == [(running.verifier, "lost"),
                                                      ("verifier-second", "accepted")]
    assert rows[0].reason == "verifier lease expired" and rows[0].evidence == {}
    assert (await (await actors.reads("reader")).campaign(cid)).state == "verified"
    verdicts = [e for e in await (await actors.reads("reader")).events(cid)
                if e.type == "transition" and e.payload["transition"] in ("accept", "reject")]
    assert len(verdicts) == 1 and verdicts[0].actor == "verifier-second"


@pytest.mark.rollback  # only SQL: a transaction rolled back after the test
@pytest.mark.cells
async def test_stale_heartbeat_stops_the_check_and_writes_nothing(
        actors: Any, worker: FakeWorker, test_class: str, tmp_path: Path) -> None:
    acceptance, marker, release = blocking(tmp_path)
    cid = await worker.open("stale")
    await worker.attempt(cid, worker.base, acceptance)
    work = tmp_path / "work"
    work.mkdir()
    kernel = await actors("verifier")
    first = Verifier(kernel, identity="verifier-one", classes=[test_class], lease_s=30,
                     heartbeat_s=0.05, work_dir=work)
    checking = asyncio.ensure_future(first.run_once())
    try:
        await eventually(marker.exists, what="the first verifier's acceptance to start", timeout=30.0)
        command = host_pid(marker.read_text())
        (running,) = await verifications(actors, cid)
        # Its lease lapses (clock pinned past it) and another verifier takes over.
        async with actors.session("verifier").transaction(
                now=running.lease_expires_at + timedelta(seconds=1)) as tx:
            claim = await Kernel(tx).claim_verification("verifier-two", classes=[test_class])
        assert claim is not None
        assert await asyncio.wait_for(checking, 30) == 1  # stopped without the release
    finally:
        checking.cancel()
        release.touch()
    assert first.verdicts == {"accepted": 0, "rejected": 0, "stale": 1, "released": 0}
    await eventually(lambda: not alive(command), what="the stale check's command to be killed", timeout=30.0)
    assert list(work.iterdir()) == []
    (lost, taken) = await verifications(actors, cid)
    assert (lost.verifier, lost.status, lost.evidence) == ("verifier-one", "lost", {})
    assert (taken.verifier, taken.status) == ("verifier-two", "running")
    second = Verifier(kernel, identity="verifier-two", classes=[test_class])
    assert await second.verify(claim) == "accepted"
    assert [v.status for v in await verifications(actors, cid)] == ["lost", "accepted"]


@pytest.mark.cells
async def test_a_verifier_cut_off_from_the_database_stops_its_check_before_its_lease_expires(
        actors: Any, worker: FakeWorker, test_class: str, tmp_path: Path, db_url: str) -> None:
    """Self-fencing (ledger.lease): the path to the database goes silent, so
    no heartbeat can confirm the verification's lease; the verifier stops the
    check on its own clock, before the database would expire the lease, and
    records nothing."""
    from ledger import Database
    from ledger.ops.faultproxy import FaultProxy

    acceptance, marker, release = blocking(tmp_path)
    cid = await worker.open("cut-off")
    await worker.attempt(cid, worker.base, acceptance)
    with FaultProxy.before(db_url) as proxy:
        session = await Database(proxy.url(db_url), role_prefix=TEST_PREFIX).session("verifier").open()
        try:
            verifier = Verifier(Kernel(session), identity="verifier-cut-off", classes=[test_class],
                                lease_s=3.0, heartbeat_s=0.5, work_dir=tmp_path)
            checking = asyncio.ensure_future(verifier.run_once())
            await eventually(marker.exists, what="the acceptance to start", timeout=30.0)
            command = host_pid(marker.read_text())
            proxy.silence()
            assert await asyncio.wait_for(checking, 10) == 1, "the check did not stop on its own"
            stopped = now()
        finally:
            release.touch()
            proxy.heal()
            await session.close()
    assert verifier.verdicts["stale"] == 1
    await eventually(lambda: not alive(command), what="the check's command to be killed", timeout=10.0)
    (running,) = await verifications(actors, cid)
    assert running.status == "running", "nothing was recorded"
    assert stopped < running.lease_expires_at, (stopped, running.lease_expires_at)


@pytest.mark.cells
async def test_a_database_stall_shorter_than_the_lease_costs_the_verification_nothing(
        actors: Any, worker: FakeWorker, test_class: str, tmp_path: Path, db_url: str) -> None:
    """The path to the database goes silent for well over the 1-1.5 s a
    heartbeat once waited, but for less than the lease: the heartbeats wait
    (each for as long as the lease allows, retried on a fresh connection when
    the path comes back), the check goes on, and its verdict is recorded."""
    from ledger import Database
    from ledger.ops.faultproxy import FaultProxy

    acceptance, marker, release = blocking(tmp_path)
    cid = await worker.open("stalled")
    await worker.attempt(cid, worker.base, acceptance)
    with FaultProxy.before(db_url) as proxy:
        session = await Database(proxy.url(db_url), role_prefix=TEST_PREFIX).session("verifier").open()
        try:
            verifier = Verifier(Kernel(session), identity="verifier-stalled", classes=[test_class],
                                lease_s=8.0, heartbeat_s=0.5, work_dir=tmp_path)
            checking = asyncio.ensure_future(verifier.run_once())
            await eventually(marker.exists, what="the acceptance to start", timeout=30.0)
            proxy.silence()
            await asyncio.sleep(3.0)  # the stall itself: a duration, not a condition
            proxy.heal()
            assert not checking.done(), "the check stopped during a stall shorter than its lease"
            release.touch()
            assert await asyncio.wait_for(checking, 30) == 1
        finally:
            release.touch()
            proxy.heal()
            await session.close()
    assert verifier.verdicts["accepted"] == 1, verifier.verdicts
    assert [v.status for v in await verifications(actors, cid)] == ["accepted"]


# --- timeouts -----------------------------------------------------------------

SPAWNS_AND_HANGS = textwrap.dedent("""\
    import os, subprocess, sys, time, pathlib
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    out = pathlib.Path(sys.argv[1])
    ns = os.readlink('/proc/self/ns/pid')
    out.with_suffix(".tmp").write_text(f"{os.getpid()} {ns}\\n{child.pid} {ns}")
    out.with_suffix(".tmp").rename(out)
    print("started", flush=True)
    time.sleep(120)
""")


@pytest.mark.rollback  # only SQL: a transaction rolled back after the test
@pytest.mark.cells
async def test_acceptance_past_its_timeout_is_killed_with_its_children_and_rejected(
        actors: Any, worker: FakeWorker, test_class: str, tmp_path: Path) -> None:
    markers = tmp_path / "markers"
    markers.mkdir()
    pids = markers / "pids"
    acceptance = {"commands": [[PY, "-c", SPAWNS_AND_HANGS, str(pids)], [PY, "-c", "pass"]],
                  "timeout_s": 1.5, "cell": {"writable": [str(markers)]}}
    cid = await worker.open("slow")
    await worker.attempt(cid, worker.base, acceptance)
    verifier = Verifier(await actors("verifier"), classes=[test_class])
    run = asyncio.ensure_future(verifier.run_once())
    try:
        await eventually(pids.exists, what="the acceptance command to start its child", timeout=30.0)
        parent, child = (host_pid(line) for line in pids.read_text().splitlines())
        assert await asyncio.wait_for(run, 60) == 1
    finally:
        run.cancel()
    (v,) = await verifications(actors, cid)
    assert v.status == "rejected"
    assert v.reason is not None and "exceeded the acceptance timeout" in v.reason
    assert "killed with its process group" in v.reason
    (cmd,) = v.evidence["commands"]
    assert cmd["timed_out"] is True and cmd["exit_code"] == -signal.SIGKILL
    assert 1.0 <= cmd["duration_s"] < 30 and "started" in cmd["output"]
    assert v.evidence["not_run"] == [[PY, "-c", "pass"]]
    await eventually(lambda: not alive(parent) and not alive(child), what="the command and its child to die", timeout=30.0)
    assert (await (await actors.reads("reader")).campaign(cid)).state == "ready"


# --- the long-running command ---------------------------------------------------


@pytest.mark.cells
async def test_verifier_command_verifies_until_sigterm_then_exits_zero(
        actors: Any, worker: FakeWorker, test_class: str, db_url: str, tmp_path: Path) -> None:
    env = {**os.environ, "LEDGER_DATABASE_URL": db_url, "LEDGER_ROLE_PREFIX": TEST_PREFIX,
           "LEDGER_DATA_DIR": str(tmp_path / "data"), "NO_COLOR": "1"}
    proc = subprocess.Popen([PY, "-m", "ledger", "verifier", "--poll", "0.1", "--class", test_class,
                             "--model-family", "family-b", "--log-level", "info"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        cid = await worker.open("served")
        await worker.attempt(cid, worker.base, passing())
        reader = await actors.reads()
        await eventually(lambda: _state_is(reader, cid, "verified"), what="the running verifier's verdict",
                         timeout=30.0)
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, stderr
    (v,) = await verifications(actors, cid)
    assert v.status == "accepted" and v.model_family == "family-b"
    lines = [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]
    accepted = [line for line in lines if line.get("event") == "candidate accepted"]
    assert accepted and accepted[0]["campaign"] == cid and accepted[0]["verification"] == v.id
    assert lines[-1]["event"] == "verifier stopped" and lines[-1]["accepted"] == 1


async def _state_is(reader: Reads, cid: int, state: str) -> bool:
    return (await reader.campaign(cid)).state == state


# --- the implementations, without a database -------------------------------------


async def test_output_is_kept_as_a_bounded_tail(tmp_path: Path) -> None:
    script = "import sys; sys.stdout.write('x' * 100000 + 'END'); sys.stdout.flush(); sys.exit(3)"
    result = await run_command([PY, "-c", script], tmp_path, timeout_s=30)
    assert result.exit_code == 3 and not result.passed
    assert result.output_bytes == 100003 and result.truncated
    assert len(result.output) == TAIL_BYTES and result.output.endswith("xEND")


async def test_a_command_that_exits_is_done_even_if_its_children_hold_the_output(
        tmp_path: Path) -> None:
    pid_file = tmp_path / "straggler.pid"
    script = (f"import subprocess, sys; p = subprocess.Popen([sys.executable, '-c', "
              f"'import time; time.sleep(120)']); open({str(pid_file)!r}, 'w').write(str(p.pid)); "
              f"print('left a child behind')")
    result = await run_command([PY, "-c", script], tmp_path, timeout_s=20)
    assert result.passed and not result.timed_out and result.duration_s < 10
    assert "left a child behind" in result.output
    straggler = int(pid_file.read_text())
    await eventually(lambda: not alive(straggler), what="the straggler to be killed with the group", timeout=30.0)


async def test_acceptance_commands_never_see_ledger_settings(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setenv("LEDGER_VERIFIER_DATABASE_URL", "postgresql://secret@db/ledger")
    monkeypatch.setenv("PGPASSWORD", "secret")
    result = await run_command([PY, "-c", "import os; print(sorted(os.environ))"], tmp_path,
                               timeout_s=30)
    assert result.passed and "PATH" in result.output
    assert "LEDGER_" not in result.output and "PGPASSWORD" not in result.output


def test_pytest_commands_and_node_ids() -> None:
    import xml.etree.ElementTree as ET

    assert pytest_command(["make", "test"]) is None
    assert pytest_command([PY, "-m", "pytest", "-q"]) == [PY, "-m", "pytest", "-q"]
    rewritten = pytest_command(["pytest", "-x"])
    assert rewritten is not None and rewritten[1:] == ["-m", "pytest", "-x"]
    case = ET.fromstring('<testcase file="tests/test_a.py" classname="tests.test_a.TestB" '
                         'name="test_c[1-2]"/>')
    assert node_id(case) == "tests/test_a.py::TestB::test_c[1-2]"
    assert node_id(ET.fromstring('<testcase classname="tests.test_a" name="test_d"/>')) == \
        "tests/test_a.py::test_d"
    assert sorted(verifiers.names())[:2] == ["command", "pytest"]
    with pytest.raises(verifiers.UnknownVerifier):
        verifiers.load("no-such-verifier")
    with pytest.raises(verifiers.InvalidAcceptance):
        verifiers.Acceptance.from_spec({"commands": [], "timeout_s": 1})
