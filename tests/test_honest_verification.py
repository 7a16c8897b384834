"""A candidate is judged by the objective's tests, not by
its own. Real git repositories, real pytest runs, real PostgreSQL.

The verifier side records candidates straight through the kernel (a worker
that did not refuse anything), so every rejection here is the verifier's own;
the worker side runs ``ledger worker`` processes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from conftest import TEST_PREFIX
from drive import eventually, record_candidate
from ledger.config import load_config, parse_config
from ledger.drills.paths import scripted_attempt
from ledger.git import repository
from ledger.git.protection import Protection, default_patterns
from ledger.roles.sensors import check
from ledger.roles.verifier import Verifier
from ledger.verifiers import Baseline
from ledger.verifiers.pytest_report import Report, held_to

pytestmark = pytest.mark.anyio

PY = sys.executable
CLASS = "fix"
GIT_ENV = {**{k: v for k, v in os.environ.items() if not k.startswith("GIT_")},
           **repository.LEDGER.env("AUTHOR"), **repository.LEDGER.env("COMMITTER")}
PYTEST = [PY, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
# This environment's pytest plugins (hypothesis, schemathesis ...) cost seconds
# per run; the repository under test needs none of them.
QUICK = ["PYTEST_DISABLE_PLUGIN_AUTOLOAD=1"]

CALC = textwrap.dedent("""\
    CASES = [(2, 3, 6), (4, 5, 20)]


    def add(a, b):
        return a - b


    def mul(a, b):
        return a * b
""")
TESTS = textwrap.dedent("""\
    import pytest

    from calc import CASES, add, mul


    def test_add():
        assert add(2, 3) == 5


    @pytest.mark.parametrize(("a", "b", "want"), CASES)
    def test_mul(a, b, want):
        assert mul(a, b) == want
""")
FIXED = CALC.replace("return a - b", "return a + b")
FAILING = "tests/test_calc.py::test_add"


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], env=GIT_ENV, check=True,
                          capture_output=True, text=True).stdout.strip()


def make_repo(path: Path) -> tuple[Path, str]:
    """``main``: ``add`` subtracts, so ``test_add`` fails; ``test_mul`` passes twice."""
    (path / "tests").mkdir(parents=True)
    git(path, "init", "-q", "-b", "main")
    (path / "calc.py").write_text(CALC)
    (path / "tests" / "test_calc.py").write_text(TESTS)
    (path / "pyproject.toml").write_text('[project]\nname = "calc"\nversion = "1.0"\n')
    git(path, "add", "-A")
    git(path, "commit", "-q", "-m", "calc")
    return path, git(path, "rev-parse", "HEAD")


def candidate(repo: Path, base: str, files: dict[str, str | None]) -> str:
    """A commit on ``base`` writing (or, for ``None``, deleting) ``files``."""
    tree = repo.parent / f"candidate-{len(list(repo.parent.glob('candidate-*')))}"
    git(repo, "worktree", "add", "-q", "--detach", str(tree), base)
    for path, text in files.items():
        if text is None:
            (tree / path).unlink()
        else:
            (tree / path).parent.mkdir(parents=True, exist_ok=True)
            (tree / path).write_text(text)
    git(tree, "add", "-A")
    git(tree, "commit", "-q", "-m", "candidate")
    sha = git(tree, "rev-parse", "HEAD")
    git(repo, "worktree", "remove", "--force", str(tree))
    return sha


class Bench:
    """A registered class, a repository, and campaigns: opened by a red
    observation of a real pytest sensor run (with the tests that failed: the
    baseline), or plainly (without one)."""

    def __init__(self, actors: Any, repo: Path, base: str, data_dir: Path):
        self.actors, self.repo, self.base, self.data_dir = actors, repo, base, data_dir
        self.keys = 0

    async def register(self, **acceptance: Any) -> None:
        """The class as ``ledger classes sync`` registers it (written out by hand,
        so that what is judged is the kernel's record, whatever the config code)."""
        await (await self.actors("operator")).register_class(
            CLASS, max_attempts=5, lease_seconds=30, backoff_base_s=0, backoff_jitter=0,
            verifier="pytest",
            acceptance={"commands": [PYTEST], "timeout_s": 120, "environment": QUICK, **acceptance})

    async def open(self, *, baseline: bool = True) -> int:
        """Open a campaign; with ``baseline``, the way a pytest sensor does."""
        self.keys += 1
        sensor = await self.actors("sensor")
        if not baseline:
            return (await sensor.open_campaign(CLASS, f"tests-{self.keys}", "repo#main")).campaign_id
        sensor_cfg = parse_config({"sensors": {"tests": {
            "target": "repo#main", "every_s": 60, "command": PYTEST,
            "class": CLASS, "environment": QUICK}}}).sensors["tests"]
        # the sensor's check runs in an export of main of the repository, in a cell
        reading = await check(sensor_cfg, repository=str(self.repo), ref="main")
        assert reading.status == "red" and reading.details["tests"]["failed"] == [FAILING]
        opened = await sensor.record_observation(
            "tests", f"tests-{self.keys}", "repo#main", "red", reading.started_at,
            finished_at=reading.finished_at, details=reading.details, class_=CLASS)
        assert opened.effect == "opened" and opened.campaign_id is not None
        return opened.campaign_id

    async def record(self, campaign_id: int, sha: str, *, acceptance: dict[str, Any] | None = None,
                     verifier: str = "pytest") -> None:
        """What a worker that refuses nothing would record."""
        kernel = await self.actors("worker")
        claim = await kernel.claim_campaign("worker-A", [CLASS])
        assert claim is not None and claim.campaign_id == campaign_id
        await record_candidate(kernel, claim, repo=self.repo, base=self.base, sha_=sha,
                               acceptance=acceptance or claim.acceptance_criteria, verifier=verifier,
                               worker="worker-A")

    async def verdict(self, campaign_id: int) -> tuple[str, str | None, dict[str, Any]]:
        verifier = Verifier(await self.actors("verifier"), identity="verifier-B", data_dir=self.data_dir)
        assert await verifier.run_once() == 1
        [v] = (await (await self.actors.reads("reader")).campaign_detail(campaign_id)).verifications
        return v.status, v.reason, v.evidence


@pytest.fixture
async def bench(actors: Any, tmp_path: Path) -> Bench:
    repo, base = make_repo(tmp_path / "repo")
    b = Bench(actors, repo, base, tmp_path / "data")
    await b.register()
    return b


SKIP_THE_TEST = TESTS.replace("def test_add():", "@pytest.mark.skip('later')\ndef test_add():")
XFAIL_THE_TEST = TESTS.replace("def test_add():", "@pytest.mark.xfail(reason='known')\ndef test_add():")


PROTECTED_EDITS = [
    ("skip decorator on the failing test", {"tests/test_calc.py": SKIP_THE_TEST}, "tests/test_calc.py"),
    ("xfail marker on the failing test", {"tests/test_calc.py": XFAIL_THE_TEST}, "tests/test_calc.py"),
    ("the test file deleted", {"tests/test_calc.py": None}, "tests/test_calc.py"),
    ("deselected in a new pytest.ini",
     {"pytest.ini": f"[pytest]\naddopts = --deselect {FAILING}\n"}, "pytest.ini"),
    ("skipped by a new conftest.py",
     {"conftest.py": "import pytest\n\ndef pytest_collection_modifyitems(items):\n"
                     "    for item in items:\n        item.add_marker(pytest.mark.skip('no'))\n"},
     "conftest.py"),
    ("deselected in pyproject's pytest section",
     {"pyproject.toml": '[project]\nname = "calc"\nversion = "1.0"\n\n[tool.pytest.ini_options]\n'
                        f'addopts = "--deselect {FAILING}"\n'}, "pyproject.toml [tool.pytest]"),
]


@pytest.mark.rollback  # only SQL: a transaction rolled back after the test
@pytest.mark.parametrize(("name", "files", "named"), PROTECTED_EDITS, ids=[e[0] for e in PROTECTED_EDITS])
@pytest.mark.cells
async def test_a_candidate_changing_protected_paths_is_rejected_by_the_verifier_itself(
        bench: Bench, name: str, files: dict[str, str | None], named: str) -> None:
    """The finding's reproduction: before, the verifier ran the candidate's own
    (skipped, deleted, deselected) tests and accepted."""
    cid = await bench.open(baseline=False)
    await bench.record(cid, candidate(bench.repo, bench.base, files))
    status, reason, evidence = await bench.verdict(cid)
    assert status == "rejected", f"{name}: {reason}"
    assert reason is not None and "changes protected paths" in reason and named in reason, reason
    assert evidence.get("protected_restored"), evidence
    campaign = await (await bench.actors.reads("reader")).campaign(cid)
    assert campaign.state == "ready" and campaign.promoted_at is None


GAMED_CODE = [
    ("skipped from the code under test",
     FIXED.replace("return a + b", "import pytest\n    pytest.skip('later')"), f"{FAILING} (skipped)"),
    ("xfailed from the code under test",
     FIXED.replace("return a + b", "import pytest\n    pytest.xfail('known')"), f"{FAILING} (skipped)"),
    ("a fixed add, but fewer parametrised cases",
     FIXED.replace("CASES = [(2, 3, 6), (4, 5, 20)]", "CASES = [(2, 3, 6)]"),
     "2 test(s) collected, 3 at opening"),
    ("a fixed add, but mul skipped",
     FIXED.replace("    return a * b", "    import pytest\n    pytest.skip('slow')"),
     "2 test(s) skipped or xfailed, 0 at opening"),
]


@pytest.mark.rollback  # only SQL: a transaction rolled back after the test
@pytest.mark.parametrize(("name", "code", "says"), GAMED_CODE, ids=[c[0] for c in GAMED_CODE])
@pytest.mark.cells
async def test_a_candidate_that_passes_without_fixing_is_rejected_naming_the_tests(
        bench: Bench, name: str, code: str, says: str) -> None:
    cid = await bench.open()
    await bench.record(cid, candidate(bench.repo, bench.base, {"calc.py": code}))
    status, reason, evidence = await bench.verdict(cid)
    assert status == "rejected", f"{name}: accepted: {evidence}"
    assert reason is not None and says in reason, reason
    assert evidence["baseline"]["failed"] == [FAILING]


@pytest.mark.rollback  # only SQL: a transaction rolled back after the test
@pytest.mark.cells
async def test_an_honest_fix_is_accepted_and_its_summary_kept(bench: Bench) -> None:
    cid = await bench.open()
    # A change to pyproject outside its pytest section is the agent's to make.
    await bench.record(cid, candidate(bench.repo, bench.base, {
        "calc.py": FIXED, "pyproject.toml": '[project]\nname = "calc"\nversion = "1.1"\n'}))
    status, reason, evidence = await bench.verdict(cid)
    assert status == "accepted", reason
    assert evidence["protected_restored"] == []
    assert "the 1 test(s) that failed at opening pass" in evidence["summary"]


@pytest.mark.rollback  # only SQL: a transaction rolled back after the test
@pytest.mark.cells
async def test_the_bundle_cannot_weaken_the_acceptance(bench: Bench) -> None:
    """The worker writes the bundle; the verifier runs the campaign's criteria."""
    cid = await bench.open()
    await bench.record(cid, candidate(bench.repo, bench.base, {"calc.py": CALC + "\n"}),
                       acceptance={"commands": [[PY, "-c", "pass"]], "timeout_s": 10},
                       verifier="command")
    status, reason, evidence = await bench.verdict(cid)
    assert status == "rejected", evidence
    assert reason is not None and FAILING in reason
    assert evidence["implementation"] == "pytest"


@pytest.mark.rollback  # only SQL: a transaction rolled back after the test
@pytest.mark.cells
async def test_a_class_may_allow_protected_changes(bench: Bench) -> None:
    await bench.register(allow_protected_changes=True)
    cid = await bench.open()
    await bench.record(cid, candidate(bench.repo, bench.base, {
        "calc.py": FIXED, "tests/test_calc.py": TESTS + "\n\ndef test_add_more():\n    assert True\n"}))
    status, reason, evidence = await bench.verdict(cid)
    assert status == "accepted", reason
    assert "protected_restored" not in evidence


# --- the worker refuses first -------------------------------------------------------------


async def attempts_by_a_worker(actors: Any, admin: Any, db_url: str, tmp_path: Path,
                               plan: dict[str, Any], n: int, toml: str = "") -> tuple[int, Path]:
    """Run a ``ledger worker`` process on a fresh campaign until ``n`` attempts
    ended; returns the campaign and the repository."""
    repo, _ = make_repo(tmp_path / "repo")
    markers = tmp_path / "markers"  # the plan and markers: the one host directory the cell may write
    markers.mkdir()
    plan_file = markers / "plan.json"
    plan_file.write_text(json.dumps(plan))
    config = tmp_path / "ledger.toml"
    config.write_text(f"""
[classes.{CLASS}]
repository = "{repo}"
attempt_command = ["{PY}", "{scripted_attempt()}", "{plan_file}"]
max_attempts = 3
lease_s = 10
heartbeat_s = 1
backoff = {{ base_s = 0, jitter = 0 }}
verifier = "pytest"
acceptance = {{ commands = [{json.dumps(PYTEST)}], timeout_s = 60, environment = {json.dumps(QUICK)} }}
cell = {{ writable = ["{markers}"] }}
{toml}""")
    await (await actors("operator")).register_class(CLASS, **load_config(config).classes[CLASS].registration())
    cid = (await (await actors("sensor")).open_campaign(CLASS, "tests-pass", "repo#main")).campaign_id
    env = {**os.environ, "LEDGER_DATABASE_URL": db_url, "LEDGER_ROLE_PREFIX": TEST_PREFIX,
           "LEDGER_DATA_DIR": str(tmp_path / "data"), "LEDGER_CONFIG": str(config)}
    worker = subprocess.Popen([sys.executable, "-m", "ledger", "worker", "--poll", "0.2"], env=env,
                              stdout=subprocess.DEVNULL, stderr=open(tmp_path / "worker.log", "wb"))
    try:
        await eventually(lambda: admin.execute(
            "SELECT count(*) AS n FROM ledger.attempt WHERE campaign_id = %s AND outcome <> 'running'",
            (cid,)).fetchone()["n"] == n, timeout=60, what=f"{n} attempt(s) ended")
    finally:
        worker.kill()
        worker.wait()
    return cid, repo


@pytest.mark.cells
async def test_the_worker_refuses_a_candidate_that_edits_a_test_and_the_next_attempt_is_told(
        actors: Any, admin: Any, db_url: str, tmp_path: Path) -> None:
    cid, _ = await attempts_by_a_worker(actors, admin, db_url, tmp_path, {
        "1": [["write", "tests/test_calc.py", SKIP_THE_TEST], ["exit", 0]],
        "2": [["context", "seen"], ["write", "calc.py", FIXED], ["exit", 0]]}, 2)
    first, second = admin.execute("SELECT outcome, failure_reason, fingerprint FROM ledger.attempt "
                                  "WHERE campaign_id = %s ORDER BY attempt_no", (cid,)).fetchall()
    assert first["outcome"] == "failed", (tmp_path / "worker.log").read_text()
    assert "protected paths" in first["failure_reason"] and "tests/test_calc.py" in first["failure_reason"]
    assert second["outcome"] == "attempted"
    [event] = admin.execute("SELECT actor_role, action, target, reason, details FROM ledger.security_event "
                            "WHERE campaign_id = %s", (cid,)).fetchall()
    assert (event["actor_role"], event["action"], event["target"]) == (
        "worker", "candidate.protected_paths", "tests/test_calc.py")
    assert event["reason"] == first["failure_reason"]
    assert event["details"]["fingerprint"] == first["fingerprint"]
    journal = [r["type"] for r in admin.execute(
        "SELECT type FROM ledger.campaign_event WHERE campaign_id = %s ORDER BY seq", (cid,)).fetchall()]
    assert "security.refused" in journal
    seen = json.loads(next((tmp_path / "markers").glob("seen-*-2.json")).read_text())
    assert "tests/" in seen["protected"] and seen["allow_protected_changes"] is False
    assert seen["refused_fingerprints"] == [first["fingerprint"]]
    assert seen["previous_attempts"][0]["failure_reason"] == first["failure_reason"]


@pytest.mark.cells
async def test_the_attempts_message_and_the_class_author_make_the_candidate_commit(
        actors: Any, admin: Any, db_url: str, tmp_path: Path) -> None:
    cid, repo = await attempts_by_a_worker(actors, admin, db_url, tmp_path, {
        "1": [["write", "calc.py", FIXED],
              ["message", "Fix add: it subtracted\n\nLedger-Attempt: 99\n"], ["exit", 0]]}, 1,
        toml='author = "Fixer Agent <agent@example.org>"\n')
    [row] = admin.execute("SELECT candidate_sha FROM ledger.attempt WHERE campaign_id = %s", (cid,)).fetchall()
    assert git(repo, "log", "-1", "--format=%B", row["candidate_sha"]) == (
        f"Fix add: it subtracted\n\nLedger-Campaign: {cid}\nLedger-Attempt: 1")
    assert git(repo, "log", "-1", "--format=%an <%ae>", row["candidate_sha"]) == "Fixer Agent <agent@example.org>"


@pytest.mark.rollback  # only SQL: a transaction rolled back after the test
async def test_refusing_is_fenced_and_checked(actors: Any, admin: Any, test_class: str) -> None:
    from ledger.errors import InvalidInput, StaleLease

    sensor, worker = await actors("sensor"), await actors("worker")
    cid = (await sensor.open_campaign(test_class, "k", "t")).campaign_id
    claim = await worker.claim_campaign("w", [test_class])
    assert claim is not None
    bads: list[dict[str, Any]] = [{"fingerprint": "x"}, {"paths": []}]
    for bad in bads:
        args = {"fingerprint": "sha256:0123456789", "paths": ["tests/x.py"], **bad}
        with pytest.raises(InvalidInput):
            await worker.refuse_candidate(cid, claim.generation, "r", **args)
    with pytest.raises(StaleLease):
        await worker.refuse_candidate(cid, claim.generation + 1, "r", fingerprint="sha256:0123456789",
                                      paths=["tests/x.py"])
    assert admin.execute("SELECT count(*) AS n FROM ledger.security_event").fetchone()["n"] == 0
    state = await worker.refuse_candidate(cid, claim.generation, "refused: tests/x.py",
                                          fingerprint="sha256:0123456789", paths=["tests/x.py"])
    assert state == "ready"
    assert admin.execute("SELECT count(*) AS n FROM ledger.security_event").fetchone()["n"] == 1


# --- the parts, without a database ----------------------------------------------------------


def test_default_protection_follows_the_acceptance_command(tmp_path: Path) -> None:
    patterns = default_patterns([["./ci/run_tests.sh", "--fast"],
                                 [PY, "-m", "pytest", "-c", "ci/pytest.ini", "src/pkg", "-k", "a.b"],
                                 ["tox", "-e", "py311"], ["make", "test"]])
    p = Protection(patterns)
    for protected in ("tests/unit/test_x.py", "pkg/tests/helpers.py", "conftest.py", "src/conftest.py",
                      "test_thing.py", "thing_test.py", "pytest.ini", ".github/workflows/ci.yml",
                      "ci/run_tests.sh", "ci/pytest.ini", "tox.ini", "Makefile", "noxfile.py"):
        assert p.covers(protected), protected
    for free in ("calc.py", "src/pkg/core.py", "README.md", "pyproject.toml", "setup.cfg",
                 "docs/testing.md", "a.b"):
        assert not p.covers(free), free


def test_sections_of_config_files_are_protected_not_the_whole_file(tmp_path: Path) -> None:
    repo, base = make_repo(tmp_path / "repo")
    p = Protection(default_patterns([PYTEST]))
    version = candidate(repo, base, {"pyproject.toml": '[project]\nname = "calc"\nversion = "2"\n'})
    assert p.changes(repo, base, version) == []
    pytest_section = candidate(repo, base, {"pyproject.toml": '[project]\nname = "calc"\nversion = "1.0"\n'
                                                              '[tool.pytest.ini_options]\naddopts = "-x"\n'})
    assert [str(c) for c in p.changes(repo, base, pytest_section)] == ["pyproject.toml [tool.pytest]"]
    cfg = candidate(repo, base, {"setup.cfg": "[metadata]\nname = calc\n"})
    assert p.changes(repo, base, cfg) == []
    cfg_pytest = candidate(repo, base, {"setup.cfg": "[tool:pytest]\naddopts = -p no:x\n"})
    assert [str(c) for c in p.changes(repo, base, cfg_pytest)] == ["setup.cfg [tool:pytest]"]


@pytest.mark.rollback  # only SQL: a transaction rolled back after the test
def test_held_to_the_opening_observation() -> None:
    base = Baseline(failed=("t.py::a", "t.py"), collected=4, skipped=1)
    good = Report(tests=4, failed=[], skipped=1,
                  outcomes={"t.py::a": "passed", "t.py::b": "passed", "u.py::c": "passed",
                            "u.py::d": "skipped"})
    assert held_to(base, [good]) == []
    bad = Report(tests=3, failed=[], skipped=2,
                 outcomes={"t.py::b": "skipped", "u.py::c": "passed", "u.py::d": "skipped"})
    problems = held_to(base, [bad])
    assert problems == ["2 test(s) that failed at opening do not pass now: t.py::a (not run), "
                        "t.py (skipped)",
                        "3 test(s) collected, 4 at opening", "2 test(s) skipped or xfailed, 1 at opening"]
    assert Baseline.from_tests({"failed": ["x"], "collected": True}) == Baseline(("x",), None, None)
    assert Baseline.from_tests({"collected": 3}) is None
