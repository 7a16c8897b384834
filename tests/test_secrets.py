"""Commands Ledger runs see no secret, and nothing
secret is stored. A probe command in each role -- sensor, attempt, verifier --
prints its whole environment (which Ledger keeps: observation details, the
journal, the verdict's evidence) while Ledger's own environment holds the
administrator's database URL, libpq settings and tokens."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

import pytest

from conftest import TEST_PREFIX
from drive import eventually
from ledger.config import parse_config
from ledger.roles.sensors import Sensor
from ledger.roles.verifier import Verifier
from ledger.sandbox.processes import ALLOWED, check_extra, child_environment

pytestmark = pytest.mark.anyio

PY = sys.executable
CLASS = "probe"
PROBE = """import json, os, pathlib, sys
role, out = sys.argv[1], pathlib.Path(sys.argv[2])
(out / f"{role}.json").write_text(json.dumps(dict(os.environ)))
print(json.dumps(dict(os.environ)))
if role == "attempt":
    pathlib.Path("change.txt").write_text("a change")
sys.exit(1 if role == "sensor" else 0)
"""
#: What an attempt command is told besides the allow-list (none of it secret).
ATTEMPT_CONTEXT = {"LEDGER_CAMPAIGN_FILE", "LEDGER_CAMPAIGN_ID", "LEDGER_ATTEMPT_NO",
                   "LEDGER_WORKTREE", "LEDGER_OBJECTIVE", "LEDGER_COMMIT_MESSAGE_FILE"}
TEMP = {"TMPDIR", "TMP", "TEMP"}
#: What a cell sets for itself (none of it from Ledger's environment).
CELL = {"USER", "LOGNAME", "SHELL", "PWD"}


def secrets() -> dict[str, str]:
    tag = uuid.uuid4().hex[:8]
    planted = {name: f"s3cret-{name.lower()}-{tag}" for name in (
        "PGPASSWORD", "LEDGER_API_TOKENS", "DATABASE_URL", "GITHUB_TOKEN",
        "AWS_SECRET_ACCESS_KEY", "OPENAI_API_KEY")}
    # a well-formed URL (a malformed one stops every command: tests/test_cli_failures.py), its password the secret
    planted["LEDGER_OPERATOR_DATABASE_URL"] = f"postgresql://op:s3cret-{tag}@127.0.0.1:1/x"
    return planted


def stored(admin: Any, data_dir: Path) -> str:
    """Everything Ledger kept, as one text: rows and evidence files."""
    parts = []
    for query in ("SELECT details::text FROM ledger.observation",
                  "SELECT opening_observation::text || coalesce(last_failure_reason, '') FROM ledger.campaign",
                  "SELECT payload::text FROM ledger.campaign_event",
                  "SELECT coalesce(log_tail, '') || coalesce(bundle::text, '') || coalesce(failure_reason, '') "
                  "FROM ledger.attempt",
                  "SELECT evidence::text || coalesce(reason, '') FROM ledger.verification",
                  "SELECT details::text FROM ledger.security_event"):
        parts += [next(iter(r.values())) for r in admin.execute(query).fetchall()]
    parts += [p.read_text(errors="replace") for p in data_dir.rglob("*") if p.is_file()]
    return "\n".join(parts)


@pytest.mark.cells
async def test_no_role_gives_its_command_a_secret_nor_stores_one(
        actors: Any, admin: Any, db_url: str, tmp_path: Path, monkeypatch: Any) -> None:
    planted = {**secrets(), "LEDGER_DATABASE_URL": db_url}
    for name, value in planted.items():
        monkeypatch.setenv(name, value)
    seen = tmp_path / "seen"
    seen.mkdir()
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    repo = tmp_path / "repo"
    subprocess.run(["git", "init", "-q", "-b", "main", str(repo)], check=True)
    (repo / "README").write_text("probed\n")
    subprocess.run(["git", "-C", str(repo), "add", "."], check=True)
    subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t",
                    "commit", "-qm", "start"], check=True)
    data_dir = tmp_path / "data"
    config = tmp_path / "ledger.toml"
    config.write_text(f"""
[classes.{CLASS}]
repository = "{repo}"
attempt_command = ["{PY}", "{probe}", "attempt", "{seen}"]
lease_s = 10
heartbeat_s = 1
acceptance = {{ commands = [["{PY}", "{probe}", "verifier", "{seen}"]], timeout_s = 60, cell = {{ writable = ["{seen}"] }} }}
cell = {{ writable = ["{seen}"] }}

[sensors.probe]
target = "repo#main"
every_s = 60
command = ["{PY}", "{probe}", "sensor", "{seen}"]
class = "{CLASS}"
cell = {{ writable = ["{seen}"] }}
""")
    from ledger.config import load_config
    cfg = load_config(config)
    await (await actors("operator")).register_class(CLASS, **cfg.classes[CLASS].registration())

    # sensor: in this process, whose environment holds the secrets
    observed = await Sensor(await actors("sensor"), cfg.sensors["probe"], "sensor-1").observe(None)
    assert observed is not None and observed.effect == "opened"
    # attempt: a worker process started with the secrets in its environment
    worker = subprocess.Popen(
        [PY, "-m", "ledger", "worker", "--poll", "0.2"],
        env={**os.environ, "LEDGER_ROLE_PREFIX": TEST_PREFIX, "LEDGER_DATA_DIR": str(data_dir),
             "LEDGER_CONFIG": str(config)},
        stdout=subprocess.DEVNULL, stderr=open(tmp_path / "worker.log", "wb"))
    try:
        await eventually(lambda: admin.execute("SELECT state FROM ledger.campaign").fetchone()["state"]
                         == "attempted", timeout=60, what="the probe attempt recorded")
    finally:
        worker.kill()
        worker.wait()
    # verifier: in this process too
    verifier = Verifier(await actors("verifier"), identity="verifier-1", data_dir=data_dir)
    assert await verifier.run_once() == 1
    assert admin.execute("SELECT state FROM ledger.campaign").fetchone()["state"] == "verified"

    for role, extra in (("sensor", {"LEDGER_JUNIT_XML"}), ("attempt", ATTEMPT_CONTEXT), ("verifier", set())):
        env = json.loads((seen / f"{role}.json").read_text())
        unexpected = {k for k in env if k not in ALLOWED and not k.startswith("LC_")} - TEMP - CELL - extra
        assert unexpected == set(), f"{role} got {sorted(unexpected)}"
        assert not set(env.values()) & set(planted.values()), role
        # in its cell: a private /tmp and $HOME of its own, not the host's (a
        # judging cell's like an ordinary user's: ledger.sandbox.guise)
        assert env["TMPDIR"] == "/tmp" and env["HOME"] != str(Path.home()), role
        assert env["HOME"] == "/cell/home" if role == "attempt" else not env["HOME"].startswith("/cell"), role
    kept = stored(admin, data_dir)
    for role in ("sensor", "attempt", "verifier"):  # else this would prove nothing
        assert f"{role}.json" in kept or role in kept
    assert kept.count("TMPDIR") >= 3, "the probes' output was stored"
    for name, value in planted.items():
        assert value not in kept, f"{name} was stored"


def test_the_environment_is_an_allow_list_and_extras_cannot_name_secrets() -> None:
    base = {"PATH": "/bin", "HOME": "/home/x", "LANG": "C.UTF-8", "LC_ALL": "C", "TZ": "UTC",
            "GITHUB_TOKEN": "t", "PGHOST": "db", "LEDGER_DATABASE_URL": "u", "AGENT_KEY": "k",
            "VIRTUAL_ENV": "/venv"}
    assert child_environment(base=base) == {"PATH": "/bin", "HOME": "/home/x", "LANG": "C.UTF-8",
                                            "LC_ALL": "C", "TZ": "UTC"}
    env = child_environment(["AGENT_KEY", "MODE=fast", "MISSING"], base=base)
    assert env["AGENT_KEY"] == "k" and env["MODE"] == "fast" and "MISSING" not in env
    for bad in ("LEDGER_DATABASE_URL", "PGPASSWORD", "PGHOST=x", "DATABASE_URL", "1BAD", "A-B"):
        with pytest.raises(ValueError):
            check_extra(bad)
    with pytest.raises(Exception, match="never given"):
        parse_config({"sensors": {"s": {"target": "t", "every_s": 1, "command": ["x"], "class": "c",
                                        "environment": ["PGPASSWORD"]}}})
    assert tempfile.gettempdir()  # (the private TMPDIR is made per command: see the probe test)


async def test_a_leaked_secret_refuses_the_attempt_not_the_fix(
        actors: Any, admin: Any, db_url: str, tmp_path: Path) -> None:
    """After an attempt printed a secret, its correct diff was a refused
    fingerprint, so the next attempt making the same, honest change was
    refused as a repeated approach (and the campaign exhausted). The attempt
    is refused for what its run did; its change is judged when made again."""
    from ledger.config import load_config
    from ledger.drills.paths import scripted_attempt

    token = f"agent-token-{uuid.uuid4().hex}"
    repo = tmp_path / "repo"
    subprocess.run(["git", "init", "-q", "-b", "main", str(repo)], check=True)
    (repo / "README").write_text("start\n")
    subprocess.run(["git", "-C", str(repo), "add", "."], check=True)
    subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "start"],
                   check=True)
    markers = tmp_path / "markers"
    markers.mkdir()
    plan = markers / "plan.json"
    plan.write_text(json.dumps({"1": [["print-env", "AGENT_TOKEN"], ["write", "fix.txt", "fixed\n"], ["exit", 0]],
                                "default": [["write", "fix.txt", "fixed\n"], ["exit", 0]]}))
    config = tmp_path / "ledger.toml"
    config.write_text(f"""
[classes.{CLASS}]
repository = "{repo}"
attempt_command = ["{PY}", "{scripted_attempt()}", "{plan}"]
attempt_environment = ["AGENT_TOKEN"]
lease_s = 10
heartbeat_s = 1
max_attempts = 3
backoff = {{ base_s = 0, jitter = 0 }}
acceptance = {{ commands = [["true"]], timeout_s = 60 }}
cell = {{ writable = ["{markers}"] }}
""")
    await (await actors("operator")).register_class(CLASS, **load_config(config).classes[CLASS].registration())
    cid = (await (await actors("sensor")).open_campaign(CLASS, "leak", "repo")).campaign_id
    worker = subprocess.Popen(
        [PY, "-m", "ledger", "worker", "--poll", "0.2"],
        env={**os.environ, "LEDGER_DATABASE_URL": db_url, "LEDGER_ROLE_PREFIX": TEST_PREFIX,
             "LEDGER_DATA_DIR": str(tmp_path / "data"), "LEDGER_CONFIG": str(config), "AGENT_TOKEN": token},
        stdout=subprocess.DEVNULL, stderr=open(tmp_path / "worker.log", "wb"))
    try:
        await eventually(lambda: admin.execute("SELECT state FROM ledger.campaign WHERE id = %s",
                                               (cid,)).fetchone()["state"] in ("attempted", "exhausted"),
                         timeout=90, what="the attempt after the leaking one")
    finally:
        worker.kill()
        worker.wait()
    first, second = admin.execute("SELECT outcome, fingerprint, failure_reason FROM ledger.attempt "
                                  "WHERE campaign_id = %s ORDER BY attempt_no", (cid,)).fetchall()[:2]
    assert first["outcome"] == "failed" and "output.secret" in first["failure_reason"]
    assert first["fingerprint"] is None  # the attempt is refused, not its approach
    assert second["outcome"] == "attempted", second["failure_reason"]
    [event] = admin.execute("SELECT details FROM ledger.security_event WHERE campaign_id = %s "
                            "AND action = 'output.secret'", (cid,)).fetchall()
    assert event["details"]["fingerprint"] == second["fingerprint"]  # kept, for operators
    assert token not in stored(admin, tmp_path / "data")
