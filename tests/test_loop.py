"""The closed loop (README "Quickstart", `ledger demo`), as a test: detection to confirmed closure with
a real sensor, worker, verifier and dispatcher, through the demo's wiring."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from conftest import TEST_PREFIX
from ledger.demo import run_demo
from ledger.settings import Settings

pytestmark = pytest.mark.anyio


async def test_the_loop_closes_with_the_exact_transitions(db_url: str, admin, tmp_path: Path) -> None:
    out = io.StringIO()
    settings = Settings(database_url=db_url, role_prefix=TEST_PREFIX, data_dir=tmp_path)
    code = await run_demo(settings, Console(file=out, width=200), sensor_every_s=1.0)
    assert code == 0, out.getvalue()
    [campaign] = admin.execute("SELECT id, state, promoted_sha FROM ledger.campaign").fetchall()
    transitions = [r["t"] for r in admin.execute(
        "SELECT payload->>'transition' AS t FROM ledger.campaign_event WHERE campaign_id = %s "
        "AND type = 'transition' ORDER BY seq", (campaign["id"],))]
    assert transitions == ["open", "claim", "record_attempt", "reject", "claim", "record_attempt",
                           "accept", "confirm"]
    attempts = admin.execute("SELECT attempt_no, outcome, verdict, fingerprint, candidate_sha FROM ledger.attempt "
                             "ORDER BY attempt_no").fetchall()
    assert [(a["outcome"], a["verdict"]) for a in attempts] == [("attempted", "rejected"),
                                                                ("attempted", "accepted")]
    assert attempts[0]["fingerprint"] != attempts[1]["fingerprint"]
    effect = admin.execute("SELECT kind, state, result FROM ledger.side_effect").fetchone()
    assert (effect["kind"], effect["state"]) == ("git.update_ref", "done")
    # What landed is the verified candidate's tree, with the verdict in its message.
    assert effect["result"]["read_back"] == effect["result"]["landed"] == campaign["promoted_sha"]
    assert effect["result"]["candidate"] == attempts[1]["candidate_sha"]
    # The confirming observation started after the promotion; the first one opened it.
    observations = admin.execute("SELECT status, effect FROM ledger.observation ORDER BY id").fetchall()
    assert observations[0] == {"status": "red", "effect": "opened"}
    assert observations[-1] == {"status": "green", "effect": "confirmed"}
    text = out.getvalue()
    for step in ("opened", "rejected", "verified", "promoted", "confirmed"):
        assert step in text


def test_ledger_demo_exits_zero_and_leaves_nothing_running(db_url: str, tmp_path: Path) -> None:
    env = {**os.environ, "LEDGER_DATABASE_URL": db_url, "LEDGER_ROLE_PREFIX": TEST_PREFIX,
           "LEDGER_DATA_DIR": str(tmp_path), "NO_COLOR": "1"}
    proc = subprocess.run([sys.executable, "-m", "ledger", "demo"], env=env, capture_output=True,
                          text=True, timeout=90)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "is confirmed" in proc.stdout
    leftovers = subprocess.run(["pgrep", "-f", "ledger-demo-"], capture_output=True, text=True).stdout
    assert leftovers.strip() == ""


def test_two_demos_on_one_data_directory_keep_their_own_databases(tmp_path: Path) -> None:
    """Each demo run on the embedded server has a database of its own and drops
    it when it ends: a second ``ledger demo`` on the same data directory used to
    drop the first one's database under it. A database left by a
    killed run is swept by the next."""
    import psycopg

    from ledger.db.embedded import create_database, discard, server_url
    from ledger.demo import DEMO_DATABASE, demo_database_name, prepare_database

    data = tmp_path / "data"
    admin = server_url(data, cleanup="delete")

    def demo_databases() -> list[str]:
        with psycopg.connect(admin) as conn:
            return [r[0] for r in conn.execute(
                "SELECT datname FROM pg_database WHERE datname LIKE %s ORDER BY 1",
                (f"{DEMO_DATABASE}%",))]
    try:
        mine, drop = prepare_database(Settings(database_url=None, data_dir=data,
                                               role_prefix=TEST_PREFIX))
        create_database(admin, f"{DEMO_DATABASE}_999999999")  # no pid is that large: a dead run's
        with psycopg.connect(mine.url, autocommit=True) as held:
            held.execute("CREATE TABLE public.still_here ()")
            env = {**os.environ, "LEDGER_DATA_DIR": str(data), "LEDGER_ROLE_PREFIX": TEST_PREFIX,
                   "NO_COLOR": "1"}
            env.pop("LEDGER_DATABASE_URL", None)
            other = subprocess.run([sys.executable, "-m", "ledger", "demo"], env=env,
                                   capture_output=True, text=True, timeout=120)
            assert other.returncode == 0, other.stdout + other.stderr
            # This run's database and its connection outlived the other run.
            assert held.execute("SELECT to_regclass('public.still_here') IS NOT NULL").fetchone()[0]
        assert demo_databases() == [demo_database_name()]  # the other's dropped, the dead one's swept
        drop()
        assert demo_databases() == []
    finally:
        discard(data)


@pytest.mark.cells
def test_ledger_run_closes_the_loop_and_stops_on_sigterm(db_url: str, admin, tmp_path: Path) -> None:
    import json
    import signal
    import time

    from ledger.demo import DEMO_CLASS, demo_config, make_repository

    repository = make_repository(tmp_path)
    cfg = demo_config(repository, sensor_every_s=1.0)
    cls, sensor = cfg.classes[DEMO_CLASS], cfg.sensors["unit-tests"]
    (tmp_path / "ledger.toml").write_text(f"""
[classes.{DEMO_CLASS}]
repository = {json.dumps(cls.repository)}
attempt_command = {json.dumps(cls.attempt_command)}
lease_s = 10
heartbeat_s = 2
backoff = {{ base_s = 0, jitter = 0 }}
acceptance = {{ commands = {json.dumps(cls.acceptance.commands)} }}
promote_to = "refs/heads/main"

[sensors.unit-tests]
target = {json.dumps(sensor.target)}
every_s = 1
command = {json.dumps(sensor.command)}
class = "{DEMO_CLASS}"
""")
    env = {**os.environ, "LEDGER_DATABASE_URL": db_url, "LEDGER_ROLE_PREFIX": TEST_PREFIX,
           "LEDGER_DATA_DIR": str(tmp_path / "data"), "LEDGER_CONFIG": str(tmp_path / "ledger.toml")}
    subprocess.run([sys.executable, "-m", "ledger", "classes", "sync"], env=env, check=True,
                   capture_output=True)
    proc = subprocess.Popen([sys.executable, "-m", "ledger", "run", "--poll", "0.5"], env=env,
                            stdout=subprocess.DEVNULL, stderr=open(tmp_path / "run.log", "wb"))
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            rows = admin.execute("SELECT state FROM ledger.campaign").fetchall()
            if rows and rows[0]["state"] == "confirmed":
                break
            time.sleep(0.2)  # polling the condition
        assert [r["state"] for r in admin.execute("SELECT state FROM ledger.campaign")] == ["confirmed"], \
            (tmp_path / "run.log").read_text()[-3000:]
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=60)
    assert code == 0
