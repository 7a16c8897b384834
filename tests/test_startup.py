"""Start-up faults (ledger.runtime.startup): a long-running service that
cannot start for a reason of its host or its configuration never dies and
restarts with tracebacks. It says the cause once (one line), reports itself
not ready -- its own ``/readyz`` (``--health``), its row of the registry of
processes, ``ledger status`` -- re-checks with backoff and starts once the
cause is gone; nothing is claimed meanwhile, so nothing is charged. A
one-shot command prints the one line and exits with the cause's code.

One test per fault: no sandbox, a repository that is not there, a bad
ledger.toml, a missing role login, a schema not yet migrated. Real
processes against the real database; the faults are real (a bind mount hides
bubblewrap, a directory moves, a file is broken, a login does not exist, a
revision is stepped down) and so are the fixes."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from conftest import TEST_PREFIX, stop_process
from drive import bubblewrap_hiding, eventually
from ledger.db import migrations
from ledger.ops.gitserver import bare_repository, free_port

pytestmark = pytest.mark.anyio

PY = sys.executable


def write_config(tmp_path: Path, repository: Path, *, sandbox: bool = False) -> Path:
    """A class whose attempt runs in a cell only with ``sandbox`` (the other
    faults need none: their tests run where bubblewrap is missing too)."""
    config = tmp_path / "ledger.toml"
    cell = "" if sandbox else "cell = { sandbox = false }\nacceptance = { cell = { sandbox = false } }\n"
    config.write_text(f'[classes.c]\nrepository = "{repository}"\nattempt_command = ["true"]\n'
                      f"lease_s = 10\nheartbeat_s = 1\n{cell}")
    return config


def environment(db_url: str, tmp_path: Path, config: Path, **extra: str) -> dict[str, str]:
    return {**os.environ, "LEDGER_DATABASE_URL": db_url, "LEDGER_ROLE_PREFIX": TEST_PREFIX,
            "LEDGER_DATA_DIR": str(tmp_path / "data"), "LEDGER_CONFIG": str(config),
            "NO_COLOR": "1", **extra}


def ledger(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PY, "-m", "ledger", *args], env=env, capture_output=True, text=True,
                          timeout=120)


def one_line(proc: subprocess.CompletedProcess[str], code: int, *says: str) -> str:
    """The one line (and exit code) a one-shot command refused with."""
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == code, proc.stderr
    assert len(lines) == 1 and lines[0].startswith("ledger: "), proc.stderr
    for text in says:
        assert text in lines[0], lines[0]
    return lines[0]


def opened_campaign(env: dict[str, str]) -> int:
    synced = ledger(["classes", "sync"], env)
    assert synced.returncode == 0, synced.stderr
    opened = ledger(["open", "c", f"objective-{uuid.uuid4().hex[:6]}", "target", "--json"], env)
    assert opened.returncode == 0, opened.stderr
    return int(json.loads(opened.stdout)["campaign_id"])


class Service:
    """A long-running ``ledger`` command, its stderr in a file, its health port."""

    def __init__(self, args: list[str], env: dict[str, str], tmp_path: Path,
                 prefix: list[str] | None = None):
        self.port = free_port()
        self.log = tmp_path / f"{args[0]}-{self.port}.log"
        self._err = self.log.open("w")
        self.proc = subprocess.Popen(
            [*(prefix or []), PY, "-m", "ledger", *args, "--poll", "0.2",
             "--health", f"127.0.0.1:{self.port}"],
            env=env, stdout=subprocess.DEVNULL, stderr=self._err, text=True)

    def readyz(self) -> tuple[int, dict[str, Any]] | None:
        """``/readyz``: its status and body (``None``: not answering yet)."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/readyz", timeout=5) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())
        except OSError:
            return None

    def not_ready_saying(self, text: str) -> bool:
        answer = self.readyz()
        return (answer is not None and answer[0] == 503
                and any(text in reason for reason in answer[1].get("reasons", [])))

    def ready(self) -> bool:
        answer = self.readyz()
        return answer is not None and answer == (200, {"status": "ready"})

    def stderr(self) -> str:
        return self.log.read_text()

    def said(self, text: str) -> list[str]:
        """Its lines saying ``text`` (as is, or quoted in a JSON log line)."""
        quoted = json.dumps(text)[1:-1]
        return [line for line in self.stderr().splitlines() if text in line or quoted in line]

    def stop(self) -> str:
        """SIGTERM; its stderr. It exits 0 (also while it still waited)."""
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        finally:
            stop_process(self.proc)
            self._err.close()
        err = self.stderr()
        assert self.proc.returncode == 0, err
        return err


def rows(db_url: str, query: str, *args: Any) -> list[dict[str, Any]]:
    with psycopg.connect(db_url, autocommit=True) as conn:
        cur = conn.execute(query, args)
        names = [d.name for d in cur.description or []]
        return [dict(zip(names, r)) for r in cur.fetchall()]


def campaign(db_url: str, cid: int) -> dict[str, Any]:
    return rows(db_url, "SELECT state, attempt_count, generation FROM ledger.campaign WHERE id = %s",
                cid)[0]


def attempts(db_url: str, cid: int) -> int:
    return int(rows(db_url, "SELECT count(*) AS n FROM ledger.attempt WHERE campaign_id = %s",
                    cid)[0]["n"])


def registry(db_url: str, pid: int) -> list[dict[str, Any]]:
    return rows(db_url, "SELECT role, service, status, not_ready, last_seen FROM ledger_api.processes "
                        "WHERE pid = %s ORDER BY role", pid)


def uncharged(db_url: str, cid: int) -> None:
    """Nothing of the campaign moved: not claimed, no attempt, nothing charged."""
    assert campaign(db_url, cid) == {"state": "ready", "attempt_count": 0, "generation": 0}
    assert attempts(db_url, cid) == 0


def no_traceback(err: str) -> None:
    assert "Traceback" not in err and '"exception"' not in err, err


async def waits_then_works(service: Service, db_url: str, cid: int, cause: str, *,
                           in_registry: bool = True) -> None:
    """While the cause lasts: not ready (saying it), re-checking, nothing claimed."""
    await eventually(lambda: service.not_ready_saying(cause), timeout=60,
                     what=f"/readyz saying {cause!r}")
    if in_registry:
        seen: list[Any] = []

        def reported_twice() -> bool:
            found = [r for r in registry(db_url, service.proc.pid) if r["not_ready"]]
            if found and cause in found[0]["not_ready"]:
                seen.append(found[0]["last_seen"])
            return len(set(seen)) >= 2  # re-checked (and said so) at least once more

        await eventually(reported_twice, timeout=60, what="two not-ready reports in the registry")
        status = ledger(["status", "--json"], {**os.environ, "LEDGER_DATABASE_URL": db_url,
                                               "LEDGER_ROLE_PREFIX": TEST_PREFIX})
        assert status.returncode == 0, status.stderr
        waiting = json.loads(status.stdout)["not_ready"]
        assert [w["pid"] for w in waiting] == [service.proc.pid], waiting
        assert cause in waiting[0]["not_ready"]
    uncharged(db_url, cid)
    assert service.proc.poll() is None, service.stderr()  # waiting, not dead
    assert len(service.said(cause)) == 1, service.stderr()  # said once


async def started(service: Service, db_url: str, cid: int) -> None:
    """Once the cause is gone: ready, working, the registry row clear."""
    await eventually(service.ready, timeout=60, what="/readyz ready")
    await eventually(lambda: attempts(db_url, cid) >= 1, timeout=60, what="the campaign attempted")
    assert all(r["not_ready"] is None for r in registry(db_url, service.proc.pid))


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return bare_repository(tmp_path, "app.git", {"value.txt": "good\n"})


async def test_no_sandbox_waits_not_ready_until_bubblewrap_is_back(db_url: str, tmp_path: Path,
                                                                   repo: Path) -> None:
    """bubblewrap hidden from the worker (a private mount namespace with
    /dev/null bound over it): one line naming the package, not ready, nothing
    claimed; unhidden (umount in its namespace), it starts and works. The
    one-shot verifier refuses with the same line and 78."""
    hidden, why = bubblewrap_hiding()
    if why:
        pytest.skip(why)
    env = environment(db_url, tmp_path, write_config(tmp_path, repo, sandbox=True))
    cid = opened_campaign(env)
    bwrap = os.path.realpath(shutil.which("bwrap") or "/usr/bin/bwrap")

    once = subprocess.run([*hidden, PY, "-m", "ledger", "verifier", "--once"], env=env,
                          capture_output=True, text=True, timeout=120)
    one_line(once, 78, "bubblewrap (bwrap) is not installed", "apt-get install bubblewrap")

    worker = Service(["worker"], env, tmp_path, prefix=hidden)
    try:
        await waits_then_works(worker, db_url, cid, "bubblewrap (bwrap) is not installed")
        subprocess.run(["nsenter", "-t", str(worker.proc.pid), "-m", "umount", bwrap], check=True)
        await started(worker, db_url, cid)
    finally:
        err = worker.stop()
    no_traceback(err)
    assert len([ln for ln in err.splitlines() if "bubblewrap" in ln]) == 1, err


async def test_a_repository_that_is_not_there_waits_until_it_is(db_url: str, tmp_path: Path,
                                                                repo: Path) -> None:
    """The class's repository moved away after it was registered: `classes
    sync` refuses (78, one line naming the key); the worker waits, not ready,
    until it is back."""
    env = environment(db_url, tmp_path, write_config(tmp_path, repo))
    cid = opened_campaign(env)
    away = repo.with_name("away.git")
    repo.rename(away)
    one_line(ledger(["classes", "sync"], env), 78, "classes.c.repository", "does not exist")
    one_line(ledger(["worker", "--wait-for-start", "0"], env), 78, "classes.c.repository",
             "does not exist", "nothing was claimed")

    worker = Service(["worker"], env, tmp_path)
    try:
        await waits_then_works(worker, db_url, cid, f"{repo} does not exist")
        away.rename(repo)
        await started(worker, db_url, cid)
    finally:
        err = worker.stop()
    no_traceback(err)


async def test_a_bad_ledger_toml_waits_until_it_is_fixed(db_url: str, tmp_path: Path,
                                                         repo: Path) -> None:
    """`ledger run` with a ledger.toml that does not parse: one line, not
    ready (its worker's row says why), nothing claimed; the file fixed, every
    part starts. The one-shot `classes sync` exits 78 with the same line."""
    config = write_config(tmp_path, repo)
    env = environment(db_url, tmp_path, config)
    cid = opened_campaign(env)
    good = config.read_text()
    config.write_text(good + "attempt_command = [\n")
    one_line(ledger(["classes", "sync"], env), 78, "not valid TOML")

    run = Service(["run", "--no-sensors"], env, tmp_path)
    try:
        await waits_then_works(run, db_url, cid, "not valid TOML")
        config.write_text(good)
        await started(run, db_url, cid)
        await eventually(lambda: {r["role"] for r in registry(db_url, run.proc.pid)}
                         >= {"worker", "reaper", "verifier", "dispatcher"}, timeout=60,
                         what="every part of `ledger run` in the registry")
    finally:
        err = run.stop()
    no_traceback(err)


@pytest.fixture
def login(db_url: str) -> Iterator[tuple[str, str]]:
    """A worker login's name and URL; the login itself is not created."""
    name = f"{TEST_PREFIX}worker_login_{uuid.uuid4().hex[:6]}"
    yield name, make_conninfo(db_url, user=name, password="pw-" + name)
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(name)))


async def test_a_missing_role_login_waits_until_it_is_created(db_url: str, tmp_path: Path,
                                                              repo: Path,
                                                              login: tuple[str, str]) -> None:
    """LEDGER_WORKER_DATABASE_URL names a login not created yet: the one-shot
    start exits 15 with one line naming it; the service says it once, answers
    503 on /readyz (its role cannot write the registry), waits; the login
    created, it starts."""
    name, url = login
    env = environment(db_url, tmp_path, write_config(tmp_path, repo))
    cid = opened_campaign(env)
    env["LEDGER_WORKER_DATABASE_URL"] = url
    one_line(ledger(["worker", "--wait-for-start", "0"], env), 15, f'user "{name}"',
             "LEDGER_WORKER_DATABASE_URL", "ledger logins create")

    worker = Service(["worker"], env, tmp_path)
    try:
        await waits_then_works(worker, db_url, cid, f'refused the login of user "{name}"',
                               in_registry=False)
        with psycopg.connect(db_url, autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD {} IN ROLE {}").format(
                sql.Identifier(name), sql.Literal("pw-" + name),
                sql.Identifier(f"{TEST_PREFIX}worker")))
        await started(worker, db_url, cid)
    finally:
        err = worker.stop()
    no_traceback(err)


async def test_a_schema_not_yet_migrated_waits_for_ledger_migrate(db_url: str, tmp_path: Path,
                                                                  repo: Path) -> None:
    """New code deployed before the migration (the database one revision
    behind): one-shot commands exit 14; the service waits, not ready, and
    starts once `ledger migrate` has run -- the campaign opened before is
    claimed then, never before."""
    env = environment(db_url, tmp_path, write_config(tmp_path, repo))
    cid = opened_campaign(env)
    previous = migrations.history()[-2]
    migrations.downgrade(db_url, TEST_PREFIX, previous)
    one_line(ledger(["status"], env), 14, "needs schema revision")

    worker = Service(["worker"], env, tmp_path)
    try:
        await waits_then_works(worker, db_url, cid, "needs schema revision", in_registry=False)
        migrated = ledger(["migrate"], env)
        assert migrated.returncode == 0, migrated.stderr
        await started(worker, db_url, cid)
    finally:
        err = worker.stop()
    no_traceback(err)


def test_the_health_answers_say_starting_waiting_and_ready() -> None:
    """``--health``'s answers (ledger.runtime.health): alive always; not ready
    while starting or waiting (with the reasons), ready once serving."""
    from ledger.runtime.health import answer
    from ledger.runtime.startup import Readiness

    readiness = Readiness()
    assert answer("/livez", readiness) == (200, {"status": "alive"})
    assert answer("/readyz", readiness) == (503, {"status": "not ready", "reasons": ["starting"]})
    readiness.waiting["worker"] = "no cell"
    readiness.serving = True
    assert answer("/readyz", readiness) == (503, {"status": "not ready",
                                                  "reasons": ["worker: no cell"]})
    readiness.waiting.clear()
    assert answer("/readyz", readiness) == (200, {"status": "ready"})
    assert answer("/metrics", readiness)[0] == 404
