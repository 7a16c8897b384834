"""Ledger on a real Patroni cluster (``ledger.ops.patroni``: Debian's ``patroni``
and ``etcd-server``, one etcd member, two PostgreSQL members on loopback).

A real ``ledger worker`` and the test's own opener both connect with the
multi-host URL (``target_session_attrs=read-write``). Through a planned
switchover (``patronictl switchover``) and then an unplanned failover (SIGKILL
of the leader's postmaster), every open the opener was told had committed is
on the new leader (read from that server alone, not through the URL), the
worker stays up and claims there by itself, and the journals are gap-free.
Skips, saying why, where Patroni or etcd is not installed."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx
import psycopg
import pytest

from conftest import TEST_PREFIX
from drive import eventually
from ledger import Database, Kernel
from ledger.config import load_config
from ledger.db import migrations
from ledger.db.embedded import create_database, with_database
from ledger.drills.paths import scripted_attempt
from ledger.errors import LedgerError
from ledger.ops.patroni import Member, PatroniCluster, missing

pytestmark = [pytest.mark.anyio, pytest.mark.slow, pytest.mark.cells,
              pytest.mark.skipif(missing() is not None, reason=f"no Patroni cluster here: {missing()}")]

DB = "ledger_patroni"


def journal_max_seqs(url: str) -> dict[int, int]:
    with psycopg.connect(url) as conn:
        return dict(conn.execute("SELECT campaign_id, max(seq) FROM ledger.campaign_event GROUP BY 1").fetchall())


def objectives_on(member: Member) -> set[str]:
    """The objectives that server itself holds (no multi-host URL: that very server)."""
    with psycopg.connect(with_database(member.url, DB)) as conn:
        assert conn.execute("SELECT NOT pg_is_in_recovery()").fetchone() == (True,)
        return {r[0] for r in conn.execute("SELECT objective_key FROM ledger.campaign").fetchall()}


def claims_since(member: Member, when: datetime) -> int:
    with psycopg.connect(with_database(member.url, DB)) as conn:
        row = conn.execute("SELECT count(*) FROM ledger.campaign_event WHERE type = 'transition' "
                           "AND payload->>'transition' = 'claim' AND created_at > %s", (when,)).fetchone()
        return int(row[0]) if row else 0


async def test_ledger_follows_the_leader_through_a_switchover_and_a_failover(tmp_path: Path) -> None:
    cluster = PatroniCluster(Path(tempfile.mkdtemp(prefix="ledger-test-patroni-")) / "cluster")
    worker = None
    try:
        # Ledger's settings are the cluster's (docs/deployment.md: "High availability with Patroni")
        config = httpx.get(f"{cluster.members[0].rest}/config", timeout=5).json()
        assert config["synchronous_mode"] is True
        assert config["maximum_lag_on_failover"] == 0
        assert config["primary_start_timeout"] == 0
        leader, standby = cluster.wait_healthy()
        with psycopg.connect(leader.url) as conn:
            names = conn.execute("SHOW synchronous_standby_names").fetchone()
        assert names is not None and standby.name in names[0]

        url = create_database(cluster.url, DB)
        migrations.upgrade(url, TEST_PREFIX)
        repo = tmp_path / "repo"
        subprocess.run(["git", "init", "-q", "-b", "main", str(repo)], check=True)
        (repo / "README").write_text("x\n")
        git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
        subprocess.run([*git, "add", "."], check=True)
        subprocess.run([*git, "commit", "-qm", "x"], check=True)
        plan = tmp_path / "plan.json"
        plan.write_text(json.dumps({"default": [["write", "fix.txt", "good"], ["exit", 0]]}))
        ledger_toml = tmp_path / "ledger.toml"
        ledger_toml.write_text(f"""
[classes.work]
repository = "{repo}"
attempt_command = ["{sys.executable}", "{scripted_attempt()}", "{plan}"]
lease_s = 10
heartbeat_s = 1
backoff = {{ base_s = 0, jitter = 0 }}
""")
        database = Database(url, role_prefix=TEST_PREFIX)
        async with database.session("operator") as s:
            await Kernel(s).register_class("work", **load_config(ledger_toml).campaign_class("work").registration())

        log = tmp_path / "worker.log"
        env = {**os.environ, "LEDGER_DATABASE_URL": url, "LEDGER_ROLE_PREFIX": TEST_PREFIX,
               "LEDGER_DATA_DIR": str(tmp_path / "data"), "LEDGER_CONFIG": str(ledger_toml), "NO_COLOR": "1"}
        worker = subprocess.Popen([sys.executable, "-m", "ledger", "worker", "--poll", "0.5", "--concurrency", "2"],
                                  env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT)

        acknowledged: list[str] = []
        stop = asyncio.Event()

        async def open_stream() -> None:
            """Open an objective every 50 ms through the outage; only an
            acknowledged open counts (each retried until it is)."""
            async with database.session("sensor") as s:
                kernel = Kernel(s)
                n = 0
                while not stop.is_set():
                    n += 1
                    while True:
                        try:
                            await kernel.open_campaign("work", f"objective-{n}", "repo")
                            break
                        except LedgerError:
                            await asyncio.sleep(0.1)  # the outage's pace; the call retried inside already
                    acknowledged.append(f"objective-{n}")
                    await asyncio.sleep(0.05)

        opener = asyncio.create_task(open_stream())
        try:
            await eventually(lambda: claims_since(leader, datetime(2000, 1, 1, tzinfo=UTC)) >= 3, timeout=60,
                             what="the worker to claim on the first leader")
            for kind in ("switchover", "failover"):
                leader, standby = await asyncio.to_thread(cluster.wait_healthy)
                before = journal_max_seqs(with_database(leader.url, DB))
                fault_at = datetime.now(UTC)
                if kind == "switchover":
                    await asyncio.to_thread(cluster.switchover, leader, standby)
                else:
                    assert await asyncio.to_thread(cluster.kill_postmaster, leader) > 1
                await eventually(lambda: cluster.leader() is standby, timeout=90, interval=0.1,
                                 what=f"{standby.name} to lead after the {kind}")
                acked = len(acknowledged)
                await eventually(lambda: len(acknowledged) > acked + 3, timeout=60,
                                 what=f"opens to be acknowledged again after the {kind}")
                # everything acknowledged so far is on the new leader itself
                assert set(acknowledged[:acked]) <= objectives_on(standby), kind
                await eventually(lambda: claims_since(standby, fault_at) >= 1, timeout=60,
                                 what=f"the worker to claim on the new leader after the {kind}")
                assert worker.poll() is None, log.read_text()[-3000:]
                after = journal_max_seqs(with_database(standby.url, DB))
                short = [cid for cid, seq in before.items() if after.get(cid, 0) < seq]
                assert not short, f"journals short after the {kind}: {short}"
        finally:
            stop.set()
            await opener
        assert set(acknowledged) <= objectives_on(standby)
        with psycopg.connect(with_database(standby.url, DB)) as conn:
            gaps = conn.execute("SELECT campaign_id FROM ledger.campaign_event GROUP BY 1 "
                                "HAVING count(*) <> max(seq) OR min(seq) <> 1").fetchall()
            doubled = conn.execute("SELECT objective_key FROM ledger.campaign GROUP BY 1 "
                                   "HAVING count(*) > 1").fetchall()
        assert not gaps and not doubled
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=30) == 0, log.read_text()[-3000:]
    finally:
        if worker is not None and worker.poll() is None:
            worker.kill()
            worker.wait()
        started = time.monotonic()
        cluster.close()
        assert time.monotonic() - started < 60
