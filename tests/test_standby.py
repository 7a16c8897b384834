"""A real streaming standby (``ledger.ops.cluster.Replicated``): every way of
meeting a read-only server is classified ``ReadOnly`` (an ``Unavailable``),
and a worker pointed at a standby waits -- logging it, with jittered backoff --
instead of exiting, then works once the standby is promoted."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import TEST_PREFIX
from drive import eventually
from ledger import Database, Kernel, errors
from ledger.config import load_config
from ledger.db import migrations
from ledger.db.embedded import create_database, with_database
from ledger.drills.paths import scripted_attempt
from ledger.ops.cluster import Replicated

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

DB = "ledger_standby"


def pair_root() -> Path:
    """Outside pytest's base directory, whose permissions pytest tightens
    again (the servers run as the embedded package's own user when root)."""
    return Path(tempfile.mkdtemp(prefix="ledger-standby-"))


@pytest.fixture(scope="module")
def pair() -> Iterator[Replicated]:
    p = Replicated(pair_root())
    url = create_database(p.primary.url, DB)
    migrations.upgrade(url, TEST_PREFIX)
    p.wait_replayed()
    yield p
    p.close()


def standby_db(pair: Replicated) -> Database:
    return Database(with_database(pair.standby.url, DB), role_prefix=TEST_PREFIX)


def test_a_write_on_a_standby_is_read_only(pair: Replicated) -> None:
    """A call that writes on a standby fails with SQLSTATE 25006: classified
    ``ReadOnly``, an ``Unavailable`` (so callers wait and retry)."""
    import psycopg

    from ledger.db.database import _translate

    with standby_db(pair).connect_sync("operator") as conn:
        with pytest.raises(psycopg.Error) as raised:
            conn.execute("SELECT ledger_api.register_class('on-the-standby')")
    error = _translate(raised.value)
    assert isinstance(error, errors.ReadOnly) and isinstance(error, errors.Unavailable)
    assert error.sqlstate == "25006"
    assert error.message.startswith("Unavailable: read-only: ")


async def test_a_session_on_a_standby_waits_as_read_only(pair: Replicated) -> None:
    """Opening a runtime session on a standby is the start-up wait, then ReadOnly."""
    with pytest.raises(errors.ReadOnly):
        await standby_db(pair).session("sensor").open(wait_for_database_s=0.5)


async def test_a_connection_to_a_standby_is_refused_as_read_only(pair: Replicated) -> None:
    """A dedicated connection (the hub's LISTEN, the start-up check) learns at
    connect that the server is a standby, before LISTEN or any write."""
    with pytest.raises(errors.ReadOnly, match="is a standby"):
        await standby_db(pair).connect("worker")


async def test_a_reader_may_read_from_a_standby(pair: Replicated) -> None:
    """Reads need no primary: a reader login of its own (the dashboard's) may
    name a replica. (Without one, the reader shares the URL of every role and
    is refused a standby like them.)"""
    url = with_database(pair.standby.url, DB)
    with pytest.raises(errors.ReadOnly):
        await Database(url, role_prefix=TEST_PREFIX).connect("reader")
    conn = await Database(url, role_prefix=TEST_PREFIX, role_urls={"reader": url}).connect("reader")
    try:
        assert (await (await conn.execute("SELECT pg_is_in_recovery() AS r")).fetchone())["r"] is True
    finally:
        await conn.close()


async def test_only_standbys_behind_read_write_attrs_is_read_only(pair: Replicated) -> None:
    """libpq's target_session_attrs=read-write finding only the standby (no
    SQLSTATE, its own words) is ReadOnly too -- not a generic failure."""
    url = with_database(pair.standby.url, DB) + " target_session_attrs=read-write"
    with pytest.raises(errors.ReadOnly, match="no writable server"):
        await Database(url, role_prefix=TEST_PREFIX).connect("worker")
    # and the start-up wait treats it as worth waiting for, then gives up saying so
    with pytest.raises(errors.ReadOnly):
        await Database(url, role_prefix=TEST_PREFIX).wait_until_reachable("worker", 0.5)


async def test_the_primary_is_still_writable(pair: Replicated) -> None:
    """The check refuses standbys only: the multi-host URL finds the primary."""
    conn = await Database(with_database(pair.url, DB), role_prefix=TEST_PREFIX).connect("worker")
    await conn.close()


@pytest.mark.parametrize("listen", ["--listen", "--no-listen"])
@pytest.mark.cells
def test_a_worker_on_a_standby_waits_then_works_once_promoted(tmp_path: Path, listen: str) -> None:
    """The issue's finding: a worker given a standby exited with a generic
    error. Now it logs ``ReadOnly`` waits with jittered delays, stays up, and
    claims work as soon as the standby becomes the primary. (The hub logs
    its first try and every 30th; its waits are jittered, see tests/test_hub.)"""
    import anyio

    pair = Replicated(pair_root())
    worker = None
    try:
        primary_url = create_database(pair.primary.url, DB)
        migrations.upgrade(primary_url, TEST_PREFIX)
        pair.wait_replayed()
        repo = tmp_path / "repo"
        subprocess.run(["git", "init", "-q", "-b", "main", str(repo)], check=True)
        (repo / "README").write_text("x\n")
        git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
        subprocess.run([*git, "add", "."], check=True)
        subprocess.run([*git, "commit", "-qm", "x"], check=True)
        plan = tmp_path / "plan.json"
        plan.write_text(json.dumps({"default": [["write", "fix.txt", "good"], ["exit", 0]]}))
        config = tmp_path / "ledger.toml"
        config.write_text(f"""
[classes.work]
repository = "{repo}"
attempt_command = ["{sys.executable}", "{scripted_attempt()}", "{plan}"]
lease_s = 10
heartbeat_s = 1
backoff = {{ base_s = 0, jitter = 0 }}
""")
        primary = Database(primary_url, role_prefix=TEST_PREFIX)

        async def register() -> None:
            async with primary.session("operator") as s:
                await Kernel(s).register_class("work", **load_config(config).campaign_class("work").registration())
        anyio.run(register)
        pair.wait_replayed()

        log = tmp_path / "worker.log"
        standby_url = with_database(pair.standby.url, DB)
        env = {**os.environ, "LEDGER_DATABASE_URL": standby_url, "LEDGER_ROLE_PREFIX": TEST_PREFIX,
               "LEDGER_DATA_DIR": str(tmp_path / "data"), "LEDGER_CONFIG": str(config), "NO_COLOR": "1"}
        worker = subprocess.Popen([sys.executable, "-m", "ledger", "worker", "--poll", "0.5", listen], env=env,
                                  stdout=log.open("wb"), stderr=subprocess.STDOUT)

        def waits() -> list[dict]:
            """The start-up waits logged so far (the hub's LISTEN connection is
            the first to meet the standby; the pools' start-up check the next)."""
            entries = []
            for line in log.read_text().splitlines():
                try:
                    entry = json.loads(line)
                except ValueError:
                    continue
                if entry.get("event") in ("waiting for the database", "hub cannot connect"):
                    entries.append(entry)
            return entries

        async def watch() -> None:
            await eventually(lambda: any(e["tries"] > 1 for e in waits()), timeout=90,
                             what="the worker to try again and again")
        anyio.run(watch)
        assert worker.poll() is None, log.read_text()[-3000:]
        seen = waits()
        assert all(e["error"].startswith("Unavailable: read-only: ") for e in seen), seen
        assert "worker started" not in log.read_text()

        # the standby becomes the primary: the same URL now takes writes
        pair.primary.kill()
        pair.standby.promote()
        promoted = Database(standby_url, role_prefix=TEST_PREFIX)

        async def work() -> None:
            async with promoted.session("sensor") as s:
                cid = (await Kernel(s).open_campaign("work", "after-promotion", "repo")).campaign_id
            with promoted.connect_sync(None) as admin:
                def attempted() -> bool:
                    row = admin.execute("SELECT outcome FROM ledger.attempt WHERE campaign_id = %s",
                                        (cid,)).fetchone()
                    return row is not None and row["outcome"] == "attempted"
                await eventually(attempted, timeout=60, what="the worker to claim and attempt after promotion")
        anyio.run(work)
        assert worker.poll() is None
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=30) == 0
    finally:
        if worker is not None and worker.poll() is None:
            worker.kill()
        pair.close()
