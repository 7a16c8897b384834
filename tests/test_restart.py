"""A real PostgreSQL crashed and restarted (``pg_ctl stop -m immediate``, then
crash recovery) under every service at once, each in the middle of its work:
a worker mid-attempt, a verifier mid-check, a dispatcher mid-pass, and a
worker started while the server is down. No process exits, no attempt is
lost, and each service's first successful call comes within 2 s of the
server starting again."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import psycopg
import pytest

from conftest import TEST_PREFIX
from drive import eventually, scaled
from ledger import Database, Kernel
from ledger.config import load_config
from ledger.db import migrations
from ledger.db.embedded import create_database
from ledger.drills.paths import scripted_attempt
from ledger.ops.cluster import Cluster

pytestmark = [pytest.mark.anyio, pytest.mark.slow, pytest.mark.cells]

CLASS = "work"
SERVICES = ("worker", "verifier", "dispatcher")


class Hook(BaseHTTPRequestHandler):
    """An HTTP target that holds each request until released."""

    received = threading.Event()
    release = threading.Event()

    def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        Hook.received.set()
        Hook.release.wait(60)
        self.send_response(200)
        self.end_headers()

    def do_GET(self) -> None:  # noqa: N802
        self.send_response(404)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    # Not under tmp_path: the server runs as another user, and every pytest
    # session started on the machine meanwhile resets /tmp/pytest-of-<user> to
    # 0700, after which pg_ctl could no longer reach the data directory.
    c = Cluster(Path(tempfile.mkdtemp(prefix="ledger-test-cluster-")))
    yield c
    c.close()


@pytest.fixture
def hook() -> Iterator[str]:
    Hook.received.clear()
    Hook.release.clear()
    server = ThreadingHTTPServer(("127.0.0.1", 0), Hook)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/hook"
    Hook.release.set()
    server.shutdown()


class FirstCalls(threading.Thread):
    """From before the server starts: connect every 10 ms until it accepts
    connections (that moment, by its clock, is ``accepted``), then sample
    pg_stat_activity every 20 ms for the first completed call of each
    application. (A sample shows an application's latest call, never earlier
    than its first: each figure is an upper bound.)"""

    def __init__(self, admin_url: str, apps: list[str], watch_s: float):
        super().__init__(daemon=True)
        self.admin_url, self.apps, self.watch_s = admin_url, apps, watch_s
        self.accepted: datetime | None = None
        self.first: dict[str, datetime] = {}

    def run(self) -> None:
        conn = None
        while conn is None:
            try:
                conn = psycopg.connect(self.admin_url, autocommit=True, connect_timeout=1)
            except psycopg.OperationalError:
                time.sleep(0.01)  # the probe's own interval, while the server is down
        self.accepted = conn.execute("SELECT clock_timestamp()").fetchone()[0]
        deadline = time.monotonic() + self.watch_s
        while time.monotonic() < deadline and len(self.first) < len(self.apps):
            for app, started in conn.execute(
                    "SELECT application_name, query_start FROM pg_stat_activity "
                    "WHERE application_name = ANY(%s) AND state = 'idle' AND query <> '' "
                    "AND query NOT LIKE 'SET %%' AND query NOT LIKE 'LISTEN%%' "
                    "AND query_start >= pg_postmaster_start_time()", (self.apps,)).fetchall():
                if app not in self.first or started < self.first[app]:
                    self.first[app] = started
            time.sleep(0.02)  # the sampling interval
        conn.close()

    def seconds(self) -> dict[str, float]:
        """Per application: seconds from the server accepting connections to its first call."""
        assert self.accepted is not None
        return {app: max((t - self.accepted).total_seconds(), 0.0) for app, t in self.first.items()}


async def test_every_service_survives_a_crash_restart_mid_work(tmp_path: Path, cluster: Cluster, hook: str) -> None:
    url = create_database(cluster.url, "ledger_restart")
    migrations.upgrade(url, TEST_PREFIX)
    db = Database(url, role_prefix=TEST_PREFIX)

    repo = tmp_path / "repo"
    subprocess.run(["git", "init", "-q", "-b", "main", str(repo)], check=True)
    (repo / "README").write_text("x\n")
    subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", "add", "."], check=True)
    subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x"],
                   check=True)
    markers = tmp_path / "markers"  # the plan and markers: the one host directory cells may write
    markers.mkdir()
    plan = markers / "plan.json"
    plan.write_text(json.dumps({"default": [["write", "fix.txt", "good"], ["block"], ["exit", 0]]}))
    check = (f"import pathlib, time; root = pathlib.Path({str(markers)!r}); "
             "(root / 'verify-started').write_text('x'); "
             "[time.sleep(0.05) for _ in iter(lambda: (root / 'verify-release').exists(), True)]")
    config = tmp_path / "ledger.toml"
    config.write_text(f"""
[classes.{CLASS}]
repository = "{repo}"
attempt_command = ["{sys.executable}", "{scripted_attempt()}", "{plan}"]
lease_s = 10
heartbeat_s = 1
backoff = {{ base_s = 0, jitter = 0 }}
acceptance = {{ commands = [["{sys.executable}", "-c", {json.dumps(check)}]], timeout_s = 120, cell = {{ writable = ["{markers}"] }} }}
cell = {{ writable = ["{markers}"] }}
""")
    kernels = {a: Kernel(await db.session(a).open()) for a in ("operator", "sensor", "worker")}
    await kernels["operator"].register_class(CLASS, **load_config(config).campaign_class(CLASS).registration())
    await kernels["operator"].register_class("notify", lease_seconds=120,
                                             authority={"worker": {"hosts": ["127.0.0.1"]}})

    env = {**os.environ, "LEDGER_DATABASE_URL": url, "LEDGER_ROLE_PREFIX": TEST_PREFIX,
           "LEDGER_DATA_DIR": str(tmp_path / "data"), "LEDGER_CONFIG": str(config)}
    procs: dict[str, subprocess.Popen[bytes]] = {}

    def spawn(name: str, *args: str) -> None:
        log = open(tmp_path / f"{name}.log", "wb")
        procs[name] = subprocess.Popen([sys.executable, "-m", "ledger", *args], env=env, stdout=log,
                                       stderr=subprocess.STDOUT)

    try:
        spawn("worker", "worker", "--concurrency", "2", "--poll", "1", "--grace", "1")
        spawn("verifier", "verifier", "--lease", "10", "--poll", "1")
        spawn("dispatcher", "dispatcher", "--poll", "5")
        attempting, checking = [
            (await kernels["sensor"].open_campaign(CLASS, f"objective-{i}", "repo")).campaign_id for i in (1, 2)]
        await eventually(lambda: all((markers / f"started-{c}-1").exists() for c in (attempting, checking)),
                         timeout=60, what="both attempts to start")
        (markers / f"release-{checking}-1").write_text("go")
        await eventually((markers / "verify-started").exists, timeout=60, what="the verifier's check to start")

        # the dispatcher, mid-pass: an HTTP intent whose target holds the request
        notify = (await kernels["sensor"].open_campaign("notify", "notify", "hook")).campaign_id
        claim = await kernels["worker"].claim_campaign("test-holder", ["notify"])
        assert claim is not None and claim.campaign_id == notify
        await kernels["worker"].request_side_effect(notify, claim.generation, kind="http.request", target=hook,
                                                    precondition={}, idempotency_key="hook-1",
                                                    payload={"method": "POST", "url": hook})
        await eventually(Hook.received.is_set, timeout=30, what="the dispatcher to send the request")
        for k in kernels.values():
            await k.executor.close()  # type: ignore[attr-defined]

        cluster.stop("immediate")  # no shutdown checkpoint: the next start recovers from a crash
        spawn("late-worker", "worker", "--poll", "1", "--grace", "1")  # started while the server is down

        def late_log() -> str:
            return (tmp_path / "late-worker.log").read_text()
        # the outage lasts until the late worker has met it (it tried, it waits)
        await eventually(lambda: "waiting for the database" in late_log() or "hub cannot connect" in late_log(),
                         timeout=60, what="the worker started during the outage to find the server down")
        time.sleep(1.0)  # and a little longer: every service's calls meet the outage
        assert all(p.poll() is None for p in procs.values()), "a process exited during the outage"
        probe = FirstCalls(cluster.url.replace("/postgres?", "/ledger_restart?"),
                           [f"ledger:{s}" for s in SERVICES], watch_s=6.0)
        probe.start()
        cluster.start()
        Hook.release.set()
        (markers / "verify-release").write_text("go")
        (markers / f"release-{attempting}-1").write_text("go")
        probe.join(timeout=scaled(30))
        first = probe.seconds()
        print(f"seconds from the server accepting connections to each service's first call: {first}")

        admin = db.connect_sync(None)

        def row(sql: str, *params: object) -> dict[str, Any] | None:
            return admin.execute(sql, params).fetchone()

        await eventually(lambda: row("SELECT state FROM ledger.side_effect WHERE idempotency_key = 'hook-1'")
                         ["state"] == "done", timeout=30, what="the intent to be recorded done")
        await eventually(lambda: row("SELECT state FROM ledger.campaign WHERE id = %s", checking)["state"]
                         == "verified", timeout=30, what="the checked candidate to be accepted")
        await eventually(lambda: row("SELECT outcome FROM ledger.attempt WHERE campaign_id = %s",
                                     attempting)["outcome"] == "attempted",
                         timeout=30, what="the attempt in flight to be recorded")
        assert row("SELECT count(*) AS n FROM ledger.attempt WHERE outcome = 'lost'")["n"] == 0, \
            "an attempt was lost to a restart shorter than its lease"
        assert all(p.poll() is None for p in procs.values()), \
            {n: (p.poll(), (tmp_path / f"{n}.log").read_text()[-2000:]) for n, p in procs.items() if p.poll()}
        # the worker started during the outage waited for the server, then started
        await eventually(lambda: "worker started" in late_log(), timeout=60,
                         what="the worker started during the outage to start working")
        for service in SERVICES:
            seconds = first.get(f"ledger:{service}")
            assert seconds is not None and seconds <= 2.0, (service, first)
        admin.close()
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs.values():
            try:
                p.wait(timeout=scaled(40))
            except subprocess.TimeoutExpired:
                p.kill()
