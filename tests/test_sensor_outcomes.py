"""Sensors that tell a broken check from a red one.

Three outcomes, on real check processes in real cells: exit 0 is green, an
exit code the sensor declares red (``red_exit_codes``, default 1) is red, and
anything else -- exit 2 of a check that cannot reach its remote, 3, 127 of a
missing program, a timeout, a kill by the cell's limits, a cell that cannot be
built, a pytest run the judge cannot trust -- is an error: recorded with its
evidence and reason, seen (``ledger status``, ``GET /sensors``, the
dashboard, the metrics), and never opens, regresses, confirms or dismisses a
campaign. ``open_after``/``confirm_after`` make a flaky check neither open nor
close on one run. And the worker looks at the target again (the class's
sensor, once, in a cell) before it starts an agent on an old campaign and
before it charges an attempt that changed nothing: green dismisses the
campaign, nothing charged, the agent not paid."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from test_api import Api, api  # noqa: F401 (the fixture)

from conftest import TEST_PREFIX, Actors, Admin
from drive import PROMOTING_CLASS, Driver
from ledger import Database
from ledger.config import LedgerConfig, SensorConfig, parse_config
from ledger.db.reads import Reads
from ledger.drills.paths import scripted_attempt
from ledger.roles.sensors import Sensor, check
from ledger.roles.worker import Worker, WorkerOptions
from ledger.sandbox import cell as cells

pytestmark = pytest.mark.anyio

# A check that exits with the codes of its plan in turn (one a line), counting its runs.
SEQUENCE = """import pathlib, sys
marks = pathlib.Path(sys.argv[1])
with (marks / 'runs').open('a') as f: f.write('run\\n')
runs = len((marks / 'runs').read_text().split())
plan = (marks / 'plan').read_text().split()
sys.exit(int(plan[(runs - 1) % len(plan)]))
"""


def _sensor(body: dict[str, Any], name: str = "s") -> SensorConfig:
    return parse_config({"sensors": {name: {"target": "repo-x", "every_s": 60, "class": "test",
                                            **body}}}).sensors[name]


@dataclass
class Sequence:
    """A sequence check's plan and runs."""

    marks: Path
    command: list[str]

    def plan(self, *codes: int) -> None:
        (self.marks / "plan").write_text(" ".join(map(str, codes)))
        (self.marks / "runs").write_text("")

    @property
    def runs(self) -> int:
        return len((self.marks / "runs").read_text().split())


@pytest.fixture
def sequence(tmp_path: Path) -> Sequence:
    marks = tmp_path / "marks"  # the one host directory the check's cell may write
    marks.mkdir()
    script = tmp_path / "sequence.py"
    script.write_text(SEQUENCE)
    seq = Sequence(marks, [sys.executable, str(script), str(marks)])
    seq.plan(0)
    return seq


def _observations(admin: Admin, sensor: str = "s") -> list[dict[str, Any]]:
    return admin.execute("SELECT id, status, effect, campaign_id, reason, details FROM ledger.observation "
                         "WHERE sensor = %s ORDER BY id", (sensor,)).fetchall()


def _campaigns(admin: Admin) -> list[dict[str, Any]]:
    return admin.execute("SELECT id, state, attempt_count FROM ledger.campaign ORDER BY id").fetchall()


# --- 1. the check's own failure is an error, and opens nothing -------------------------

FAILURES: dict[str, tuple[dict[str, Any], str]] = {
    # the case: a check that cannot reach its remote (git's own words, exit 2)
    "exit-2": ({"command": ["sh", "-c", "echo 'fatal: unable to connect to 127.0.0.1: Connection "
                                        "refused' >&2; exit 2"]},
               "the check exited 2, not 0 (green) nor one of its red_exit_codes (1): fatal: unable to connect"),
    "exit-3": ({"command": ["sh", "-c", "exit 3"]}, "the check exited 3"),
    "missing-program": ({"command": ["/nonexistent/check"]}, "the check's program was not found (exit 127)"),
    "timeout": ({"command": ["sleep", "30"], "timeout_s": 0.5}, "timed out after 0.5s"),
    # a shell tool writing past the cell's file_size_mb is killed by SIGXFSZ
    "killed-by-its-cell": ({"command": ["sh", "-c", "exec head -c 3000000 /dev/zero > big"],
                            "cell": {"file_size_mb": 1}},
                           "the check was killed by SIGXFSZ (it wrote past its cell's file_size_mb)"),
}


@pytest.mark.rollback
@pytest.mark.parametrize("case", FAILURES, ids=list(FAILURES))
async def test_a_check_that_fails_itself_records_an_error_and_opens_nothing(
        actors: Actors, admin: Admin, test_class: str, case: str) -> None:
    body, reason = FAILURES[case]
    sensor = Sensor(await actors("sensor"), _sensor(body), "sensor-1")
    for _ in range(2):
        recorded = await sensor.observe(None)
        assert recorded is not None
        assert (recorded.effect, recorded.campaign_id) == ("recorded", None)
        assert recorded.reason is not None and recorded.reason.startswith(reason), recorded.reason
    assert _campaigns(admin) == [], "a broken check opened a campaign"
    rows = _observations(admin)
    assert [(r["status"], r["effect"], r["campaign_id"]) for r in rows] == [("error", "recorded", None)] * 2
    assert rows[0]["details"]["error"] == rows[0]["reason"]  # the evidence keeps the reason
    assert rows[0]["details"]["sandboxed"] is True


@pytest.mark.rollback
async def test_exit_1_is_red_and_opens_one_campaign(actors: Actors, admin: Admin, test_class: str) -> None:
    sensor = Sensor(await actors("sensor"), _sensor({"command": ["sh", "-c", "exit 1"]}), "sensor-1")
    first, second = await sensor.observe(None), await sensor.observe(None)
    assert first is not None and second is not None
    assert (first.effect, second.effect) == ("opened", "recorded")
    assert [c["state"] for c in _campaigns(admin)] == ["ready"]
    assert [r["status"] for r in _observations(admin)] == ["red", "red"]


@pytest.mark.rollback
async def test_declared_red_exit_codes_are_red_and_exit_1_then_is_an_error(
        actors: Actors, admin: Admin, test_class: str) -> None:
    sensor = Sensor(await actors("sensor"), _sensor({"command": ["sh", "-c", "exit 1"],
                                                    "red_exit_codes": [3]}), "sensor-1")
    assert (await sensor.observe(None)).effect == "recorded"
    assert _campaigns(admin) == []
    sensor = Sensor(await actors("sensor"), _sensor({"command": ["sh", "-c", "exit 3"],
                                                    "red_exit_codes": [3]}, name="t"), "sensor-1")
    assert (await sensor.observe(None)).effect == "opened"


@pytest.mark.rollback
async def test_a_cell_that_cannot_be_built_is_an_error(actors: Actors, admin: Admin, test_class: str,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cells, "bubblewrap", lambda: None)  # this host without bubblewrap
    monkeypatch.setattr(cells, "_checked", {})
    sensor = Sensor(await actors("sensor"), _sensor({"command": ["sh", "-c", "exit 1"]}), "sensor-1")
    recorded = await sensor.observe(None)
    assert recorded is not None and recorded.effect == "recorded"
    assert recorded.reason is not None and "bubblewrap" in recorded.reason
    assert _campaigns(admin) == []
    [row] = _observations(admin)
    assert row["status"] == "error" and row["details"]["system_fault"] is True


def test_red_exit_codes_and_statuses_are_checked_in_the_config() -> None:
    from ledger.errors import ConfigError
    for bad, said in (({"command": ["true"], "red_exit_codes": [0]}, "from 1 to 255"),
                      ({"command": ["true"], "red_statuses": [500]}, "are for a url check"),
                      ({"url": "http://x", "red_exit_codes": [2]}, "are for a command check"),
                      ({"url": "http://x", "red_statuses": [200]}, "cannot be red too"),
                      ({"command": ["true"], "open_after": 0}, "open_after")):
        with pytest.raises(ConfigError, match=said):
            _sensor(bad)


# --- 2. the judge's pytest runs -------------------------------------------------------

def _repository(tmp_path: Path, files: dict[str, str]) -> Path:
    work, bare = tmp_path / "work", tmp_path / "app.git"
    for name, text in files.items():
        (work / name).parent.mkdir(parents=True, exist_ok=True)
        (work / name).write_text(text)
    git = ["git", "-C", str(work), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q", "-b", "main", str(work)], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "x"], check=True)
    subprocess.run(["git", "clone", "-q", "--bare", str(work), str(bare)], check=True)
    return bare


PYTEST_CASES = {
    "passing": ({"tests/test_a.py": "def test_ok():\n    pass\n"}, [], "green", None),
    "failing": ({"tests/test_a.py": "def test_no():\n    assert 0\n"}, [], "red", None),
    # a module that cannot be imported: the target's code is broken (pytest exits 2)
    "collection-error": ({"tests/test_a.py": "import no_such_module\n\ndef test_x():\n    pass\n"}, [],
                         "red", None),
    "no-tests": ({"tests/test_a.py": "X = 1\n"}, [], "error", "pytest exited 5 (no tests were collected)"),
    "usage-error": ({"tests/test_a.py": "def test_ok():\n    pass\n"}, ["--no-such-option"], "error",
                    "pytest exited 4 (usage error)"),
}


@pytest.mark.parametrize("case", PYTEST_CASES, ids=list(PYTEST_CASES))
async def test_a_pytest_run_is_red_only_for_failing_tests_and_an_error_for_pytests_own_codes(
        tmp_path: Path, case: str) -> None:
    files, extra, outcome, reason = PYTEST_CASES[case]
    bare = _repository(tmp_path, files)
    sensor = _sensor({"command": [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *extra],
                      "environment": ["PYTEST_DISABLE_PLUGIN_AUTOLOAD=1", "PYTHONDONTWRITEBYTECODE=1"]})
    reading = await check(sensor, repository=str(bare), ref="main")
    assert reading.status == outcome, reading.details
    if reason is not None:
        assert str(reading.error).startswith(reason), reading.error
    if case == "collection-error":
        assert reading.details["exit_code"] == 2 and reading.details["tests"]["failed"] == ["tests/test_a.py"]


async def test_the_shipped_wrapper_that_cannot_read_its_ref_is_an_error_not_red(tmp_path: Path) -> None:
    """examples/run_tests_at.py used to die on a traceback (exit 1, red) when
    its repository or ref was out of reach."""
    from ledger.demo import examples_dir
    sensor = _sensor({"cell": {"sandbox": False},
                      "command": [sys.executable, str(examples_dir() / "run_tests_at.py"),
                                  str(tmp_path / "gone.git"), "main", "--pytest"]})
    reading = await check(sensor)
    assert reading.status == "error" and reading.details["exit_code"] == 2
    assert str(reading.error).endswith(f"run_tests_at: cannot read main of {tmp_path / 'gone.git'}")


# --- 3. an HTTP sensor ------------------------------------------------------------------

class Http:
    """A server on loopback: GET /NNN answers status NNN, GET /silent never answers."""

    def __init__(self) -> None:
        self.server: asyncio.base_events.Server | None = None
        self.port = 0

    async def __aenter__(self) -> Http:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *_: object) -> None:
        assert self.server is not None
        self.server.close()
        await self.server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        path = (await reader.readline()).split()[1].decode()
        while (await reader.readline()) not in (b"\r\n", b""):
            pass
        if path == "/silent":
            await asyncio.sleep(30)
        else:
            writer.write(f"HTTP/1.1 {path[1:]} X\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok".encode())
            await writer.drain()
        writer.close()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_an_http_sensor_is_green_red_or_an_error() -> None:
    async with Http() as http:
        base = f"http://127.0.0.1:{http.port}"
        cases: list[tuple[dict[str, Any], str, str | None]] = [
            ({"url": f"{base}/200"}, "green", None),
            ({"url": f"{base}/404"}, "red", None),  # by default any other status below 500
            ({"url": f"{base}/503"}, "error", "the server answered 503"),
            ({"url": f"{base}/503", "red_statuses": [503]}, "red", None),  # declared
            ({"url": f"{base}/404", "red_statuses": [500]}, "error", "HTTP 404 is neither"),
            ({"url": f"{base}/silent", "timeout_s": 0.5}, "error", "no answer within 0.5s"),
            ({"url": f"http://127.0.0.1:{_closed_port()}/200"}, "error", "cannot reach"),
        ]
        for body, outcome, reason in cases:
            reading = await check(_sensor(body))
            assert reading.status == outcome, (body, reading.details)
            if reason is not None:
                assert str(reading.error).startswith(reason), (body, reading.error)


# --- 4. hysteresis ----------------------------------------------------------------------

def _now() -> datetime:
    return datetime.now(timezone.utc)


@pytest.mark.rollback
async def test_a_flaky_check_opens_nothing_with_open_after_2(actors: Actors, admin: Admin, test_class: str,
                                                             sequence: Sequence) -> None:
    sequence.plan(1, 0)  # red, green, red, green ...
    sensor = Sensor(await actors("sensor"), _sensor({"command": sequence.command, "open_after": 2,
                                                    "cell": {"writable": [str(sequence.marks)]}}), "sensor-1")
    for _ in range(6):
        await sensor.observe(None)
    assert sequence.runs == 6
    assert _campaigns(admin) == [], "a flaky check opened a campaign"
    rows = _observations(admin)
    assert [r["status"] for r in rows] == ["red", "green"] * 3
    assert {r["reason"] for r in rows if r["status"] == "red"} == {
        "1 of the 2 red observations in a row needed to open a campaign"}
    # two reds in a row do open one, and its journal names the runs that counted
    sequence.plan(1)
    first, second = await sensor.observe(None), await sensor.observe(None)
    assert first is not None and second is not None
    assert (first.effect, second.effect) == ("recorded", "opened")
    [campaign] = _campaigns(admin)
    [opened] = admin.execute("SELECT payload FROM ledger.campaign_event WHERE campaign_id = %s "
                             "AND payload->>'transition' = 'open'", (campaign["id"],)).fetchall()
    assert opened["payload"]["observation"]["counted"] == [second.observation_id, first.observation_id]


@pytest.mark.rollback
async def test_errors_neither_break_nor_lengthen_a_streak(actors: Actors, admin: Admin, test_class: str) -> None:
    sensor = await actors("sensor")

    async def observe(status: str) -> Any:
        return await sensor.record_observation("s", "flaky", "t", status, _now(), class_=test_class,
                                               details={"error": "no remote"} if status == "error" else {},
                                               open_after=2)
    red = await observe("red")
    error = await observe("error")
    assert (red.effect, error.effect, error.reason) == ("recorded", "recorded", "no remote")
    assert _campaigns(admin) == []
    again = await observe("red")
    assert again.effect == "opened"
    opening = admin.execute("SELECT opening_observation FROM ledger.campaign").fetchone()["opening_observation"]
    assert opening["counted"] == [again.observation_id, red.observation_id]


@pytest.mark.rollback
async def test_a_confirmation_needs_confirm_after_greens_in_a_row(actors: Actors, admin: Admin) -> None:
    op = await actors("operator")
    await op.register_class(PROMOTING_CLASS, max_attempts=3, lease_seconds=30, backoff_base_s=0,
                            promotion={"ref": "refs/heads/main", "repository": "/nowhere"})
    sensor = await actors("sensor")
    cid = await Driver(actors, PROMOTING_CLASS).promoted()
    key = (await Reads(sensor.executor).campaign(cid)).objective_key

    async def observe(status: str) -> Any:
        return await sensor.record_observation("s", key, "target-1", status, _now(), class_=PROMOTING_CLASS,
                                               open_after=2, confirm_after=2)
    green = await observe("green")
    assert (green.effect, green.reason) == ("recorded", "1 of the 2 green observations in a row needed to confirm")
    red = await observe("red")  # one red neither regresses (open_after 2) nor lets the green count
    assert red.effect == "recorded"
    assert (await observe("green")).effect == "recorded"
    assert (await observe("error")).effect == "recorded"  # an error in between changes nothing
    assert (await Reads(sensor.executor).campaign(cid)).state == "verified"
    last = await observe("green")
    assert last.effect == "confirmed"
    events = admin.execute("SELECT type, payload FROM ledger.campaign_event WHERE campaign_id = %s ORDER BY seq",
                           (cid,)).fetchall()
    confirm = next(e["payload"] for e in events if e["payload"].get("transition") == "confirm")
    assert len(confirm["counted"]) == 2 and confirm["counted"][0] == last.observation_id
    streaks = [e["payload"] for e in events if e["type"] == "observation.streak"]
    assert [s["status"] for s in streaks] == ["green", "red", "green"]  # each one short of its streak


@pytest.mark.rollback
async def test_an_error_moves_no_campaign_and_is_journaled_once_per_streak(
        actors: Actors, admin: Admin, test_class: str) -> None:
    sensor = await actors("sensor")
    opened = await sensor.record_observation("s", "k", "t", "red", _now(), class_=test_class)
    cid = opened.campaign_id
    assert cid is not None
    for _ in range(3):
        error = await sensor.record_observation("s", "k", "t", "error", _now(),
                                                details={"error": "the check exited 2"})
        assert (error.effect, error.campaign_id) == ("recorded", None)
    assert (await Reads(sensor.executor).campaign(cid)).state == "ready"  # not dismissed
    errors = admin.execute("SELECT payload FROM ledger.campaign_event WHERE campaign_id = %s "
                           "AND type = 'observation.error'", (cid,)).fetchall()
    assert [e["payload"]["reason"] for e in errors] == ["the check exited 2"]
    green = await sensor.record_observation("s", "k", "t", "green", _now())
    assert green.effect == "dismissed"
    with pytest.raises(Exception, match="green, red or error"):
        await sensor.record_observation("s", "k", "t", "unknown", _now())


# --- 5. the worker's second look -----------------------------------------------------------

CLASS = "fixes"


@dataclass
class Shop:
    """A repository, a sequence check as its class's sensor, an attempt that
    leaves a marker when it runs, and an in-process worker."""

    root: Path
    db: Database
    seq: Sequence
    config: LedgerConfig

    @property
    def ran(self) -> list[Path]:
        return sorted(self.seq.marks.glob("ran-*.json"))

    async def work_once(self) -> int:
        worker = Worker(self.db, self.config, WorkerOptions(data_dir=self.root / "data", poll_s=0.2))
        return await worker.run_once()


def _shop(tmp_path: Path, db: Database, seq: Sequence, reobserve_after_s: str, plan: list[list[Any]]) -> Shop:
    repo = tmp_path / "repo"
    subprocess.run(["git", "init", "-q", "-b", "main", str(repo)], check=True)
    (repo / "README").write_text("an app\n")
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "start"], check=True)
    attempt_plan = seq.marks / "attempt.json"
    attempt_plan.write_text(json.dumps({"default": plan}))
    toml = f"""
[classes.{CLASS}]
repository = "{repo}"
attempt_command = {json.dumps([sys.executable, str(scripted_attempt()), str(attempt_plan)])}
max_attempts = 3
lease_s = 30
heartbeat_s = 1
backoff = {{ base_s = 0, jitter = 0 }}
cell = {{ writable = ["{seq.marks}"] }}
{reobserve_after_s}

[sensors.app]
target = "repo#main"
every_s = 60
command = {json.dumps(seq.command)}
class = "{CLASS}"
cell = {{ writable = ["{seq.marks}"] }}
"""
    (tmp_path / "ledger.toml").write_text(toml)
    return Shop(tmp_path, db, seq, parse_config(tomllib.loads(toml)))


async def _opened_red(shop: Shop, actors: Actors) -> int:
    """The class registered, and a campaign opened by the sensor's red run."""
    op = await actors("operator")
    await op.register_class(CLASS, **shop.config.campaign_class(CLASS).registration())
    shop.seq.plan(1)
    sensor = Sensor(await actors("sensor"), shop.config.sensors["app"], "sensor-1")
    opened = await sensor.observe(None)
    assert opened is not None and opened.effect == "opened" and opened.campaign_id is not None
    return opened.campaign_id


def _transitions(admin: Admin, cid: int) -> list[tuple[str, str | None]]:
    return [(r["payload"]["transition"], r["actor_role"]) for r in admin.execute(
        "SELECT payload, actor_role FROM ledger.campaign_event WHERE campaign_id = %s AND type = 'transition' "
        "ORDER BY seq", (cid,)).fetchall()]


async def test_a_target_already_green_when_the_worker_claims_is_dismissed_without_the_agent(
        tmp_path: Path, db: Database, actors: Actors, admin: Admin, sequence: Sequence) -> None:
    shop = _shop(tmp_path, db, sequence, "reobserve_after_s = 0",
                 [["context", "ran"], ["write", "README", "changed\n"], ["exit", 0]])
    cid = await _opened_red(shop, actors)
    sequence.plan(0)  # meanwhile main turned green (someone fixed it)
    assert await shop.work_once() == 1
    assert shop.ran == [], "the agent ran on a target that is not broken"
    assert sequence.runs == 1, "the class's sensor ran once, from the worker"
    [campaign] = _campaigns(admin)
    assert (campaign["state"], campaign["attempt_count"]) == ("dismissed", 0)
    [attempt] = admin.execute("SELECT outcome, failure_reason FROM ledger.attempt").fetchall()
    assert attempt["outcome"] == "released" and "re-observed green" in attempt["failure_reason"]
    assert _transitions(admin, cid) == [("open", "sensor"), ("claim", "worker"), ("dismiss", "worker")]
    seen = _observations(admin, "app")[-1]
    assert (seen["status"], seen["effect"], seen["campaign_id"]) == ("green", "dismissed", cid)
    assert seen["details"]["reobserved"]["moment"] == "before_start"
    assert seen["reason"] == attempt["failure_reason"]


async def test_an_attempt_that_changed_nothing_on_a_green_target_costs_nothing(
        tmp_path: Path, db: Database, actors: Actors, admin: Admin, sequence: Sequence) -> None:
    shop = _shop(tmp_path, db, sequence, "", [["context", "ran"], ["exit", 0]])  # changes nothing
    assert shop.config.campaign_class(CLASS).reobserve_after_s == 600  # just opened: no look before
    await _opened_red(shop, actors)
    sequence.plan(0)
    assert await shop.work_once() == 1
    assert len(shop.ran) == 1  # the agent ran (the campaign was fresh) ...
    [campaign] = _campaigns(admin)
    assert (campaign["state"], campaign["attempt_count"]) == ("dismissed", 0)  # ... and nothing was charged
    seen = _observations(admin, "app")[-1]
    assert (seen["status"], seen["details"]["reobserved"]["moment"]) == ("green", "changed_nothing")


async def test_an_attempt_that_changed_nothing_on_a_red_target_is_charged_as_before(
        tmp_path: Path, db: Database, actors: Actors, admin: Admin, sequence: Sequence) -> None:
    shop = _shop(tmp_path, db, sequence, "reobserve_after_s = 0", [["context", "ran"], ["exit", 0]])
    cid = await _opened_red(shop, actors)
    assert await shop.work_once() == 1  # still red: before the start, and after the attempt
    assert len(shop.ran) == 1 and sequence.runs == 3
    [campaign] = _campaigns(admin)
    assert (campaign["state"], campaign["attempt_count"]) == ("ready", 1)
    [attempt] = admin.execute("SELECT outcome, failure_reason FROM ledger.attempt").fetchall()
    assert (attempt["outcome"], attempt["failure_reason"]) == (
        "failed", "the attempt command succeeded but changed nothing")
    looks = admin.execute("SELECT payload FROM ledger.campaign_event WHERE campaign_id = %s "
                          "AND type = 'observation.reobserved' ORDER BY seq", (cid,)).fetchall()
    assert [(e["payload"]["status"], e["payload"]["moment"]) for e in looks] == [
        ("red", "before_start"), ("red", "changed_nothing")]


@pytest.mark.rollback
async def test_a_reobservation_is_fenced_and_its_retry_returns_the_first_result(
        actors: Actors, admin: Admin, test_class: str) -> None:
    from ledger.errors import LedgerError, StaleLease
    d = Driver(actors, test_class)
    cid, gen = await d.leased()
    worker = await actors("worker")
    red = await worker.reobserve(cid, gen, "s", "red", _now(), moment="before_start")
    assert red.effect == "recorded" and await worker.reobserve(cid, gen, "s", "red", _now()) == red
    with pytest.raises(LedgerError, match="re-observed before_start already"):
        await worker.reobserve(cid, gen, "s", "green", _now())
    with pytest.raises(StaleLease):
        await worker.reobserve(cid, gen + 1, "s", "green", _now(), moment="changed_nothing")
    green = await worker.reobserve(cid, gen, "s", "green", _now(), moment="changed_nothing")
    assert green.effect == "dismissed"
    assert await worker.reobserve(cid, gen, "s", "green", _now(), moment="changed_nothing") == green


# --- 6. errors are seen ----------------------------------------------------------------------

async def test_a_sensor_that_keeps_failing_is_seen_in_status_the_api_and_the_metrics(
        db_url: str, actors: Actors, test_class: str, api: Api) -> None:
    sensor = await actors("sensor")
    await sensor.record_observation("healthy", "a", "t", "green", _now())
    await sensor.record_observation("broken", "b", "t", "green", _now())
    for n in range(3):
        await sensor.record_observation("broken", "b", "t", "error", _now(),
                                        details={"error": f"fatal: unable to connect ({n})"})
    listed = (await api.get("/sensors")).json()
    by_name = {s["sensor"]: s for s in listed}
    assert by_name["broken"]["status"] == "error" and by_name["broken"]["consecutive_errors"] == 3
    assert by_name["broken"]["last_error"] == "fatal: unable to connect (2)"
    assert (by_name["healthy"]["consecutive_errors"], by_name["healthy"]["last_error"]) == (0, None)
    in_status = {s["sensor"]: s for s in (await api.get("/status")).json()["sensors"]}
    assert in_status["broken"] == by_name["broken"]

    env = {**os.environ, "LEDGER_DATABASE_URL": db_url, "LEDGER_ROLE_PREFIX": TEST_PREFIX}
    done = subprocess.run([sys.executable, "-m", "ledger", "status", "--json"], env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    status = {s["sensor"]: s for s in json.loads(done.stdout)["sensors"]}
    assert (status["broken"]["last_outcome"], status["broken"]["consecutive_errors"]) == ("error", 3)
    assert status["broken"]["last_error"] == "fatal: unable to connect (2)"
    table = subprocess.run([sys.executable, "-m", "ledger", "status"], env=env, capture_output=True,
                           text=True, timeout=60).stdout
    assert "broken\terror\t" in table and "\t3\t" in table

    text = (await api.get("/metrics")).text
    assert 'ledger_sensor_observations_total{outcome="error",sensor="broken"} 3.0' in text
    assert 'ledger_sensor_observations_total{outcome="red",sensor="broken"} 0.0' in text
    assert 'ledger_sensor_consecutive_errors{sensor="broken"} 3.0' in text
    assert 'ledger_sensor_consecutive_errors{sensor="healthy"} 0.0' in text
    # a green run ends the streak
    await sensor.record_observation("broken", "b", "t", "green", _now())
    assert 'ledger_sensor_consecutive_errors{sensor="broken"} 0.0' in (await api.get("/metrics")).text
