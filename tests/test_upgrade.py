"""Upgrades that keep every row: a database made and filled by each supported
release, with that release's own code (tests/releases.py), migrated by this
one -- nothing lost, nothing of an old column's meaning changed, the same
catalog as a fresh database, the guards holding -- and then the whole loop of
this release closing on it, for campaigns that were leased or verified when
the upgrade happened too. Also: released revisions never change, and the
code knows which schema it needs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

import releases
from catalog import catalog
from conftest import stop_process
from drive import scaled
from ledger.db import migrations
from ledger.db.embedded import create_database, drop_database
from ledger.release import RELEASES, SCHEMA
from ledger.sandbox import cell as cells

ROOT = Path(__file__).resolve().parents[1]
#: A prefix of its own: logins are rotated here, and roles are cluster-wide.
PREFIX = "ledgerup_"
SUPPORTED = [r.version for r in RELEASES]


def test_released_revisions_never_change() -> None:
    released = migrations.released()
    assert "0001_baseline" in released and len(released) >= 3
    steps = {s.revision: s for s in migrations.steps()}
    for revision, digest in released.items():
        assert steps[revision].digest() == digest, (
            f"{revision} is released and has changed: put the change in a new revision "
            "(python -m ledger.db.revise new ...)")


def test_the_code_knows_the_schema_it_needs_and_every_release_it_upgrades() -> None:
    assert SCHEMA == migrations.head()
    history = migrations.history()
    released = migrations.released()
    for r in RELEASES:
        assert r.schema in history
        # every revision up to a release's head is released
        assert set(history[:history.index(r.schema) + 1]) <= set(released), r.version
        assert releases.have_history(r), f"{r.version}'s commit is not in this clone"


def test_ledger_version_names_the_release_and_schema() -> None:
    proc = subprocess.run([sys.executable, "-m", "ledger", "--version"], capture_output=True,
                          text=True, check=True)
    from ledger.release import RELEASE

    assert proc.stdout.strip() == f"ledger {RELEASE} (schema {SCHEMA})"


@pytest.fixture
def databases(pg_admin_url: str) -> Iterator[Any]:
    made: list[str] = []

    def make() -> str:
        name = f"ledgertest_up_{uuid.uuid4().hex[:8]}"
        made.append(name)
        return create_database(pg_admin_url, name)

    yield make
    for name in made:
        drop_database(pg_admin_url, name)


def run(cmd: list[str], env: dict[str, str], *, timeout: float = 180, check: bool = True,
        cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=scaled(timeout),
                          cwd=cwd)
    if check:
        assert proc.returncode == 0, f"{cmd}: exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc


def base_env(url: str, home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LEDGER_")}
    env.update(LEDGER_DATABASE_URL=url, LEDGER_ROLE_PREFIX=PREFIX, LEDGER_DATA_DIR=str(home / "data"),
               NO_COLOR="1", COLUMNS="200", LEDGER_LOG_LEVEL="warning")
    return env


@pytest.mark.parametrize("version", SUPPORTED)
def test_an_empty_database_of_each_release_upgrades_to_a_fresh_ones_catalog(
        version: str, databases: Any, tmp_path: Path) -> None:
    old, fresh = databases(), databases()
    run(releases.ledger_command(version) + ["migrate"], base_env(old, tmp_path))
    run(releases.current_ledger() + ["migrate"], base_env(old, tmp_path))
    run(releases.current_ledger() + ["migrate"], base_env(fresh, tmp_path))
    assert migrations.current(old) == SCHEMA
    upgraded, built = catalog(old), catalog(fresh)
    for kind in built:
        assert upgraded[kind] == built[kind], kind


# --- a filled database -----------------------------------------------------------------

AGENT = '''\
"""The test's agent: adds where the code subtracts."""
import os
from pathlib import Path

source = Path("calc.py")
source.write_text(source.read_text().replace("return a - b", "return a + b"))
message = os.environ.get("LEDGER_COMMIT_MESSAGE_FILE")
if message:
    Path(message).write_text("calc: add adds\\n")
'''


def make_repository(path: Path) -> None:
    path.mkdir(parents=True)
    (path / "calc.py").write_text('def add(a, b):\n    return a - b\n')
    (path / "test_calc.py").write_text(
        "import unittest\n\nfrom calc import add\n\n\nclass AddTest(unittest.TestCase):\n"
        "    def test_add(self):\n        self.assertEqual(add(2, 3), 5)\n")
    git = ["git", "-C", str(path), "-c", "user.name=T", "-c", "user.email=t@example.org"]
    subprocess.run(["git", "init", "-q", "-b", "main", str(path)], check=True)
    subprocess.run(git + ["add", "."], check=True)
    subprocess.run(git + ["commit", "-qm", "calc"], check=True)


LIVE = ("live-a", "live-b", "live-c")  # verified / leased / ready when the upgrade happens


def config(version: str | None, work: Path) -> str:
    """ledger.toml for release ``version`` (None: this one): the live classes
    with a sensor each, and the history class nobody serves."""
    out = []
    for name in (*LIVE, "history"):
        repo = work / name
        out.append(f'''
[classes.{name}]
repository = "{repo}"
base_ref = "main"
attempt_command = ["python3", "{work / 'agent.py'}"]
attempt_timeout_s = 60
max_attempts = 3
lease_s = {5 if name == "live-b" else 30}
heartbeat_s = 1
promote_to = "refs/heads/main"
authority.worker = {{ refs = ["refs/heads/ledger/*"] }}

[classes.{name}.acceptance]
commands = [["python3", "-m", "unittest", "-q"]]
timeout_s = 60
''')
        if name == "history":
            continue
        if version == "0.1.0":  # sensors ran their command where they stood
            command = (f'["python3", "{releases.installed(version) / "source" / "examples" / "run_tests_at.py"}", '
                       f'"{repo}", "main"]')
        else:  # in an export of the target's ref, in a cell
            command = '["python3", "-m", "unittest", "-q"]'
        out.append(f'''
[sensors.{name}-tests]
target = "{repo}#main"
every_s = 1
command = {command}
class = "{name}"
objective = "tests-pass:{{target}}"
''')
    return "".join(out)


OLD_COLUMNS = """
    SELECT c.relname, array_agg(a.attname::text ORDER BY a.attnum)
      FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
      JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
     WHERE n.nspname = 'ledger' AND c.relkind = 'r'
     GROUP BY c.relname"""


def table_digests(url: str, columns: dict[str, list[str]] | None = None) -> tuple[dict[str, list[str]], dict[str, tuple[int, str]]]:
    """Each table's columns, and its row count and a digest of those columns'
    values in every row (ordered by the whole row)."""
    with psycopg.connect(url) as conn:
        found = {r[0]: r[1] for r in conn.execute(OLD_COLUMNS)}
        columns = columns or found
        out = {}
        for table, cols in columns.items():
            if table in ("transition", "meta", "state", "actor"):  # reference rows: the catalog checks them
                continue
            listed = sql.SQL(", ").join(sql.Identifier(c) for c in cols)
            row = conn.execute(sql.SQL(
                "SELECT count(*), coalesce(md5(string_agg(r::text, E'\\n' ORDER BY r::text)), '') "
                "FROM (SELECT {} FROM ledger.{}) r").format(listed, sql.Identifier(table))).fetchone()
            assert row is not None
            out[table] = (row[0], row[1])
        return columns, out


def journal_gaps(url: str) -> list[tuple[int, int, int]]:
    """Campaigns whose journal is not 1..n with n its event_seq."""
    with psycopg.connect(url) as conn:
        return conn.execute("""
            SELECT c.id, count(e.seq)::int, c.event_seq::int
              FROM ledger.campaign c LEFT JOIN ledger.campaign_event e ON e.campaign_id = c.id
             GROUP BY c.id
            HAVING count(e.seq) <> max(e.seq) OR min(e.seq) <> 1 OR max(e.seq) <> c.event_seq""").fetchall()


def settled(url: str, ids: list[int]) -> list[tuple[Any, ...]]:
    """The rows of campaigns ``ids`` and of their journals."""
    with psycopg.connect(url) as conn:
        return conn.execute(
            "SELECT c::text, (SELECT count(*) FROM ledger.campaign_event e WHERE e.campaign_id = c.id) "
            "FROM ledger.campaign c WHERE c.id = ANY (%s) ORDER BY c.id", (ids,)).fetchall()


def states(url: str) -> dict[int, str]:
    with psycopg.connect(url) as conn:
        return dict(conn.execute("SELECT id, state FROM ledger.campaign"))


def live_campaign(url: str, class_: str) -> tuple[int, str]:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT id, state FROM ledger.campaign WHERE class = %s ORDER BY id DESC LIMIT 1",
                           (class_,)).fetchone()
        assert row is not None, class_
        return row[0], row[1]


def wait_for(what: str, check: Any, timeout: float, procs: list[subprocess.Popen[str]]) -> None:
    deadline = time.monotonic() + scaled(timeout)
    while not check():
        for p in procs:
            assert p.poll() is None, f"{p.args!r} exited {p.returncode} while waiting for {what}"
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.2)


def start(cmd: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[str]:
    out = open(log, "w")
    return subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, text=True)


def logs(paths: list[Path]) -> str:
    return "\n".join(f"== {p.name}\n" + "\n".join(p.read_text(errors="replace").splitlines()[-25:])
                     for p in paths if p.exists())


@pytest.mark.slow
@pytest.mark.skipif(cells.bubblewrap() is None,
                    reason="bubblewrap is not installed (apt-get install bubblewrap)")
@pytest.mark.parametrize("version", SUPPORTED)
def test_a_filled_database_of_each_release_upgrades_with_nothing_lost_and_the_loop_closes_on_it(
        version: str, databases: Any, tmp_path: Path) -> None:
    url = databases()
    work = tmp_path / "work"
    work.mkdir()
    (work / "agent.py").write_text(AGENT)
    for name in (*LIVE, "history"):
        make_repository(work / name)
    env = base_env(url, tmp_path)
    old = releases.ledger_command(version)
    new = releases.current_ledger()
    logs_of: list[Path] = []

    # --- the release's own code makes and fills the database ---
    run(old + ["migrate"], env)
    logins = run(old + ["logins", "create", "--rotate"], env).stdout
    login_env = dict(line.split("=", 1) for line in logins.split() if "=" in line)
    login_env = {k: v.strip("'") for k, v in login_env.items()}
    assert set(login_env) >= {"LEDGER_WORKER_DATABASE_URL", "LEDGER_VERIFIER_DATABASE_URL"}, logins
    role_env = {**env, **login_env}
    run(old + ["demo"], {**env, "LEDGER_DATA_DIR": str(tmp_path / "demo")}, timeout=120)
    (work / "old.toml").write_text(config(version, work))
    (work / "new.toml").write_text(config(None, work))
    old_env = {**role_env, "LEDGER_CONFIG": str(work / "old.toml")}
    run(old + ["classes", "sync"], {**env, "LEDGER_CONFIG": str(work / "old.toml")})
    run(old + ["sensor", "run", "--once"], old_env)  # a campaign per live class, all red
    filled = json.loads(run([releases.python(version), str(Path(__file__).with_name("upgrade_fill.py")),
                             url, PREFIX, "history", "live-b"], env).stdout)
    # live-a: the release's worker and verifier take it to verified; no dispatcher yet
    procs = [start(old + ["worker", "--class", "live-a"], old_env, tmp_path / "old-worker.log"),
             start(old + ["verifier", "--class", "live-a"], old_env, tmp_path / "old-verifier.log")]
    logs_of += [tmp_path / "old-worker.log", tmp_path / "old-verifier.log"]
    try:
        wait_for("live-a verified by the old release",
                 lambda: live_campaign(url, "live-a")[1] == "verified", 90, procs)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{logs(logs_of)}") from None
    finally:
        for p in procs:
            stop_process(p)
    before_states = states(url)
    assert before_states[filled["live_leased"][0]] == "leased"
    assert live_campaign(url, "live-c")[1] == "ready"
    assert sorted(set(before_states.values())) == sorted(
        {"ready", "leased", "attempted", "verified", "confirmed", "exhausted", "abandoned", "dismissed"})
    columns, before = table_digests(url)
    assert before["attempt"][0] >= 6 and before["verification"][0] >= 3 and before["side_effect"][0] >= 2
    assert before["observation"][0] >= 4 and before["campaign_event"][0] >= 40
    assert journal_gaps(url) == []

    # --- this release migrates it ---
    migrated = run(new + ["migrate"], env)
    assert migrations.current(url) == SCHEMA, migrated.stderr
    _, after = table_digests(url, columns)
    assert after == before, "a row was lost, or an old column's value changed"
    assert states(url) == before_states
    assert journal_gaps(url) == []
    fresh = databases()
    migrations.upgrade(fresh, PREFIX)
    upgraded, built = catalog(url), catalog(fresh)
    for kind in built:
        assert upgraded[kind] == built[kind], kind
    with psycopg.connect(url) as conn:  # the guards hold on the old rows
        conn.execute(f"SET ROLE {PREFIX}owner")
        for attempt in ("UPDATE ledger.campaign SET state = 'ready' WHERE state = 'confirmed'",
                        "UPDATE ledger.campaign SET generation = generation - 1 WHERE state = 'leased'",
                        "DELETE FROM ledger.campaign_event WHERE seq = 1"):
            with pytest.raises(psycopg.Error) as refused, conn.transaction():
                conn.execute(attempt)
            assert refused.value.sqlstate in ("LG002", "LG009"), attempt

    # --- this release's whole loop closes on it, with the logins the release made ---
    settled_ids = [cid for cid, state in before_states.items()
                   if state in ("confirmed", "exhausted", "abandoned", "dismissed")]
    settled_before = settled(url, settled_ids)
    new_env = {**role_env, "LEDGER_CONFIG": str(work / "new.toml")}
    run(new + ["classes", "sync"], {**env, "LEDGER_CONFIG": str(work / "new.toml")})
    classes = [arg for name in LIVE for arg in ("--class", name)]
    procs = [start(new + ["sensor", "run"], new_env, tmp_path / "sensor.log"),
             start(new + ["worker", *classes], new_env, tmp_path / "worker.log"),
             start(new + ["verifier", *classes], new_env, tmp_path / "verifier.log"),
             start(new + ["dispatcher"], new_env, tmp_path / "dispatcher.log")]
    logs_of += [tmp_path / n for n in ("sensor.log", "worker.log", "verifier.log", "dispatcher.log")]
    try:
        wait_for("every live campaign confirmed",
                 lambda: all(live_campaign(url, c)[1] == "confirmed" for c in LIVE), 150, procs)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{states(url)}\n{logs(logs_of)}") from None
    finally:
        for p in procs:
            stop_process(p)
    assert journal_gaps(url) == []
    with psycopg.connect(url) as conn:
        # each live campaign promoted exactly once, onto its repository's main
        done = conn.execute("""SELECT c.class, count(*) FROM ledger.side_effect s
                                 JOIN ledger.campaign c ON c.id = s.campaign_id
                                WHERE s.purpose = 'promotion' AND s.state = 'done' AND c.class = ANY (%s)
                                GROUP BY c.class""", (list(LIVE),)).fetchall()
        assert dict(done) == {c: 1 for c in LIVE}
        # no lease ran its attempt twice
        twice = conn.execute("""SELECT campaign_id, generation, count(*) FROM ledger.campaign_event
                                 WHERE type = 'attempt.started' GROUP BY 1, 2 HAVING count(*) > 1""").fetchall()
        assert twice == []
        # the leased campaign's lost lease was charged to the gone worker's attempt, once
        lost = conn.execute("""SELECT count(*) FROM ledger.campaign_event WHERE campaign_id = %s
                                AND type = 'transition' AND payload ->> 'transition' = 'expire_lease'""",
                            (filled["live_leased"][0],)).fetchone()
        assert lost is not None and lost[0] == 1
    for name in LIVE:
        log = subprocess.run(["git", "-C", str(work / name), "log", "-1", "--format=%B", "main"],
                             capture_output=True, text=True, check=True).stdout
        assert "Ledger-Campaign" in log or "campaign" in log.lower(), log
    # the campaigns the release had settled are as it left them
    assert settled(url, settled_ids) == settled_before
