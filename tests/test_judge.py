"""A judge the candidate cannot reach (README "What a candidate is judged by"). A library-style repository
(a ``calc`` package, its ``pyproject.toml``, ``tests/``), real pytest, real
plugins and real entry points, real cells, real PostgreSQL.

Each finding is reproduced by a candidate that was verified (and confirmed)
on the previous main; here it is rejected (or not confirmed), saying why, and
the honest fix still passes. The layers are tested one at a time: the fixed
judge with protection and the screen out of the way (``protected = []``,
``screen.rules = []``), then the screen, the held-out tests, the default
protection, the confirmation and the quorum.
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
from ledger.git.protection import default_patterns
from ledger.roles.sensors import check
from ledger.roles.verifier import Verifier

pytestmark = pytest.mark.anyio

PY = sys.executable
CLASS = "lib"
GIT_ENV = {**{k: v for k, v in os.environ.items() if not k.startswith("GIT_")},
           **repository.LEDGER.env("AUTHOR"), **repository.LEDGER.env("COMMITTER")}
PYTEST = [PY, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
QUICK = ["PYTEST_DISABLE_PLUGIN_AUTOLOAD=1"]

PYPROJECT = textwrap.dedent("""\
    [build-system]
    requires = ["hatchling"]
    build-backend = "hatchling.build"

    [project]
    name = "calc"
    version = "1.0"

    [tool.pytest.ini_options]
    testpaths = ["tests"]
    """)
INIT = "from .ops import CASES, add, mul\n"
OPS = textwrap.dedent("""\
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
FAILING = "tests/test_calc.py::test_add"
FIXED = OPS.replace("return a - b", "return a + b")
HELD_OUT = "from calc import add\n\n\ndef test_add_other_inputs():\n    assert add(10, 5) == 15\n"

# A plugin that turns every failure into a pass.
FORGERY = textwrap.dedent("""\
    import pytest


    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(item, call):
        report = yield
        if report.failed:
            report.outcome, report.longrepr = "passed", None
        return report
    """)
DIST_INFO = {"forgery-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: forgery\nVersion: 1.0\n",
             "forgery-1.0.dist-info/entry_points.txt": "[pytest11]\nforgery = forgery\n",
             "forgery-1.0.dist-info/RECORD": ""}
# Library code that patches pytest's reports once pytest is there.
PATCHES_REPORTS = INIT + textwrap.dedent("""\
    import sys

    if "_pytest" in sys.modules:
        import _pytest.reports as _reports

        _made = _reports.TestReport.from_item_and_call.__func__

        def _forged(cls, item, call):
            report = _made(cls, item, call)
            if report.failed:
                report.outcome, report.longrepr = "passed", None
            return report

        _reports.TestReport.from_item_and_call = classmethod(_forged)
    """)
# Library code that finds pytest's configuration and registers a forger.
REGISTERS_A_PLUGIN = INIT + textwrap.dedent("""\
    import gc
    import sys

    if "_pytest" in sys.modules:
        import pytest

        class _Forger:
            @pytest.hookimpl(wrapper=True, tryfirst=True)
            def pytest_runtest_makereport(self, item, call):
                report = yield
                if report.failed:
                    report.outcome, report.longrepr = "passed", None
                return report

        for _obj in gc.get_objects():
            if type(_obj).__name__ == "Config" and type(_obj).__module__ == "_pytest.config":
                _obj.pluginmanager.register(_Forger(), "calc-forger")
    """)
# Library code that writes a JUnit report of passes and ends the process.
JUNIT = ('<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" tests="3">'
         '<testcase classname="tests.test_calc" name="test_add" file="tests/test_calc.py"/>'
         '<testcase classname="tests.test_calc" name="test_mul[2-3-6]" file="tests/test_calc.py"/>'
         '<testcase classname="tests.test_calc" name="test_mul[4-5-20]" file="tests/test_calc.py"/>'
         '</testsuite></testsuites>')
FORGES_THE_REPORT = INIT + textwrap.dedent(f"""\
    import os
    import sys

    if "_pytest" in sys.modules:
        for _arg in sys.argv:
            if _arg.startswith("--junitxml="):
                with open(_arg.split("=", 1)[1], "w") as _f:
                    _f.write({JUNIT!r})
        os._exit(0)
    """)
DETECTS_THE_TEST = OPS.replace("def add(a, b):\n    return a - b", textwrap.dedent("""\
    import sys


    def add(a, b):
        if "_pytest" in sys.modules:
            return a + b
        return a - b""").strip())
SPECIAL_CASED = OPS.replace("    return a - b", "    if (a, b) == (2, 3):\n        return 5\n    return a - b")
SKIPS_FROM_THE_LIBRARY = OPS.replace("    return a - b", "    import pytest\n    pytest.skip('later')")
EXITS_AT_IMPORT = INIT + "import os\nimport sys\n\nif 'pytest' in sys.modules:\n    os._exit(0)\n"


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], env=GIT_ENV, check=True,
                          capture_output=True, text=True).stdout.strip()


def make_repo(path: Path) -> tuple[Path, str]:
    """``main``: ``add`` subtracts, so ``test_add`` fails; ``test_mul`` passes twice."""
    for name, text in {"pyproject.toml": PYPROJECT, "calc/__init__.py": INIT, "calc/ops.py": OPS,
                       "tests/test_calc.py": TESTS}.items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_text(text)
    git(path, "init", "-q", "-b", "main")
    git(path, "add", "-A")
    git(path, "commit", "-q", "-m", "calc")
    return path, git(path, "rev-parse", "HEAD")


def candidate(repo: Path, base: str, files: dict[str, str], *, branch: str | None = None) -> str:
    """A commit on ``base`` writing ``files`` (and, with ``branch``, a branch at it)."""
    tree = repo.parent / f"candidate-{len(list(repo.parent.glob('candidate-*')))}"
    git(repo, "worktree", "add", "-q", "--detach", str(tree), base)
    for path, text in files.items():
        (tree / path).parent.mkdir(parents=True, exist_ok=True)
        (tree / path).write_text(text)
    git(tree, "add", "-A")
    git(tree, "commit", "-q", "-m", "candidate")
    sha = git(tree, "rev-parse", "HEAD")
    git(repo, "worktree", "remove", "--force", str(tree))
    if branch:
        git(repo, "branch", "-f", branch, sha)
    return sha


def sensor_config(ref: str = "main") -> Any:
    return parse_config({"sensors": {"tests": {
        "target": f"repo#{ref}", "every_s": 60, "command": PYTEST, "class": CLASS,
        "environment": QUICK}}}).sensors["tests"]


class Bench:
    """A registered class on the library, campaigns opened by a real pytest
    sensor run (the baseline), candidates recorded as a worker that refuses
    nothing would, verdicts by a real verifier."""

    def __init__(self, actors: Any, repo: Path, base: str, data_dir: Path):
        self.actors, self.repo, self.base, self.data_dir = actors, repo, base, data_dir
        self.keys = 0

    async def register(self, *, verifiers: list[str] | None = None, promote: bool = False,
                       approval: dict[str, Any] | None = None, **acceptance: Any) -> None:
        spec = {"commands": [PYTEST], "timeout_s": 120, "environment": QUICK, **acceptance}
        quorum = verifiers or ["pytest"]
        promotion = {"ref": "refs/heads/main", "repository": str(self.repo)} if promote else {}
        authority = {"dispatcher": {"refs": ["refs/heads/main"], "hosts": []}} if promote else {}
        await (await self.actors("operator")).register_class(
            CLASS, max_attempts=5, lease_seconds=30, backoff_base_s=0, backoff_jitter=0,
            verifier=quorum[0], acceptance=spec, promotion=promotion, authority=authority,
            **({"verifiers": quorum} if verifiers else {}), **({"approval": approval} if approval else {}))

    async def open(self) -> int:
        self.keys += 1
        reading = await check(sensor_config(), repository=str(self.repo), ref="main")
        assert reading.status == "red" and reading.details["tests"]["failed"] == [FAILING], reading.details
        opened = await (await self.actors("sensor")).record_observation(
            "tests", f"tests-{self.keys}", "repo#main", "red", reading.started_at,
            finished_at=reading.finished_at, details=reading.details, class_=CLASS)
        assert opened.effect == "opened" and opened.campaign_id is not None
        return opened.campaign_id

    async def record(self, campaign_id: int, sha: str) -> None:
        kernel = await self.actors("worker")
        claim = await kernel.claim_campaign("worker-A", [CLASS])
        assert claim is not None and claim.campaign_id == campaign_id
        await record_candidate(kernel, claim, repo=self.repo, base=self.base, sha_=sha,
                               acceptance=claim.acceptance_criteria, verifier="pytest", worker="worker-A")

    async def verdicts(self, campaign_id: int, *, identity: str = "verifier-B",
                       kinds: list[str] | None = None) -> list[Any]:
        verifier = Verifier(await self.actors("verifier"), identity=identity, data_dir=self.data_dir,
                            **({"kinds": kinds} if kinds else {}))  # type: ignore[arg-type]
        await verifier.drain()
        return (await (await self.actors.reads("reader")).campaign_detail(campaign_id)).verifications

    async def verdict(self, campaign_id: int) -> tuple[str, str | None, dict[str, Any]]:
        [v] = await self.verdicts(campaign_id)
        return v.status, v.reason, v.evidence


@pytest.fixture
async def bench(actors: Any, tmp_path: Path) -> Bench:
    repo, base = make_repo(tmp_path / "repo")
    return Bench(actors, repo, base, tmp_path / "data")


# Only the judge: no protected paths, no screen (each layer is tested alone).
JUDGE_ONLY: dict[str, Any] = {"protected": [], "screen": {"rules": []}}

TRICKS = [
    ("a plugin named by a new pytest.toml's addopts, at the root",
     {"pytest.toml": '[pytest]\naddopts = ["-p", "forgery"]\n', "forgery.py": FORGERY}, QUICK,
     f"1 test(s) failed: {FAILING}"),
    ("a plugin declared by a *.dist-info pytest11 entry point at the root",
     {"forgery.py": FORGERY, **DIST_INFO}, [], f"1 test(s) failed: {FAILING}"),
    ("library code patching pytest's reports",
     {"calc/__init__.py": PATCHES_REPORTS}, QUICK, "cannot be trusted"),
    ("library code registering a forging plugin",
     {"calc/__init__.py": REGISTERS_A_PLUGIN}, QUICK, "cannot be trusted"),
    ("library code writing a forged JUnit report, then os._exit(0)",
     {"calc/__init__.py": FORGES_THE_REPORT}, QUICK, "stops before the end of the run"),
]


@pytest.mark.rollback  # only SQL: a transaction rolled back after the test
@pytest.mark.parametrize(("name", "files", "environment", "says"), TRICKS, ids=[t[0] for t in TRICKS])
@pytest.mark.cells
async def test_candidate_code_cannot_reach_into_the_judge(
        bench: Bench, name: str, files: dict[str, str], environment: list[str], says: str) -> None:
    """Findings 1 and 2: each was accepted before (the plugin loaded; the
    report rewritten; the JUnit report forged); the fixed judge rejects it."""
    await bench.register(**JUDGE_ONLY, environment=environment)
    cid = await bench.open()
    await bench.record(cid, candidate(bench.repo, bench.base, files))
    status, reason, evidence = await bench.verdict(cid)
    assert status == "rejected", f"{name}: accepted: {evidence.get('summary')}"
    assert reason is not None and says in reason, reason
    campaign = await (await bench.actors.reads("reader")).campaign(cid)
    assert campaign.state == "ready"


@pytest.mark.rollback  # only SQL: a transaction rolled back after the test
@pytest.mark.cells
async def test_the_honest_fix_passes_the_fixed_judge_with_the_base_configuration(bench: Bench) -> None:
    await bench.register(held_out={"path": str(held_out_dir(bench.repo.parent)), "into": "tests/held_out"})
    cid = await bench.open()
    await bench.record(cid, candidate(bench.repo, bench.base, {"calc/ops.py": FIXED}))
    status, reason, evidence = await bench.verdict(cid)
    assert status == "accepted", reason
    assert evidence["judge"]["config"] == "pyproject.toml of the base"
    (run, held) = evidence["commands"]
    assert run["argv"][:2] == [PY, "-I"] and "-c" in run["argv"]
    # the held-out tests run on their own, not with (nor counted as) the others:
    # they are not in the checkout while the candidate's own tests run
    assert "3 passed" in run["output"] and "1 passed" in held["output"]
    assert not any("held_out" in a for a in run["argv"])
    assert evidence["held_out"] == {"into": "tests/held_out", "passed": 1}
    assert evidence["screen"] == [] and "the 1 test(s) that failed at opening pass" in evidence["summary"]


def held_out_dir(where: Path) -> Path:
    directory = where / "held-out"
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "test_more.py").write_text(HELD_OUT)
    return directory


SCREENED = [
    ("test-detecting code", {"calc/ops.py": DETECTS_THE_TEST}, "calc/ops.py:8", "test-detection"),
    ("a forged report and os._exit", {"calc/__init__.py": FORGES_THE_REPORT}, "calc/__init__.py:10",
     "hard-exit"),
    ("a root-level plugin and its dist-info", {"forgery.py": FORGERY, **DIST_INFO},
     "forgery-1.0.dist-info/entry_points.txt", "plugin-manifest"),
    ("a .pth file", {"calc.pth": "import calc\n"}, "calc.pth", "path-files"),
]


@pytest.mark.rollback  # only SQL: a transaction rolled back after the test
@pytest.mark.parametrize(("name", "files", "where", "rule"), SCREENED, ids=[s[0] for s in SCREENED])
@pytest.mark.cells
async def test_the_screen_refuses_reaching_for_the_test_machinery_naming_file_and_line(
        bench: Bench, name: str, files: dict[str, str], where: str, rule: str) -> None:
    """The screen (and the rest before anything runs): the test-detecting fix
    passes every test -- the judge cannot tell -- but the screen names the
    line; no acceptance command ran."""
    await bench.register(protected=[])
    cid = await bench.open()
    await bench.record(cid, candidate(bench.repo, bench.base, files))
    status, reason, evidence = await bench.verdict(cid)
    assert status == "rejected", f"{name}: accepted"
    assert reason is not None and reason.startswith("the candidate reaches for the test machinery")
    assert where in reason and f"({rule})" in reason, reason
    assert any(f["rule"] == rule for f in evidence["screen"])
    assert "commands" not in evidence  # refused before running anything


@pytest.mark.rollback  # only SQL: a transaction rolled back after the test
@pytest.mark.cells
async def test_a_class_configures_its_screen(bench: Bench) -> None:
    """The rules are the class's: with test-detection (and internals) off, the
    same candidate is judged -- and passes, which is why the rule is on by default."""
    await bench.register(screen={"rules": ["hard-exit"], "extra": [
        {"name": "no-print", "pattern": r"\bprint\(", "why": "prints"}]})
    cid = await bench.open()
    await bench.record(cid, candidate(bench.repo, bench.base, {"calc/ops.py": DETECTS_THE_TEST}))
    status, reason, _ = await bench.verdict(cid)
    assert status == "accepted", reason
    cid = await bench.open()
    await bench.record(cid, candidate(bench.repo, bench.base, {"calc/ops.py": FIXED + "\nprint('x')\n"}))
    status, reason, _ = await bench.verdict(cid)
    assert status == "rejected" and reason is not None and "calc/ops.py:11 prints (no-print)" in reason


@pytest.mark.rollback  # only SQL: a transaction rolled back after the test
@pytest.mark.cells
async def test_special_cased_inputs_fail_the_held_out_tests(bench: Bench, tmp_path: Path) -> None:
    """Held-out tests: no check of the candidate's own tests can see it; tests it
    never saw do."""
    await bench.register(held_out={"path": str(held_out_dir(tmp_path)), "into": "tests/held_out"})
    cid = await bench.open()
    await bench.record(cid, candidate(bench.repo, bench.base, {"calc/ops.py": SPECIAL_CASED}))
    status, reason, evidence = await bench.verdict(cid)
    assert status == "rejected", evidence.get("summary")
    # the reason (which the next attempt is told) names nothing; the evidence, for operators, all
    assert reason == "1 held-out check(s) failed"
    assert evidence["held_out"]["failed"] == ["tests/held_out/test_more.py::test_add_other_inputs"]


@pytest.mark.rollback  # only SQL: a transaction rolled back after the test
@pytest.mark.cells
async def test_held_out_tests_from_a_second_repository_replace_what_the_candidate_put_there(
        bench: Bench, tmp_path: Path) -> None:
    other = tmp_path / "held-out.git"
    other.mkdir()
    git(other, "init", "-q", "-b", "main")
    (other / "acceptance").mkdir()
    (other / "acceptance" / "test_more.py").write_text(HELD_OUT)
    git(other, "add", "-A")
    git(other, "commit", "-q", "-m", "held out")
    await bench.register(held_out={"repository": str(other), "ref": "main", "subdir": "acceptance",
                                   "into": "tests/held_out"})
    cid = await bench.open()
    # the candidate tries to supply the held-out directory itself
    await bench.record(cid, candidate(bench.repo, bench.base, {
        "calc/ops.py": SPECIAL_CASED, "tests/held_out/test_more.py": "def test_add_other_inputs():\n    pass\n"}))
    status, reason, _ = await bench.verdict(cid)
    # protected (tests/), and judged with the verifier's copy in its place
    assert status == "rejected" and reason == (
        "the candidate changes protected paths: tests/held_out/test_more.py (with them restored from "
        "the base, the acceptance failed: 1 held-out check(s) failed)")


@pytest.mark.cells
async def test_held_out_tests_are_never_shown_to_the_attempt(
        actors: Any, admin: Any, db_url: str, tmp_path: Path) -> None:
    """not in the campaign file, the environment or the cell -- not
    even where they are -- and a rejection by them reaches the next attempt
    as a count: every byte the next attempt can see is searched for their
    paths, file and test names and content."""
    repo, _ = make_repo(tmp_path / "repo")
    secret = tmp_path / "verifier-only" / "held-out-q7"
    secret.mkdir(parents=True)
    (secret / "test_more_q7.py").write_text(
        "from calc import add\n\n\ndef test_add_other_inputs_q7():\n    assert add(1000, 7) == 1007\n")
    into = "checks/zz_hidden_q7"
    needles = [str(secret), "held-out-q7", into, "zz_hidden_q7", "test_more_q7", "test_add_other_inputs_q7",
               "add(1000, 7)"]
    markers = tmp_path / "markers"
    markers.mkdir()
    plan = markers / "plan.json"
    skip = sorted({str(markers), sys.prefix, sys.base_prefix, "/usr"})
    plan.write_text(json.dumps({
        "1": [["write", "calc/ops.py", SPECIAL_CASED], ["exit", 0]],
        "2": [["context", "seen"], ["scan", "scan", needles, skip], ["write", "calc/ops.py", FIXED], ["exit", 0]]}))
    config = tmp_path / "ledger.toml"
    config.write_text(textwrap.dedent(f"""\
        [classes.{CLASS}]
        repository = "{repo}"
        attempt_command = ["{PY}", "{scripted_attempt()}", "{plan}"]
        lease_s = 10
        heartbeat_s = 1
        verifier = "pytest"
        backoff = {{ base_s = 0, jitter = 0 }}
        cell = {{ writable = ["{markers}"] }}

        [classes.{CLASS}.acceptance]
        commands = [{json.dumps(PYTEST)}]
        environment = {json.dumps(QUICK)}
        held_out = {{ path = "{secret}", into = "{into}" }}
        """))
    await (await actors("operator")).register_class(CLASS, **load_config(config).classes[CLASS].registration())
    cid = (await (await actors("sensor")).open_campaign(CLASS, "tests-pass", "repo#main")).campaign_id
    env = {**os.environ, "LEDGER_DATABASE_URL": db_url, "LEDGER_ROLE_PREFIX": TEST_PREFIX,
           "LEDGER_DATA_DIR": str(tmp_path / "data"), "LEDGER_CONFIG": str(config)}
    worker = subprocess.Popen([PY, "-m", "ledger", "worker", "--poll", "0.2"], env=env,
                              stdout=subprocess.DEVNULL, stderr=open(tmp_path / "worker.log", "wb"))

    def ended() -> int:
        return admin.execute("SELECT count(*) AS n FROM ledger.attempt WHERE campaign_id = %s "
                             "AND outcome <> 'running'", (cid,)).fetchone()["n"]
    try:
        await eventually(lambda: ended() == 1, timeout=60, what="the special-cased attempt recorded")
        verifier = Verifier(await actors("verifier"), identity="verifier-B", data_dir=tmp_path / "data")
        assert await verifier.run_once() == 1
        [v] = (await (await actors.reads("reader")).campaign_detail(cid)).verifications
        assert (v.status, v.reason) == ("rejected", "1 held-out check(s) failed")
        assert v.evidence["held_out"]["failed"] == [f"{into}/test_more_q7.py::test_add_other_inputs_q7"]
        await eventually(lambda: ended() == 2, timeout=120, what="the next attempt ended")
    finally:
        worker.kill()
        worker.wait()
    seen = next(markers.glob("seen-*-2.json")).read_text()
    told = json.loads(seen)
    assert "held_out" not in told["acceptance"] and told["acceptance"]["commands"] == [PYTEST]
    assert told["previous_attempts"][0]["failure_reason"] == "1 held-out check(s) failed"
    scan = json.loads(next(markers.glob("scan-*-2.json")).read_text())
    assert scan["files"] > 50  # it did look: the clone, /etc, /tmp, the campaign file ...
    assert scan["found"] == [], scan["found"]
    stored = admin.execute("SELECT acceptance_criteria FROM ledger.campaign WHERE id = %s", (cid,)).fetchone()
    assert stored["acceptance_criteria"]["held_out"]["path"] == str(secret)  # the verifier's to read


def test_plugin_manifests_and_pytest_tomls_are_protected_by_default() -> None:
    """Confirmation is held to the opening baseline."""
    from ledger.git.protection import Protection

    protection = Protection(default_patterns([PYTEST]))
    for path in ("pytest.toml", ".pytest.toml", "forgery-1.0.dist-info/entry_points.txt",
                 "calc.egg-info/entry_points.txt", ".gitattributes", "sitecustomize.py",
                 "src/usercustomize.py", "pytest.ini"):
        assert protection.covers(path), path
    assert not protection.covers("calc/ops.py") and not protection.covers("pyproject.toml")


@pytest.mark.rollback  # only SQL: a transaction rolled back after the test
@pytest.mark.cells
async def test_the_default_protection_refuses_a_new_pytest_toml(bench: Bench) -> None:
    await bench.register()
    cid = await bench.open()
    await bench.record(cid, candidate(bench.repo, bench.base, {
        "pytest.toml": '[pytest]\naddopts = ["-p", "no:python"]\n'}))
    status, reason, _ = await bench.verdict(cid)
    assert status == "rejected" and reason is not None and "changes protected paths: pytest.toml" in reason


# --- confirmation by the same standard --------------------------------------------------------


async def promoted(bench: Bench) -> int:
    """A campaign opened with the baseline, its honest fix accepted (the class
    does not promote: the verdict is the point after which it may confirm)."""
    await bench.register()
    cid = await bench.open()
    await bench.record(cid, candidate(bench.repo, bench.base, {"calc/ops.py": FIXED}))
    assert (await bench.verdict(cid))[0] == "accepted"
    return cid


async def observe(bench: Bench, cid: int, ref: str) -> Any:
    reading = await check(sensor_config(ref), repository=str(bench.repo), ref=ref)
    recorded = await (await bench.actors("sensor")).record_observation(
        "tests", f"tests-{bench.keys}", "repo#main", reading.status, reading.started_at,
        finished_at=reading.finished_at, details=reading.details, class_=CLASS)
    assert recorded.campaign_id == cid
    return reading, recorded


@pytest.mark.rollback  # only SQL: a transaction rolled back after the test
@pytest.mark.parametrize(("name", "files", "status", "effect"), [
    ("the failing test skipped from the library", {"calc/ops.py": SKIPS_FROM_THE_LIBRARY}, "green",
     "recorded"),
    ("os._exit(0) when imported under pytest", {"calc/__init__.py": EXITS_AT_IMPORT}, "red", "regressed"),
    ("a plugin at the root named by a pytest.toml",
     {"pytest.toml": '[pytest]\naddopts = ["-p", "forgery"]\n', "forgery.py": FORGERY}, "red", "regressed"),
], ids=["skipped", "os-exit", "plugin"])
@pytest.mark.cells
async def test_the_confirming_observation_cannot_be_fooled_the_same_ways(
        bench: Bench, name: str, files: dict[str, str], status: str, effect: str) -> None:
    """Each confirmed the campaign before (a green exit code)."""
    cid = await promoted(bench)
    candidate(bench.repo, bench.base, files, branch="gamed")
    reading, recorded = await observe(bench, cid, "gamed")
    assert (reading.status, recorded.effect) == (status, effect), (name, reading.details.get("tests"))
    campaign = await (await bench.actors.reads("reader")).campaign(cid)
    if effect == "recorded":
        assert campaign.state == "verified"
        assert recorded.reason == (f"not confirmed: 1 test(s) that failed at opening were not seen "
                                   f"passing: {FAILING}")
        [obs] = [o for o in (await (await bench.actors.reads("reader")).campaign_detail(cid)).observations
                 if o.id == recorded.observation_id]
        assert obs.reason == recorded.reason
    else:
        assert campaign.state == "ready"
    # and an observation of the honest fix, by the same judge, confirms
    if effect == "recorded":
        candidate(bench.repo, bench.base, {"calc/ops.py": FIXED}, branch="fixed")
        reading, recorded = await observe(bench, cid, "fixed")
        assert (reading.status, recorded.effect, recorded.reason) == ("green", "confirmed", None)


@pytest.mark.rollback  # only SQL: a transaction rolled back after the test
@pytest.mark.cells
async def test_a_green_observation_without_judged_tests_cannot_confirm_a_baseline(
        bench: Bench, test_class: str) -> None:
    from drive import now

    await promoted(bench)
    sensor = await bench.actors("sensor")
    for details in ({}, {"tests": {"passed_ids": [FAILING]}},  # not judged
                    {"tests": {"judged": True, "passed_ids": ["tests/test_calc.py::test_mul[2-3-6]"]}}):
        recorded = await sensor.record_observation("probe", f"tests-{bench.keys}", "repo#main", "green",
                                                   now(), details=details, class_=CLASS)
        assert recorded.effect == "recorded" and recorded.reason and "not confirmed" in recorded.reason
    # a suite too large to list its passed ids gives their digests (ledger.judge.Judged.summary)
    import hashlib
    digest = hashlib.sha256(FAILING.encode()).hexdigest()[:12]
    recorded = await sensor.record_observation("probe", f"tests-{bench.keys}", "repo#main", "green", now(),
                                               details={"tests": {"judged": True, "passed_sha256": [digest]}},
                                               class_=CLASS)
    assert (recorded.effect, recorded.reason) == ("confirmed", None)
    # without a baseline there is nothing to show: a plain green confirms as before
    other = await sensor.open_campaign(test_class, "no-baseline", "t")
    verifier = await bench.actors("verifier")
    kernel = await bench.actors("worker")
    claim = await kernel.claim_campaign("worker-A", [test_class])
    assert claim is not None
    sha = candidate(bench.repo, bench.base, {"calc/ops.py": FIXED})
    await record_candidate(kernel, claim, repo=bench.repo, base=bench.base, sha_=sha,
                           acceptance={"commands": [["true"]]}, worker="worker-A")
    v = await verifier.claim_verification("verifier-B", classes=[test_class])
    assert v is not None
    await verifier.accept(v.verification_id, {})
    recorded = await sensor.record_observation("probe", "no-baseline", "t", "green", now())
    assert recorded.campaign_id == other.campaign_id and recorded.effect == "confirmed"


# --- a second opinion ---------------------------------------------------------------------------

REVIEWER = textwrap.dedent("""\
    import json, sys
    seen = json.load(sys.stdin)
    open(sys.argv[1], "w").write(json.dumps(seen))
    if "(a, b) == (2, 3)" in seen["diff"]:
        print(json.dumps({"verdict": "reject", "reason": "special-cases the failing inputs"}))
    else:
        print(json.dumps({"verdict": "accept", "summary": "adds, as the objective asks"}))
    """)


@pytest.mark.rollback  # only SQL: a transaction rolled back after the test
@pytest.mark.cells
async def test_a_quorum_accepts_only_when_every_verifier_does(bench: Bench, tmp_path: Path) -> None:
    """The tests pass, then a reviewer of another model family is asked (the
    diff, the objective, the test verdict on stdin): acceptance needs both,
    every verdict is kept with its verifier, and the landing names them all."""
    script = tmp_path / "reviewer.py"
    script.write_text(REVIEWER)
    seen = tmp_path / "review-out"
    seen.mkdir()
    await bench.register(verifiers=["pytest", "review"], promote=True, review={
        "command": [PY, str(script), str(seen / "seen.json")], "cell": {"writable": [str(seen)]}})

    cid = await bench.open()
    await bench.record(cid, candidate(bench.repo, bench.base, {"calc/ops.py": SPECIAL_CASED}))
    # a verifier that gives only test verdicts leaves the review to another
    [tests] = await bench.verdicts(cid, identity="tests-verifier", kinds=["pytest"])
    assert (tests.kind, tests.status) == ("pytest", "accepted")  # the candidate's own tests pass
    campaign = await (await bench.actors.reads("reader")).campaign(cid)
    assert campaign.state == "attempted"  # the quorum is not complete
    _, review = await bench.verdicts(cid, identity="reviewer", kinds=["review"])
    assert (review.kind, review.status, review.verifier) == ("review", "rejected", "reviewer")
    assert review.reason == "the reviewer rejected it: special-cases the failing inputs"
    shown = json.loads((seen / "seen.json").read_text())
    assert shown["objective_key"] == f"tests-{bench.keys}" and "(a, b) == (2, 3)" in shown["diff"]
    assert [v["kind"] for v in shown["verdicts"]] == ["pytest"]
    assert (await (await bench.actors.reads("reader")).campaign(cid)).state == "ready"

    await bench.record(cid, candidate(bench.repo, bench.base, {"calc/ops.py": FIXED}))
    verdicts = await bench.verdicts(cid, identity="verifier-B")  # one verifier may give both
    assert [(v.kind, v.status) for v in verdicts[2:]] == [("pytest", "accepted"), ("review", "accepted")]
    campaign = await (await bench.actors.reads("reader")).campaign(cid)
    assert campaign.state == "verified"
    admin_effects = await (await bench.actors.reads("reader")).campaign_detail(cid)
    [effect] = admin_effects.side_effects
    landing = effect.payload["landing"]
    assert [(v["kind"], v["verifier"]) for v in landing["verdicts"]] == [
        ("pytest", "verifier-B"), ("review", "verifier-B")]
    assert landing["verdicts"][1]["summary"] == "adds, as the objective asks"
    # the landed commit's trailers name every verifier of the quorum
    from ledger.roles.dispatcher import Dispatcher

    assert await Dispatcher(await bench.actors("dispatcher")).run_once() == 1
    verdict_lines = [line for line in git(bench.repo, "log", "-1", "--format=%B", "main").splitlines()
                     if line.startswith("Ledger-Verdict:")]
    assert [line.split(":", 2)[1].strip() for line in verdict_lines] == [
        "accepted by verifier-B [pytest]", "accepted by verifier-B [review]"], verdict_lines


DOUBTING_REVIEWER = textwrap.dedent("""\
    import json
    print(json.dumps({"verdict": "needs_human", "summary": "right, but it changes how add rounds"}))
    """)


@pytest.mark.rollback  # only SQL: a transaction rolled back after the test
@pytest.mark.parametrize("asks_a_person", [True, False])
async def test_a_reviewer_that_asks_for_a_person_gets_one_where_the_class_has_one(
        bench: Bench, tmp_path: Path, asks_a_person: bool) -> None:
    """``needs_human`` (docs/approval.md): with a class whose approval asks
    when the quorum is split, the candidate waits for a person, the verdicts
    saying why and what changed (measured from the repository); without one
    a reviewer that cannot decide is a rejection."""
    script = tmp_path / "doubting.py"
    script.write_text(DOUBTING_REVIEWER)
    await bench.register(verifiers=["pytest", "review"], promote=True, review={"command": [PY, str(script)]},
                         approval={"mode": "when", "when": [{"quorum_split": True}]} if asks_a_person else None)
    cid = await bench.open()
    await bench.record(cid, candidate(bench.repo, bench.base, {"calc/ops.py": FIXED}))
    tests, review = await bench.verdicts(cid)
    assert tests.evidence["change"] == {"files": 1, "lines": 2, "added": 1, "removed": 1,
                                        "paths": ["calc/ops.py"], "paths_truncated": False, "protected": []}
    reads = await bench.actors.reads("reader")
    campaign = await reads.campaign(cid)
    if asks_a_person:
        assert (review.status, review.evidence["needs_human"]) == ("accepted", "right, but it changes how add rounds")
        assert campaign.state == "awaiting_approval"
        [approval] = await reads.approvals_of(cid)
        assert [(r.condition, r.detail) for r in approval.reasons] == [
            ("quorum_split", "review verdict by verifier-B asks for a person: right, but it changes how add rounds")]
    else:
        assert review.status == "rejected" and "asks for a person" in (review.reason or "")
        assert campaign.state == "ready"


@pytest.mark.rollback  # only SQL: a transaction rolled back after the test
async def test_one_verdict_per_verifier_per_attempt_in_the_schema(
        actors: Any, admin: Any, test_class: str, tmp_path: Path) -> None:
    import psycopg

    await (await actors("operator")).register_class(test_class, verifier="command",
                                                    verifiers=["command", "review"])
    repo, base = make_repo(tmp_path / "r")
    await (await actors("sensor")).open_campaign(test_class, "k", "t")
    kernel = await actors("worker")
    claim = await kernel.claim_campaign("worker-A", [test_class])
    assert claim is not None
    await record_candidate(kernel, claim, repo=repo, base=base, sha_=candidate(repo, base, {"x": "1"}),
                           acceptance={"commands": [["true"]]}, worker="worker-A")
    verifier = await actors("verifier")
    assert await verifier.claim_verification("v", classes=[test_class], kinds=["review"]) is None
    first = await verifier.claim_verification("v", classes=[test_class], kinds=["command"])
    assert first is not None and (first.kind, first.quorum) == ("command", ["command", "review"])
    assert await verifier.accept(first.verification_id, {"summary": "ok"}) is None  # quorum incomplete
    assert await verifier.accept(first.verification_id, {"summary": "ok"}) is None  # retried: the same
    assert await verifier.claim_verification("v", classes=[test_class], kinds=["command"]) is None
    with pytest.raises(psycopg.errors.UniqueViolation):
        admin.execute("INSERT INTO ledger.verification (campaign_id, attempt_id, generation, verifier, "
                      "kind, status, claimed_at, lease_expires_at, finished_at) SELECT campaign_id, "
                      "attempt_id, generation, 'x', kind, 'rejected', now(), now(), now() "
                      "FROM ledger.verification WHERE id = %s", (first.verification_id,))


# --- the parts, without a database --------------------------------------------------------------


def test_a_stream_that_stops_early_or_disagrees_is_not_trusted() -> None:
    from ledger.verifiers.judge import read_stream

    hello = {"seq": 0, "event": "hello"}
    ids = {"seq": 1, "event": "collected", "ids": ["t.py::a"]}
    count = {"seq": 2, "event": "collection", "count": 1}
    ok = {"phases": {w: {"raw": "passed", "outcome": "passed"} for w in ("setup", "call", "teardown")}}
    test = {"seq": 3, "event": "test", "id": "t.py::a", "duration": 0.01, **ok}
    session = {"seq": 4, "event": "session", "exitstatus": 0}
    finish = {"seq": 5, "event": "finish", "exit": 0, "problems": []}

    def lines(*records: dict[str, Any]) -> bytes:
        return b"".join(json.dumps(r).encode() + b"\n" for r in records)

    whole = read_stream(lines(hello, ids, count, test, session, finish), connected=True, exit_code=0)
    assert whole.trusted and whole.passed == ["t.py::a"]
    assert not read_stream(lines(hello, ids, count, test), connected=True, exit_code=0).trusted
    assert not read_stream(b"", connected=False, exit_code=0).trusted
    forged = {**test, "phases": {**ok["phases"], "call": {"raw": "failed", "outcome": "passed"}}}
    judged = read_stream(lines(hello, ids, count, forged, session, finish), connected=True, exit_code=0)
    assert not judged.trusted and "its call raised (failed), but its report says passed" in judged.problems[0]
    no_call = {**test, "phases": {"setup": ok["phases"]["setup"], "teardown": ok["phases"]["teardown"]}}
    judged = read_stream(lines(hello, ids, count, no_call, session, finish), connected=True, exit_code=0)
    assert not judged.trusted and judged.outcomes["t.py::a"] == "failed"
    gap = {**finish, "seq": 7}
    assert not read_stream(lines(hello, ids, count, test, session, gap), connected=True, exit_code=0).trusted
    assert not read_stream(lines(hello, ids, count, test, session, finish), connected=True,
                           exit_code=1).trusted  # the process says otherwise


def test_an_observation_keeps_its_test_ids_within_bounds() -> None:
    """The details of an observation are bounded (256 KiB): a large suite's
    passed ids become digests that record_observation checks the same way."""
    import hashlib

    from ledger.verifiers.judge import PASSED_CHARS, Judged

    many = {f"tests/test_big.py::test_{i:06d}_{'x' * 40}": "passed" for i in range(5000)}
    judged = Judged(connected=True, complete=True, problems=[], collected=list(many), outcomes=many)
    summary = judged.summary()
    assert "passed_ids" not in summary and summary["passed_ids_complete"] is True
    assert hashlib.sha256(next(iter(many)).encode()).hexdigest()[:12] in summary["passed_sha256"]
    assert summary["passed_modules"] == ["tests/test_big.py"]
    assert len(json.dumps(summary)) < PASSED_CHARS * 1.1
    few = Judged(connected=True, complete=True, problems=[], collected=["a.py::t"], outcomes={"a.py::t": "passed"})
    assert few.summary()["passed_ids"] == ["a.py::t"]


def test_the_screen_reads_added_lines_only_and_skips_tests(tmp_path: Path) -> None:
    from ledger.git.screen import Screen

    repo, base = make_repo(tmp_path / "r")
    sha = candidate(repo, base, {"calc/ops.py": DETECTS_THE_TEST, "tests/test_more.py": "import _pytest\n",
                                 "json.py": "x = 1\n"})
    findings = Screen().findings(repository.diff(repo, base, sha))
    assert sorted((f.path, f.line, f.rule) for f in findings) == [
        ("calc/ops.py", 8, "pytest-internals"), ("calc/ops.py", 8, "test-detection"),
        ("json.py", None, "shadowing")]
    assert Screen({"rules": []}).findings(repository.diff(repo, base, sha)) == []
    assert Screen({"exempt": ["calc/"]}).findings(repository.diff(repo, base, sha))[0].path == "json.py"


@pytest.mark.rollback  # only SQL: a transaction rolled back after the test
@pytest.mark.cells
async def test_the_judge_without_a_cell_still_reads_its_own_stream(bench: Bench) -> None:
    """A class that opted out of the cell (``cell.sandbox = false``) keeps the
    judge: the honest fix passes, a forged report and os._exit(0) does not
    (without the cell, nothing stops that code from reaching the host)."""
    await bench.register(**JUDGE_ONLY, cell={"sandbox": False})
    cid = await bench.open()
    await bench.record(cid, candidate(bench.repo, bench.base, {"calc/__init__.py": FORGES_THE_REPORT}))
    status, reason, evidence = await bench.verdict(cid)
    assert status == "rejected" and reason is not None and "stops before the end of the run" in reason
    assert evidence["commands"][0]["sandboxed"] is False
    await bench.record(cid, candidate(bench.repo, bench.base, {"calc/ops.py": FIXED}))
    verdicts = await bench.verdicts(cid)
    assert verdicts[-1].status == "accepted", verdicts[-1].reason


@pytest.mark.rollback  # only SQL: a transaction rolled back after the test
@pytest.mark.parametrize(("layer", "settings", "says"), [
    ("screen", {"protected": []}, "adds compiled code"),
    ("judge", JUDGE_ONLY, f"1 test(s) failed: {FAILING}")], ids=["screen", "judge"])
@pytest.mark.cells
async def test_committed_bytecode_is_never_loaded(bench: Bench, tmp_path: Path, layer: str,
                                                  settings: dict[str, Any], says: str) -> None:
    """An unchecked-hash .pyc is loaded without looking at its source: the
    candidate leaves calc/__init__.py as it was and commits the report-patching
    code compiled. The screen names it (compiled-code); without the screen the
    judge removes it before running, and the bug shows."""
    import py_compile

    source = tmp_path / "forged.py"
    source.write_text(PATCHES_REPORTS)
    compiled = tmp_path / "forged.pyc"
    py_compile.compile(str(source), cfile=str(compiled), doraise=True,
                       invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
    pyc = f"calc/__pycache__/__init__.{sys.implementation.cache_tag}.pyc"
    tree = bench.repo.parent / "bytecode"
    git(bench.repo, "worktree", "add", "-q", "--detach", str(tree), bench.base)
    (tree / pyc).parent.mkdir(parents=True)
    (tree / pyc).write_bytes(compiled.read_bytes())
    git(tree, "add", "-f", "-A")
    git(tree, "commit", "-q", "-m", "bytecode")
    sha = git(tree, "rev-parse", "HEAD")
    git(bench.repo, "worktree", "remove", "--force", str(tree))
    await bench.register(**settings)
    cid = await bench.open()
    await bench.record(cid, sha)
    status, reason, _ = await bench.verdict(cid)
    assert status == "rejected" and says in (reason or ""), (layer, reason)
    if layer == "screen":
        assert pyc in (reason or "")


# --- a judge environment a fix cannot recognise ---------------------------------------

# Right only where every judged run used to be: /cell/work (disguised from the screen).
RECOGNISES_THE_CELL = OPS.replace("def add(a, b):\n    return a - b", textwrap.dedent("""\
    import os


    def add(a, b):
        if getattr(os.path, "exi" + "sts")("/ce" + "ll/wo" + "rk"):
            return a + b
        return a - b""").strip())
# Right only in a home directory, where the verifier's runs are now (disguised).
KEYED_TO_HOME = OPS.replace("def add(a, b):\n    return a - b", textwrap.dedent("""\
    import os


    def add(a, b):
        if getattr(os, "getc" + "wd")()[:6] == "/h" + "ome/":
            return a + b
        return a - b""").strip())
PLAIN_CHECK = "from calc import add\nassert add(10, 5) == 15, add(10, 5)\nprint('checked')\n"
# the plain-Python held-out check, run from the checkout (its directory on sys.path)
PLAIN = [PY, "-c", "import runpy; runpy.run_path('tests/held_out/check.py')"]


@pytest.mark.rollback  # only SQL: a transaction rolled back after the test
async def test_a_fix_that_recognises_the_old_judge_is_wrong_in_every_judged_run(bench: Bench, tmp_path: Path) -> None:
    """As found: ``tail()`` right only where ``/cell/work`` exists
    passed the verifier's pytest, the held-out pytest and the plain-Python
    check (and the sensor's confirming run). No judged run is there now."""
    held = held_out_dir(tmp_path)
    (held / "check.py").write_text(PLAIN_CHECK)
    await bench.register(screen={"rules": []}, held_out={
        "path": str(held), "into": "tests/held_out",
        "commands": [[*PYTEST, "tests/held_out"], PLAIN]})
    cid = await bench.open()
    await bench.record(cid, candidate(bench.repo, bench.base, {"calc/ops.py": RECOGNISES_THE_CELL}))
    status, reason, _ = await bench.verdict(cid)
    assert (status, reason) == ("rejected", f"1 test(s) failed: {FAILING}")
    candidate(bench.repo, bench.base, {"calc/ops.py": RECOGNISES_THE_CELL}, branch="recognising")
    reading = await check(sensor_config("recognising"), repository=str(bench.repo), ref="recognising")
    assert reading.status == "red" and reading.details["tests"]["failed"] == [FAILING]


@pytest.mark.rollback  # only SQL: a transaction rolled back after the test
async def test_a_fix_keyed_to_the_verifiers_runs_fails_the_sensors(bench: Bench, tmp_path: Path) -> None:
    """The verifier's runs and the sensor's are shaped differently: a fix that
    recognises the one (a checkout in a home directory) passes the verifier,
    and the confirming run, which looks like a server's, sees it wrong."""
    held = held_out_dir(tmp_path)
    (held / "check.py").write_text(PLAIN_CHECK)
    await bench.register(screen={"rules": []}, held_out={
        "path": str(held), "into": "tests/held_out",
        "commands": [[*PYTEST, "tests/held_out"], PLAIN]})
    cid = await bench.open()
    await bench.record(cid, candidate(bench.repo, bench.base, {"calc/ops.py": KEYED_TO_HOME}))
    status, reason, evidence = await bench.verdict(cid)
    assert status == "accepted", reason  # what no check of a run in a cell can see ...
    candidate(bench.repo, bench.base, {"calc/ops.py": KEYED_TO_HOME}, branch="keyed")
    reading, recorded = await observe(bench, cid, "keyed")
    assert (reading.status, recorded.effect) == ("red", "regressed")  # ... the confirming run does
    # each of the three runs that judged it had a face of its own, none /cell
    places = [c["argv"] for c in evidence["commands"]]
    checkouts = [a.split("=", 1)[1] for argv in places for a in argv if a.startswith("--rootdir=")]
    assert len(set(checkouts)) == 2 and all(c.startswith("/home/") for c in checkouts), checkouts
    assert not any("/cell" in a for argv in places for a in argv)


INTROSPECTS = textwrap.dedent("""\
    import os
    import sys


    def test_the_judged_process_shows_nothing_of_the_judge():
        modules = [m for m in sys.modules if "ledger" in m.lower() or "judge" in m.lower()]
        assert modules == []
        assert sys.argv[0].endswith(os.path.join("pytest", "__main__.py")), sys.argv
        assert not any("ledger" in p.lower() for p in sys.path), sys.path
        assert "PYTEST_DISABLE_PLUGIN_AUTOLOAD" not in os.environ
        assert not any("LEDGER" in k or "ledger" in v.lower() for k, v in os.environ.items()), dict(os.environ)
        seen = ""
        for path in ("/proc/self/mountinfo", "/proc/self/cmdline", "/proc/1/cmdline", "/proc/self/environ",
                     "/etc/passwd", "/etc/group", "/etc/hostname"):
            seen += open(path, "rb").read().decode("utf-8", "replace")
        assert "ledger" not in seen.lower() and "/cell" not in seen, seen
        assert not os.path.exists("/cell")
        assert os.getcwd().startswith("/home/") and os.environ["HOME"].startswith("/home/")
    """)


@pytest.mark.rollback  # only SQL: a transaction rolled back after the test
async def test_a_judged_test_process_sees_nothing_named_for_ledger(bench: Bench) -> None:
    """No variable, module, path or mount of a judged run names Ledger (or its
    judge); the launcher's own traces are gone before the first conftest."""
    await bench.register(**JUDGE_ONLY, environment=[])
    cid = await bench.open()
    await bench.record(cid, candidate(bench.repo, bench.base, {
        "calc/ops.py": FIXED, "tests/test_introspect.py": INTROSPECTS}))
    status, reason, evidence = await bench.verdict(cid)
    assert status == "accepted", (reason, [c["output"][-3000:] for c in evidence.get("commands", [])])


@pytest.mark.rollback  # only SQL: a transaction rolled back after the test
async def test_the_sensors_judged_run_is_told_nothing_of_ledger(bench: Bench) -> None:
    watched = INTROSPECTS.replace('os.getcwd().startswith("/home/") and os.environ["HOME"].startswith("/home/")',
                                  'not os.getcwd().startswith("/home/") and "LEDGER_JUNIT_XML" not in os.environ')
    candidate(bench.repo, bench.base, {"calc/ops.py": FIXED, "tests/test_introspect.py": watched},
              branch="introspected")
    sensor = parse_config({"sensors": {"tests": {"target": "repo#introspected", "every_s": 60, "command": PYTEST,
                                                 "class": CLASS}}}).sensors["tests"]
    reading = await check(sensor, repository=str(bench.repo), ref="introspected")
    assert reading.status == "green", reading.details.get("output", "")[-3000:]
    assert reading.details["tests"]["passed"] == 4


PROBES = {
    "if os.path.exists('/cell/work'):": True,
    'if os.getcwd().startswith("/home/"):': True,
    "if 'runner' in socket.gethostname():": True,
    "if os.getuid() == 65534:": True,
    'mounts = open("/proc/self/mountinfo").read()': True,
    'in_cgroup = "docker" in open("/proc/1/cgroup").read()': True,
    'if Path("/.dockerenv").exists():': True,
    'home = os.environ.get("HOME", "")': True,
    "if '/srv/' in __file__:": True,
    "if getpass.getuser() == 'nobody':": True,
    "here = os.path.dirname(__file__)": False,
    "path = os.path.join(os.getcwd(), name)": False,
    "return a + b": False,
    "with open(os.path.join(here, 'data.json')) as f:": False,
}


def test_the_screen_flags_code_that_asks_where_it_runs(tmp_path: Path) -> None:
    """Paths, host name, user, mounts, cgroups: what a fix that recognises its
    judge asks. The obvious asking only: a disguise gets past it (the
    guise and the sensor's other face are what stop that)."""
    from ledger.git.screen import Screen

    repo, base = make_repo(tmp_path / "r")
    body = "".join(f"def f{i}():\n    {line}\n        pass\n\n\n" if line.endswith(":")
                   else f"def f{i}():\n    {line}\n\n\n" for i, line in enumerate(PROBES))
    sha = candidate(repo, base, {"calc/where.py": "import os\n\n\n" + body})
    flagged = {f.text.strip() for f in Screen().findings(repository.diff(repo, base, sha))
               if f.rule == "environment-probe"}
    assert flagged == {line for line, probe in PROBES.items() if probe}
    assert Screen({"rules": ["hard-exit"]}).findings(repository.diff(repo, base, sha)) == []  # the class's to turn off
    disguised = candidate(repo, base, {"calc/ops.py": RECOGNISES_THE_CELL})
    assert Screen().findings(repository.diff(repo, base, disguised)) == []


def test_the_screen_refuses_links_that_leave_the_tree(tmp_path: Path) -> None:
    """Finding: seven links committed by a candidate (one to the user's own
    .git/config, one to ../../..) landed on main and in the user's checkout."""
    from ledger.git.screen import Screen

    repo, base = make_repo(tmp_path / "r")
    tree = tmp_path / "links"
    git(repo, "worktree", "add", "-q", "--detach", str(tree), base)
    links = {"abs": "/etc/passwd", "up": "../../..", "calc/config": "../.git/config", "calc/deep": "../../x",
             "gitdir": ".git", "home": "~/.ssh/id_rsa", "calc/fine": "ops.py", "calc/sub": "../tests"}
    for path, target in links.items():
        (tree / path).parent.mkdir(parents=True, exist_ok=True)
        os.symlink(target, tree / path)
    git(tree, "add", "-A")
    git(tree, "commit", "-q", "-m", "links")
    sha = git(tree, "rev-parse", "HEAD")
    git(repo, "worktree", "remove", "--force", str(tree))
    diff = repository.diff(repo, base, sha)
    flagged = {f.path: f.text for f in Screen().findings(diff) if f.rule == "escaping-links"}
    assert set(flagged) == {"abs", "up", "calc/config", "calc/deep", "gitdir", "home"}
    assert flagged["up"] == "-> ../../.."
    assert Screen({"exempt": ["abs", "up", "calc/", "gitdir", "home"]}).findings(diff) == []
    assert not [f for f in Screen({"rules": [r for r in __import__("ledger.git.screen", fromlist=["x"]).RULE_NAMES
                                              if r != "escaping-links"]}).findings(diff)
                if f.rule == "escaping-links"]  # the per-class opt-out
