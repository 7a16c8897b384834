"""One log format per process: Ledger's records, loggers
made at import time, uvicorn's and Alembic's all come out as the same JSON
lines on stderr when it is not a terminal."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import urllib.request
import uuid
from pathlib import Path

import pytest

from conftest import TEST_PREFIX
from ledger.db.embedded import create_database, drop_database
from ledger.ops.gitserver import bare_repository


def records(stderr: str) -> list[dict[str, object]]:
    """Every line of ``stderr`` as a JSON record; fails on any other line."""
    out = []
    for line in stderr.splitlines():
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            pytest.fail(f"not a JSON log line: {line!r}\n--- whole stderr ---\n{stderr}")
        assert isinstance(record, dict) and {"event", "level", "timestamp"} <= record.keys(), line
        assert str(record["timestamp"]).endswith("Z"), line
        out.append(record)
    return out


def test_serve_logs_one_format_uvicorn_and_import_time_loggers(db_url: str) -> None:
    env = {**os.environ, "LEDGER_DATABASE_URL": db_url, "LEDGER_ROLE_PREFIX": TEST_PREFIX}
    env.pop("LEDGER_API_TOKENS", None)
    proc = subprocess.Popen([sys.executable, "-m", "ledger", "serve", "--port", "0"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    ready = threading.Event()
    port: list[int] = []

    def read() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append(line)
            found = re.search(r"running on http://127\.0\.0\.1:(\d+)", line)
            if found:
                port.append(int(found.group(1)))
                ready.set()
        ready.set()
    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert ready.wait(60) and port, "".join(lines)
        base = f"http://127.0.0.1:{port[0]}"
        with pytest.raises(urllib.request.HTTPError) as refused:
            urllib.request.urlopen(f"{base}/campaigns", timeout=10)
        assert refused.value.code == 401
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
        reader.join(10)
    logged = records("".join(lines))
    # uvicorn's own records, the import-time "api" logger (the missing-tokens
    # warning) and the request log: all in the one format
    assert any(r.get("logger") == "uvicorn.error" for r in logged), logged
    assert any(r.get("component") == "api" and r["level"] == "warning" for r in logged), logged
    assert any(r["event"] == "request" and r.get("status") == 401 for r in logged), logged


SCRIPT = """
import sys, warnings
import ledger.api.problems as problems   # its logger is made here, before configure
from ledger import logs; from ledger.db import migrations
logs.configure("info")
problems.log.warning("made at import time")
warnings.warn("a library warning")
migrations.upgrade(sys.argv[1], sys.argv[2])
"""


def test_alembic_warnings_and_import_time_loggers_share_the_format(pg_admin_url: str,
                                                                  tmp_path: Path) -> None:
    name = f"ledgertest_logs_{uuid.uuid4().hex[:8]}"
    url = create_database(pg_admin_url, name)
    try:
        proc = subprocess.run([sys.executable, "-c", SCRIPT, url, TEST_PREFIX], cwd=tmp_path,
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout == ""  # logs never go to stdout
        logged = records(proc.stderr)
        assert any(r["event"] == "made at import time" and r.get("component") == "api"
                   for r in logged), logged
        assert any(r.get("logger") == "alembic.runtime.migration" for r in logged), logged
        assert any(r.get("logger") == "py.warnings" for r in logged), logged
    finally:
        drop_database(pg_admin_url, name)


def test_a_service_on_the_administrators_login_warns_once_on_stderr_a_command_does_not(
        db_url: str, tmp_path: Path) -> None:
    """``ledger worker`` given only the administrator's URL says once that it
    holds administrator rights (on stderr); a one-shot command says nothing,
    so its ``--json`` output stays a document."""
    env = {**os.environ, "LEDGER_DATABASE_URL": db_url, "LEDGER_ROLE_PREFIX": TEST_PREFIX,
           "LEDGER_DATA_DIR": str(tmp_path / "data"), "LEDGER_CONFIG": str(tmp_path / "none.toml")}
    repo = tmp_path / "repo"
    bare_repository(tmp_path, "repo", {"README": "x\n"})  # a base_ref to check up front
    (tmp_path / "none.toml").write_text(
        f'[classes.logs-class]\nrepository = "{repo}"\nattempt_command = ["true"]\n')
    for key in [k for k in env if k.startswith("LEDGER_") and k.endswith("_DATABASE_URL")
                and k != "LEDGER_DATABASE_URL"]:
        del env[key]
    worker = subprocess.Popen([sys.executable, "-m", "ledger", "worker", "--poll", "0.2"], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert worker.stderr is not None
        lines: list[str] = []
        for line in worker.stderr:  # it warns as it opens its first session
            lines.append(line)
            if "holds administrator rights" in line or len(lines) > 500:
                break
    finally:
        worker.send_signal(signal.SIGTERM)
        lines += worker.communicate(timeout=60)[1].splitlines()
    warned = [ln for ln in lines if "holds administrator rights" in ln]
    assert len(warned) == 1 and "ledger logins create" in warned[0], lines
    synced = subprocess.run([sys.executable, "-m", "ledger", "classes", "sync"], env=env,
                            capture_output=True, text=True, timeout=60)
    assert synced.returncode == 0, synced.stderr
    # `open` acts as the sensor role, through the same administrator's login
    opened = subprocess.run([sys.executable, "-m", "ledger", "open", "logs-class", "o", "t", "--json"],
                            env=env, capture_output=True, text=True, timeout=60)
    assert opened.returncode == 0, opened.stderr
    assert json.loads(opened.stdout)["created"] is True and "administrator" not in opened.stderr
