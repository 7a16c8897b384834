"""Configuration checked up front (docs: Deployment, "Several machines"): ``ledger classes
sync`` and every command that reads ``ledger.toml`` refuse a
misconfiguration in one line naming the key (exit 78; a long-running one waits
until it is fixed instead, unless --wait-for-start 0: tests/test_startup.py)
before anything is registered, opened or claimed -- an unknown placeholder, a sensor target
outside its class, a repository that does not exist or has no base_ref, a
remote refusing Ledger's credentials -- and only warn about a remote that
cannot be reached right now: the command starts, and the work waits on it
without being charged."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from conftest import TEST_PREFIX
from ledger.config import parse_config
from ledger.errors import ConfigError
from ledger.ops.gitserver import GitDaemon, HttpGitServer, bare_repository, free_port
from ledger.roles.preflight import check, probe

PY = sys.executable


def ledger(args: list[str], env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PY, "-m", "ledger", *args], env={**os.environ, "NO_COLOR": "1", **env},
                          capture_output=True, text=True, timeout=timeout)


def refused(proc: subprocess.CompletedProcess[str], key: str, *says: str) -> str:
    """The one line of a refusal naming ``key``, with exit 78."""
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == ConfigError.exit_code, proc.stderr
    assert len(lines) == 1 and lines[0].startswith("ledger: "), proc.stderr
    assert f": {key}: " in lines[0], lines[0]
    for text in says:
        assert text in lines[0], lines[0]
    assert "Traceback" not in proc.stderr
    return lines[0]


@pytest.fixture
def served(tmp_path: Path) -> Iterator[GitDaemon]:
    root = tmp_path / "served"
    root.mkdir()
    bare_repository(root, "app.git", {"value.txt": "good\n"})
    with GitDaemon(root) as daemon:
        assert isinstance(daemon, GitDaemon)
        yield daemon


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return bare_repository(tmp_path, "local.git", {"value.txt": "good\n"})


def write(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "ledger.toml"
    path.write_text(body)
    return path


def env_for(db_url: str, tmp_path: Path, config: Path, **extra: str) -> dict[str, str]:
    return {"LEDGER_DATABASE_URL": db_url, "LEDGER_ROLE_PREFIX": TEST_PREFIX,
            "LEDGER_DATA_DIR": str(tmp_path / "data"), "LEDGER_CONFIG": str(config), **extra}


def registered(db_url: str) -> list[str]:
    with psycopg.connect(db_url) as conn:
        return [r[0] for r in conn.execute("SELECT name FROM ledger.campaign_class ORDER BY name")]


def opened(db_url: str) -> int:
    with psycopg.connect(db_url) as conn:
        row = conn.execute("SELECT count(*) FROM ledger.campaign").fetchone()
        return int(row[0]) if row else 0


def test_an_unknown_placeholder_is_refused_before_anything_is_registered(db_url: str, tmp_path: Path,
                                                                          repo: Path) -> None:
    """Old main registered it; the first attempt then failed with a KeyError,
    recorded as 'the worker was lost' and charged."""
    config = write(tmp_path, f'[classes.c]\nrepository = "{repo}"\n'
                             'attempt_command = ["agent", "--file", "{campaign_fil}"]\n')
    proc = ledger(["classes", "sync"], env_for(db_url, tmp_path, config))
    refused(proc, "classes.c.attempt_command", "unknown placeholder {campaign_fil}", "{campaign_file}")
    assert registered(db_url) == []


def test_a_sensor_objective_with_an_unknown_placeholder_is_refused(db_url: str, tmp_path: Path,
                                                                    repo: Path) -> None:
    """Old main exited 70 (a KeyError) at the sensor's first observation."""
    config = write(tmp_path, f'[classes.c]\nrepository = "{repo}"\nattempt_command = ["true"]\n'
                             '[sensors.s]\ntarget = "local#main"\nevery_s = 60\ncommand = ["true"]\n'
                             'class = "c"\nobjective = "{sensor}-{branch}"\n')
    for args in (["classes", "sync"], ["sensor", "run", "--once", "--wait-for-database", "0"]):
        refused(ledger(args, env_for(db_url, tmp_path, config)), "sensors.s.objective",
                "unknown placeholder {branch}")
    assert registered(db_url) == [] and opened(db_url) == 0


def test_a_sensor_target_outside_its_class_is_refused(db_url: str, tmp_path: Path, repo: Path) -> None:
    config = write(tmp_path, f'[classes.c]\nrepository = "{repo}"\nattempt_command = ["true"]\n'
                             '[sensors.s]\ntarget = "another-repo#main"\nevery_s = 60\ncommand = ["true"]\n'
                             'class = "c"\n')
    refused(ledger(["classes", "sync"], env_for(db_url, tmp_path, config)), "sensors.s.target",
            "is not in the repository of class c")
    assert registered(db_url) == []


@pytest.mark.parametrize("case", ["missing-path", "not-a-repository", "no-base-ref"])
def test_a_local_repository_that_cannot_serve_is_refused(db_url: str, tmp_path: Path, repo: Path,
                                                          case: str) -> None:
    location, key, says = {
        "missing-path": (tmp_path / "nowhere", "classes.c.repository", "does not exist"),
        "not-a-repository": (tmp_path, "classes.c.repository", "not a repository Ledger can use"),
        "no-base-ref": (repo, "classes.c.base_ref", "has no release"),
    }[case]
    config = write(tmp_path, f'[classes.c]\nrepository = "{location}"\nbase_ref = "release"\n'
                             'attempt_command = ["true"]\n' if case == "no-base-ref" else
                   f'[classes.c]\nrepository = "{location}"\nattempt_command = ["true"]\n')
    env = env_for(db_url, tmp_path, config)
    refused(ledger(["classes", "sync"], env), key, says, "no class was registered")
    assert registered(db_url) == []
    # (a worker waits for a misconfiguration to be fixed: tests/test_startup.py; here it may not)
    refused(ledger(["worker", "--wait-for-database", "0", "--wait-for-start", "0"], env), key, says,
            "nothing was claimed")


def test_a_remote_without_the_repository_or_its_base_ref_is_refused(db_url: str, tmp_path: Path,
                                                                     served: GitDaemon) -> None:
    for url, base, key, says in (
            (served.url("nope.git"), "main", "classes.c.repository", "no such repository"),
            (served.url("app.git"), "release", "classes.c.base_ref", "has no release")):
        config = write(tmp_path, f'[classes.c]\nrepository = "{url}"\nbase_ref = "{base}"\n'
                                 'attempt_command = ["true"]\n')
        refused(ledger(["classes", "sync"], env_for(db_url, tmp_path, config)), key, says)
    assert registered(db_url) == []


def test_an_authenticated_remote_without_credentials_is_refused(db_url: str, tmp_path: Path) -> None:
    root = tmp_path / "served"
    root.mkdir()
    bare_repository(root, "app.git", {"value.txt": "good\n"})
    with HttpGitServer(root) as server:
        assert isinstance(server, HttpGitServer)
        config = write(tmp_path, f'[classes.c]\nrepository = "{server.url("app.git")}"\n'
                                 'attempt_command = ["true"]\n')
        env = env_for(db_url, tmp_path, config)
        refused(ledger(["classes", "sync"], env), "classes.c.repository", "could not read Username",
                "LEDGER_GIT_CREDENTIAL_HELPER")
        creds = server.credentials(tmp_path / "operator-credentials")
        synced = ledger(["classes", "sync"], {**env, "LEDGER_GIT_CREDENTIAL_HELPER": f"store --file={creds}"})
        assert synced.returncode == 0, synced.stderr
        assert registered(db_url) == ["c"]


@pytest.mark.cells
def test_a_remote_out_of_reach_is_a_warning_and_the_work_waits_uncharged(db_url: str, tmp_path: Path) -> None:
    """Connection refused is "not now", not "never": sync registers the
    class and the worker starts, each saying so in one line; the campaign it
    claims is released (waiting_on = system_fault), nothing charged."""
    url = f"git://127.0.0.1:{free_port()}/app.git"
    config = write(tmp_path, f'[classes.c]\nrepository = "{url}"\nattempt_command = ["true"]\n'
                             "lease_s = 10\nheartbeat_s = 1\n")
    env = env_for(db_url, tmp_path, config)
    synced = ledger(["classes", "sync"], env)
    assert synced.returncode == 0, synced.stderr
    warned = [ln for ln in synced.stderr.splitlines() if "warning" in ln]
    assert len(warned) == 1 and "classes.c.repository" in warned[0] and "Connection refused" in warned[0]
    assert "starting anyway" in warned[0]
    assert registered(db_url) == ["c"]
    opened_ = ledger(["open", "c", "objective", "target", "--json"], env)
    assert opened_.returncode == 0, opened_.stderr
    campaign = json.loads(opened_.stdout)["campaign_id"]

    worker = subprocess.Popen([PY, "-m", "ledger", "worker", "--poll", "0.2"], env={**os.environ, **env},
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        row = until(db_url, campaign, lambda r: r["waiting_on"] == "system_fault")
    finally:
        worker.send_signal(signal.SIGTERM)
        _, err = worker.communicate(timeout=60)
    assert worker.returncode == 0, err
    assert any("classes.c.repository" in ln and "starting anyway" in ln for ln in err.splitlines())
    assert row["state"] == "ready" and row["attempt_count"] == 0, row
    assert "cannot fetch" in row["waiting_reason"] and "Connection refused" in row["waiting_reason"]
    with psycopg.connect(db_url) as conn:
        outcomes = [r[0] for r in conn.execute("SELECT outcome FROM ledger.attempt WHERE campaign_id = %s",
                                               (campaign,))]
    assert outcomes and set(outcomes) == {"released"}, outcomes


def until(db_url: str, campaign: int, ok: Any, timeout: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    with psycopg.connect(db_url, autocommit=True) as conn:
        while True:
            cur = conn.execute("SELECT * FROM ledger.campaign WHERE id = %s", (campaign,))
            names = [d.name for d in cur.description or []]
            row = dict(zip(names, cur.fetchone() or ()))
            if ok(row):
                return row
            assert time.monotonic() < deadline, row
            time.sleep(0.05)  # a row another process changes: nothing to await here


def test_probe_tells_misconfigured_from_unreachable(tmp_path: Path, served: GitDaemon) -> None:
    """The library under the commands: every class's repository asked once,
    each problem under the key an operator would edit."""
    down = f"git://127.0.0.1:{free_port()}/app.git"
    assert probe(served.url("app.git"), ["main"]).problem is None
    assert probe(served.url("app.git"), ["main", "nope"]).missing == ("nope",)
    assert probe(down, ["main"]).problem is not None and probe(down, ["main"]).problem[0] == "unreachable"
    assert probe(served.url("nope.git"), ["main"]).problem[0] == "misconfigured"
    config = parse_config({"classes": {
        "a": {"repository": served.url("app.git"), "attempt_command": ["true"]},
        "b": {"repository": served.url("app.git"), "attempt_command": ["true"], "base_ref": "gone"},
        "c": {"repository": down, "attempt_command": ["true"]}}})
    problems = {(p.key, p.kind) for p in check(config)}
    assert problems == {("classes.b.base_ref", "misconfigured"), ("classes.c.repository", "unreachable")}
