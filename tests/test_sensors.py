"""Sensors: intake without help, ticks observed once across processes, missed
ticks coalesced, and observations that confirm only after promotion."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from conftest import TEST_PREFIX, Actors, Admin
from drive import PROMOTING_CLASS, Driver, eventually
from ledger.config import parse_config
from ledger.db.reads import Reads
from ledger.roles.sensors import EPOCH, Sensor, latest_due_tick, next_tick, trigger_for

pytestmark = pytest.mark.anyio

CHECK = """import sys, pathlib
runs = pathlib.Path(sys.argv[1]).with_suffix('.runs')
with runs.open('a') as f: f.write('run\\n')
sys.exit(0 if pathlib.Path(sys.argv[1]).read_text().strip() == 'green' else 1)
"""


def _config(tmp_path: Path, every_s: float = 0.5, cron: str | None = None):
    script = tmp_path / "check.py"
    script.write_text(CHECK)
    markers = tmp_path / "markers"  # the check's status and runs: the one host directory its cell may write
    markers.mkdir(exist_ok=True)
    status = markers / "target.status"
    status.write_text("green")
    schedule = f'cron = "{cron}"' if cron else f"every_s = {every_s}"
    toml = f"""
[sensors.tests]
target = "repo-x"
{schedule}
command = ["{sys.executable}", "{script}", "{status}"]
class = "test"
cell = {{ writable = ["{markers}"] }}
"""
    (tmp_path / "ledger.toml").write_text(toml)
    import tomllib
    return parse_config(tomllib.loads(toml)), status


@pytest.fixture
async def promoting(actors: Actors) -> str:
    """A class whose verified candidates are promoted (to a ref nobody reads)."""
    op = await actors("operator")
    await op.register_class(PROMOTING_CLASS, max_attempts=3, lease_seconds=30, backoff_base_s=0,
                            promotion={"ref": "refs/heads/main", "repository": "/nowhere"})
    return PROMOTING_CLASS


def test_ticks_are_epoch_aligned_and_coalesced() -> None:
    cfg = parse_config({"sensors": {"s": {"target": "t", "every_s": 60, "command": ["true"], "class": "c"}}})
    trigger = trigger_for(cfg.sensors["s"])
    now = datetime(2030, 5, 5, 12, 34, 56, tzinfo=timezone.utc)
    assert latest_due_tick(trigger, now) == datetime(2030, 5, 5, 12, 34, tzinfo=timezone.utc)
    assert next_tick(trigger, now) == datetime(2030, 5, 5, 12, 35, tzinfo=timezone.utc)
    # After three hours down, one tick is due -- the latest -- not 180.
    assert latest_due_tick(trigger, now + timedelta(hours=3)) == datetime(2030, 5, 5, 15, 34, tzinfo=timezone.utc)
    cron = parse_config({"sensors": {"s": {"target": "t", "cron": "0 2 * * *", "command": ["true"], "class": "c"}}})
    nightly = trigger_for(cron.sensors["s"])
    assert latest_due_tick(nightly, now) == datetime(2030, 5, 5, 2, 0, tzinfo=timezone.utc)
    assert next_tick(nightly, now) == datetime(2030, 5, 6, 2, 0, tzinfo=timezone.utc)
    assert (now - EPOCH).total_seconds() > 0


@pytest.mark.rollback  # only SQL: a transaction rolled back after the test
@pytest.mark.cells
async def test_a_broken_target_opens_exactly_one_campaign(actors: Actors, admin: Admin, test_class: str, tmp_path: Path) -> None:
    cfg, status = _config(tmp_path, every_s=0.3)
    sensor = Sensor(await actors("sensor"), cfg.sensors["tests"], "sensor-1")
    stop = asyncio.Event()
    running = asyncio.create_task(sensor.run(stop))

    def campaigns() -> list[dict]:
        return admin.execute("SELECT id, state FROM ledger.campaign WHERE objective_key = 'tests:repo-x'").fetchall()

    def observations(status_: str) -> int:
        return admin.execute("SELECT count(*) AS n FROM ledger.observation WHERE sensor = 'tests' AND status = %s",
                             (status_,)).fetchone()["n"]

    await eventually(lambda: observations("green") >= 1, what="a green observation")
    assert campaigns() == []
    status.write_text("red")  # the fault: the watched target breaks
    await eventually(lambda: observations("red") >= 2, timeout=10, what="two red ticks")
    stop.set()
    await running
    assert [c["state"] for c in campaigns()] == ["ready"]
    effects = [r["effect"] for r in admin.execute(
        "SELECT effect FROM ledger.observation WHERE status = 'red' ORDER BY id").fetchall()]
    assert effects[0] == "opened" and set(effects[1:]) == {"recorded"}


@pytest.mark.cells
async def test_two_sensor_processes_observe_each_tick_once(db_url: str, admin: Admin, test_class: str, tmp_path: Path) -> None:
    _config(tmp_path, every_s=0.4)
    env = {**os.environ, "LEDGER_DATABASE_URL": db_url, "LEDGER_ROLE_PREFIX": TEST_PREFIX,
           "LEDGER_CONFIG": str(tmp_path / "ledger.toml")}
    procs = [subprocess.Popen([sys.executable, "-m", "ledger", "sensor", "run"], env=env,
                              stdout=subprocess.DEVNULL, stderr=open(tmp_path / f"s{i}.log", "wb"))
             for i in range(2)]
    logs = [tmp_path / f"s{i}.log" for i in range(2)]

    def contended() -> bool:
        # Which process wins a tick is a race; what must hold is that both
        # were there for it: each either observed a tick or was refused one.
        texts = [log.read_text() for log in logs]
        return (all('"event": "observed"' in t or "tick owned by another" in t for t in texts)
                and any("tick owned by another" in t for t in texts))

    try:
        await eventually(contended, timeout=20, what="both sensor processes contending for ticks")
        await eventually(lambda: admin.execute("SELECT count(*) AS n FROM ledger.observation").fetchone()["n"] >= 6,
                         timeout=20, what="six observed ticks")
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        codes = [p.wait(timeout=20) for p in procs]
    assert codes == [0, 0]
    rows = admin.execute("SELECT tick, count(*) AS n FROM ledger.observation GROUP BY tick").fetchall()
    assert all(r["n"] == 1 for r in rows) and all(r["tick"] is not None for r in rows)
    claims = admin.execute("SELECT claimed_by, count(*) AS n FROM ledger.sensor_tick GROUP BY claimed_by").fetchall()
    assert sum(c["n"] for c in claims) == len(rows)
    runs = (tmp_path / "markers" / "target.runs").read_text().count("run")
    assert runs == len(rows), "a tick was checked twice"


@pytest.mark.rollback  # only SQL: a transaction rolled back after the test
@pytest.mark.cells
async def test_a_restart_does_not_replay_missed_ticks(actors: Actors, admin: Admin, test_class: str, tmp_path: Path) -> None:
    cfg, _ = _config(tmp_path, cron="0 3 * * *")  # nightly: the due tick is in the past
    # Registered two days ago: last night's tick was missed, not from before its time.
    admin.execute("INSERT INTO ledger.sensor (name, registered_at, registered_by) "
                  "VALUES ('tests', now() - interval '2 days', 'test')")
    for _ in range(2):  # start, stop, start again
        sensor = Sensor(await actors("sensor"), cfg.sensors["tests"], "sensor-x")
        stop = asyncio.Event()
        task = asyncio.create_task(sensor.run(stop))
        await eventually(lambda: admin.execute("SELECT count(*) AS n FROM ledger.sensor_tick").fetchone()["n"] == 1,
                         what="the missed nightly tick to be claimed")
        stop.set()
        await task
    rows = admin.execute("SELECT tick FROM ledger.observation").fetchall()
    assert len(rows) == 1
    assert rows[0]["tick"] == latest_due_tick(trigger_for(cfg.sensors["tests"]), datetime.now(timezone.utc))


@pytest.mark.rollback  # only SQL: a transaction rolled back after the test
async def test_only_an_observation_started_after_promotion_confirms(actors: Actors, admin: Admin, promoting: str) -> None:
    d = Driver(actors, PROMOTING_CLASS)
    sensor = await actors("sensor")
    cid = await d.verified()
    key = (await Reads(sensor.executor).campaign(cid)).objective_key
    # Before promotion nothing confirms, whenever it started.
    early = await sensor.record_observation("s", key, "target-1", "green",
                                            started_at=datetime.now(timezone.utc))
    assert early.effect == "recorded"
    before_promotion = datetime.now(timezone.utc)
    dispatcher = await actors("dispatcher")
    claim = await dispatcher.claim_side_effect("d")
    await dispatcher.complete_side_effect(claim.side_effect_id, claim.claim_token, "done")
    promoted_at = (await Reads(sensor.executor).campaign(cid)).promoted_at
    assert promoted_at is not None and promoted_at > before_promotion
    # Started before the promotion (finished after): does not confirm.
    stale = await sensor.record_observation("s", key, "target-1", "green", started_at=before_promotion)
    assert stale.effect == "recorded"
    assert (await Reads(sensor.executor).campaign(cid)).state == "verified"
    fresh = await sensor.record_observation("s", key, "target-1", "green",
                                            started_at=datetime.now(timezone.utc))
    assert fresh.effect == "confirmed"
    assert (await Reads(sensor.executor).campaign(cid)).state == "confirmed"


@pytest.mark.rollback  # only SQL: a transaction rolled back after the test
async def test_a_red_observation_after_promotion_regresses(actors: Actors, admin: Admin, promoting: str) -> None:
    d = Driver(actors, PROMOTING_CLASS)
    sensor = await actors("sensor")
    cid = await d.promoted()
    key = (await Reads(sensor.executor).campaign(cid)).objective_key
    red = await sensor.record_observation("s", key, "target-1", "red", started_at=datetime.now(timezone.utc),
                                          class_=PROMOTING_CLASS)
    assert red.effect == "regressed" and red.campaign_id == cid
    campaign = await Reads(sensor.executor).campaign(cid)
    assert campaign.state == "ready" and campaign.promoted_at is None
    assert admin.execute("SELECT count(*) AS n FROM ledger.campaign").fetchone()["n"] == 1


# --- sensor hygiene ---------------------------------------------------------------


@pytest.mark.rollback  # only SQL: a transaction rolled back after the test
async def test_a_new_nightly_sensor_waits_for_its_next_tick(actors: Actors, admin: Admin, test_class: str, tmp_path: Path) -> None:
    """A brand-new `0 3 * * *` sensor used to fire at once for last night's 03:00."""
    cfg, _ = _config(tmp_path, cron="0 3 * * *")
    sensor = Sensor(await actors("sensor"), cfg.sensors["tests"], "sensor-new")
    stop = asyncio.Event()
    started = datetime.now(timezone.utc)
    task = asyncio.create_task(sensor.run(stop))
    try:
        await eventually(lambda: sensor.waiting_for is not None, what="the sensor to wait for a tick")
    finally:
        stop.set()
        await task
    assert sensor.waiting_for == next_tick(trigger_for(cfg.sensors["tests"]), started)
    assert admin.execute("SELECT count(*) AS n FROM ledger.sensor_tick").fetchone()["n"] == 0
    assert admin.execute("SELECT count(*) AS n FROM ledger.observation").fetchone()["n"] == 0
    [row] = admin.execute("SELECT name, registered_by FROM ledger.sensor").fetchall()
    assert row == {"name": "tests", "registered_by": "sensor-new"}
    # Registered once: a second process keeps the first registration.
    again = await (await actors("sensor")).register_sensor("tests", "sensor-other")
    assert again == admin.execute("SELECT registered_at FROM ledger.sensor").fetchone()["registered_at"]


@pytest.mark.rollback  # only SQL: a transaction rolled back after the test
def test_a_sensor_must_watch_its_class_repository(tmp_path: Path) -> None:
    """A `beta#main` sensor of an alpha class had its campaign attempted on, and
    promoted onto, alpha."""
    from ledger.errors import ConfigError

    def config(target: str):
        return parse_config({
            "classes": {"alpha": {"repository": str(tmp_path / "alpha.git"), "attempt_command": ["x"],
                                  "promote_to": "refs/heads/release"}},
            "sensors": {"s": {"target": target, "every_s": 60, "command": ["true"], "class": "alpha"}}})
    for fine in ("alpha#main", "alpha", f"{tmp_path / 'alpha.git'}#main", "alpha#release",
                 "alpha#refs/heads/main"):
        config(fine)
    with pytest.raises(ConfigError, match="sensors.s.target: target 'beta#main' is not in the repository of class alpha"):
        config("beta#main")
    with pytest.raises(ConfigError, match="names ref 'develop'"):
        config("alpha#develop")


@pytest.mark.rollback  # only SQL: a transaction rolled back after the test
async def test_an_exhausted_campaign_whose_target_turns_green_is_dismissed(actors: Actors, admin: Admin, test_class: str) -> None:
    sensor, worker = await actors("sensor"), await actors("worker")
    red = await sensor.record_observation("s", "broken", "target-1", "red",
                                          datetime.now(timezone.utc), class_=test_class)
    cid = red.campaign_id
    assert cid is not None
    for _ in range(3):
        claim = await worker.claim_campaign("w", [test_class])
        assert claim is not None and claim.campaign_id == cid
        await worker.fail_attempt(cid, claim.generation, "no luck")
    assert (await Reads(sensor.executor).campaign(cid)).state == "exhausted"
    still_red = await sensor.record_observation("s", "broken", "target-1", "red",
                                                datetime.now(timezone.utc), class_=test_class)
    assert (still_red.effect, (await Reads(sensor.executor).campaign(cid)).state) == ("recorded", "exhausted")
    green = await sensor.record_observation("s", "broken", "target-1", "green", datetime.now(timezone.utc))
    assert (green.effect, green.campaign_id) == ("dismissed", cid)
    campaign = await Reads(sensor.executor).campaign(cid)
    assert campaign.state == "dismissed" and campaign.closed_at is not None
    last = admin.execute("SELECT actor, payload FROM ledger.campaign_event WHERE campaign_id = %s "
                         "AND type = 'transition' ORDER BY seq DESC LIMIT 1", (cid,)).fetchone()
    assert (last["actor"], last["payload"]["transition"], last["payload"]["from"]) == ("s", "dismiss", "exhausted")


@pytest.mark.rollback  # only SQL: a transaction rolled back after the test
@pytest.mark.cells
async def test_a_pytest_sensor_names_the_failing_tests(tmp_path: Path) -> None:
    """What becomes a campaign's baseline: run in a cell on an export of the
    target's ref of a bare repository, or -- a sensor opted out of the cell --
    through the shipped wrapper that exports it itself."""
    from ledger.demo import examples_dir
    from ledger.roles.sensors import check

    work, bare = tmp_path / "work", tmp_path / "app.git"
    (work / "tests").mkdir(parents=True)
    (work / "tests" / "test_app.py").write_text(
        "import pytest\n\ndef test_ok():\n    pass\n\ndef test_broken():\n    assert 1 == 2\n\n"
        "@pytest.mark.skip('later')\ndef test_later():\n    pass\n")
    git = ["git", "-C", str(work), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q", "-b", "main", str(work)], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "x"], check=True)
    subprocess.run(["git", "clone", "-q", "--bare", str(work), str(bare)], check=True)
    quick = ["PYTEST_DISABLE_PLUGIN_AUTOLOAD=1", "PYTHONDONTWRITEBYTECODE=1"]
    direct = parse_config({"sensors": {"s": {
        "target": "app#main", "every_s": 60, "class": "c", "environment": quick,
        "command": [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]}}}).sensors["s"]
    wrapped = parse_config({"sensors": {"s": {
        "target": "app#main", "every_s": 60, "class": "c", "environment": quick,
        "cell": {"sandbox": False},
        "command": [sys.executable, str(examples_dir() / "run_tests_at.py"), str(bare), "main",
                    "--pytest"]}}}).sensors["s"]
    observed: tuple[tuple[Any, dict[str, Any]], ...] = (
        (direct, {"repository": str(bare), "ref": "main"}), (wrapped, {}))
    for sensor, observes in observed:
        reading = await check(sensor, **observes)
        assert reading.status == "red"
        tests = reading.details["tests"]
        assert {k: tests[k] for k in ("collected", "failed", "skipped", "passed")} == {
            "collected": 3, "failed": ["tests/test_app.py::test_broken"], "skipped": 1, "passed": 1}
        if sensor is direct:  # by the judge: the passed node ids a confirmation is checked against
            assert tests["judged"] is True and tests["passed_ids"] == ["tests/test_app.py::test_ok"]
        else:  # a wrapper's JUnit report: a baseline, never a confirmation
            assert "judged" not in tests and "passed_ids" not in tests
        assert reading.details["command"] == sensor.command
