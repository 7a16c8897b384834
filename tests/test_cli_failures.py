"""Every command, run against a database it cannot use, says why in one line
with a hint and exits with its documented code (docs: reference/errors.md).

The commands are found by walking the typer app, so a new command is covered
(or this test fails until it is given sample arguments below)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psycopg
import pytest
import typer.main
from psycopg.conninfo import make_conninfo

from conftest import TEST_PREFIX
from ledger.cli import app
from ledger.cli.failures import EXIT_CODES
from ledger.errors import CodeTooOld, DatabaseMissing, InvalidInput, NotMigrated, Unavailable
from ledger.ops.gitserver import bare_repository

#: Sample values for every required argument or option, by parameter name.
SAMPLES: dict[str, list[str]] = {
    "class_": ["demo-class"],
    "name": ["demo-class"],  # classes pause, resume
    "objective_key": ["objective"],
    "target": ["target"],
    "campaign_id": ["1"],
    "campaign_ids": ["1"],
    "names": ["intake"],  # drill: a drill that uses the given server
    "role": ["reader"],
    "older_than": ["--older-than", "1d"],
    "key": ["repo:app"],  # limits set
    "resource": ["model-a"],  # limits bucket
}
#: Commands that never touch a database: they must still work.
OFFLINE = {("token", "create")}
#: Options that keep a long-running command from waiting, or from running on
#: (a service waits out what keeps it from starting unless --wait-for-start 0:
#: tests/test_startup.py).
BOUNDED = {
    ("worker",): ["--wait-for-database", "0", "--wait-for-start", "0"],
    ("run",): ["--wait-for-database", "0", "--wait-for-start", "0", "--no-sensors"],
    ("verifier",): ["--wait-for-database", "0", "--wait-for-start", "0"],
    ("dispatcher",): ["--wait-for-database", "0", "--wait-for-start", "0"],
    ("sensor", "run"): ["--wait-for-database", "0", "--once"],
    ("serve",): ["--port", "0"],
    ("deny",): ["--reason", "the test denies it"],  # (its reason is required before any database)
}
NEEDS_CONFIG = {("worker",), ("run",), ("sensor", "run"), ("gc",), ("classes", "sync")}


def leaf_commands() -> Iterator[tuple[tuple[str, ...], Any]]:
    def walk(group: Any, path: tuple[str, ...]) -> Iterator[tuple[tuple[str, ...], Any]]:
        for name, command in sorted(group.commands.items()):
            if hasattr(command, "commands"):
                yield from walk(command, (*path, name))
            else:
                yield (*path, name), command
    yield from walk(typer.main.get_command(app), ())


def argv(path: tuple[str, ...], command: Any, config: Path) -> list[str]:
    args = list(path)
    for param in command.params:
        if param.required:
            assert param.name in SAMPLES, f"give `ledger {' '.join(path)}` a sample {param.name}"
            args += SAMPLES[param.name]
    if path in NEEDS_CONFIG:
        args += ["--config", str(config)]
    return args + BOUNDED.get(path, [])


@pytest.fixture
def config(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    bare_repository(tmp_path, "repo", {"README": "x\n"})  # a base_ref to check up front
    path = tmp_path / "ledger.toml"
    path.write_text(f'[classes.demo-class]\nrepository = "{repo}"\nattempt_command = ["true"]\n')
    return path


def run_all(url: str, tmp_path: Path, config: Path, *, skip: frozenset[tuple[str, ...]] = frozenset(),
            ) -> dict[tuple[str, ...], subprocess.CompletedProcess[str]]:
    env = {**os.environ, "LEDGER_DATABASE_URL": url, "LEDGER_ROLE_PREFIX": TEST_PREFIX,
           "LEDGER_DATA_DIR": str(tmp_path / "data"), "NO_COLOR": "1"}
    env.pop("LEDGER_DEBUG", None)
    every = list(leaf_commands())
    assert len(every) >= 20, every  # the walk found the app's commands
    commands = [(path, argv(path, command, config)) for path, command in every
                if path not in OFFLINE | skip]

    def one(args: list[str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "ledger", *args], env=env, cwd=tmp_path,
                              capture_output=True, text=True, timeout=120)
    with ThreadPoolExecutor(max_workers=3) as pool:
        done = list(pool.map(one, [args for _, args in commands]))
    return {path: proc for (path, _), proc in zip(commands, done, strict=True)}


def assert_one_line(results: dict[tuple[str, ...], subprocess.CompletedProcess[str]],
                    code: int, *fragments: str) -> None:
    wrong = {}
    for path, proc in results.items():
        lines = proc.stderr.strip().splitlines()
        if path in BOUNDED:
            # a service may have logged its tries (structured records) before giving up
            lines = [line for line in lines if not line.startswith("{")]
        if (proc.returncode != code or len(lines) != 1 or not lines[0].startswith("ledger: ")
                or "Traceback" in proc.stderr or not all(f in lines[0] for f in fragments)):
            wrong[" ".join(path)] = (proc.returncode, proc.stderr[-600:])
    assert not wrong, wrong


def test_every_command_against_an_unreachable_server(tmp_path: Path, config: Path) -> None:
    results = run_all("postgresql://postgres@127.0.0.1:1/ledger?connect_timeout=2",
                      tmp_path, config)
    assert_one_line(results, Unavailable.exit_code, "cannot connect to the database at "
                    "127.0.0.1:1", "hint: is PostgreSQL running there?")


def test_every_command_against_a_missing_database(pg_admin_url: str, tmp_path: Path,
                                                  config: Path) -> None:
    name = f"ledgertest_missing_{uuid.uuid4().hex[:8]}"
    results = run_all(make_conninfo(pg_admin_url, dbname=name), tmp_path, config)
    assert_one_line(results, DatabaseMissing.exit_code, f'database "{name}" does not exist',
                    "ledger migrate --create-database")


def test_every_command_against_an_unmigrated_database(pg_admin_url: str, tmp_path: Path,
                                                      config: Path) -> None:
    name = f"ledgertest_empty_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        # migrate and demo migrate it (that is their job), a drill makes databases of
        # its own next to it; every other command says to migrate.
        results = run_all(make_conninfo(pg_admin_url, dbname=name), tmp_path, config,
                          skip=frozenset({("migrate",), ("demo",), ("drill",)}))
        assert_one_line(results, NotMigrated.exit_code, "hint: run `ledger migrate`")
    finally:
        with psycopg.connect(pg_admin_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_migrate_create_database(pg_admin_url: str, tmp_path: Path) -> None:
    name = f"ledgertest_created_{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "LEDGER_DATABASE_URL": make_conninfo(pg_admin_url, dbname=name),
           "LEDGER_ROLE_PREFIX": TEST_PREFIX, "NO_COLOR": "1"}
    try:
        proc = subprocess.run([sys.executable, "-m", "ledger", "migrate", "--create-database"],
                              env=env, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        assert f"created database {name}" in proc.stderr and "schema migrated" in proc.stderr
        listed = subprocess.run([sys.executable, "-m", "ledger", "list", "--json"], env=env,
                                capture_output=True, text=True, timeout=60)
        assert listed.returncode == 0 and listed.stdout.strip() == "[]", listed.stderr
    finally:
        with psycopg.connect(pg_admin_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')



def errors_reference() -> str:
    """docs/reference/errors.md as the documentation site generates it."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("ledger_docs_gen",
                                                  Path(__file__).parents[1] / "docs" / "gen.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return str(module.errors_page())


def test_offline_commands_and_the_exit_code_table(tmp_path: Path) -> None:
    env = {**os.environ, "LEDGER_DATABASE_URL": "postgresql://postgres@127.0.0.1:1/x"}
    for path in OFFLINE:
        proc = subprocess.run([sys.executable, "-m", "ledger", *path, *SAMPLES["role"]], env=env,
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
    helped = subprocess.run([sys.executable, "-m", "ledger", "--help"], env=env,
                            capture_output=True, text=True, timeout=60).stdout
    # The documentation's table is generated from the same EXIT_CODES (docs/gen.py).
    documented = errors_reference()
    for code, meaning in EXIT_CODES:
        assert f"{code:>3}  {meaning}" in helped
        assert f"| {code} | {meaning} |" in documented, f"exit code {code} is not in the docs' table"


def test_readiness_tells_the_schema_revision_apart(db_url: str, admin: psycopg.Connection) -> None:
    from ledger.db.readiness import diagnose

    assert diagnose(db_url, TEST_PREFIX) is None  # migrated to head: ready
    missing_roles = diagnose(db_url, "nosuchprefix_")
    assert isinstance(missing_roles, NotMigrated) and "nosuchprefix_" in missing_roles.message
    admin.execute("UPDATE alembic_version SET version_num = '9999_from_the_future'")
    # a newer schema that still serves this code (expand): ready
    assert diagnose(db_url, TEST_PREFIX) is None
    admin.execute("SET ledger.migrating = on")
    admin.execute("UPDATE ledger.meta SET value = '9998_contracted' WHERE key = 'oldest_client'")
    newer = diagnose(db_url, TEST_PREFIX)
    assert type(newer) is CodeTooOld and "older than this database serves" in newer.message
    assert newer.hint == "upgrade Ledger on this machine" and newer.exit_code == 14
    admin.execute("DELETE FROM alembic_version")
    never = diagnose(db_url, TEST_PREFIX)
    assert isinstance(never, NotMigrated) and never.hint == "run `ledger migrate`"


@pytest.mark.parametrize("before", [[], ["--data-dir", "DATA"]], ids=["plain", "after-global-option"])
def test_a_service_stopped_while_it_waits_for_the_database_exits_cleanly(tmp_path: Path,
                                                                          before: list[str]) -> None:
    """SIGTERM before the host runs (here: while the worker waits for an
    unreachable server at start-up) is a clean stop, exit 0, not death by
    signal (-15): a supervisor or a drill may stop a worker it just started,
    with or without global options before the command."""
    repo = tmp_path / "repo"
    bare_repository(tmp_path, "repo", {"README": "x\n"})  # a base_ref to check up front
    config = tmp_path / "ledger.toml"
    config.write_text(f'[classes.c]\nrepository = "{repo}"\nattempt_command = ["true"]\n')
    env = {**os.environ, "LEDGER_DATABASE_URL": "postgresql://postgres@127.0.0.1:1/x?connect_timeout=1",
           "LEDGER_DATA_DIR": str(tmp_path / "data")}
    globals_ = [str(tmp_path / "data") if a == "DATA" else a for a in before]
    worker = subprocess.Popen([sys.executable, "-m", "ledger", *globals_, "worker", "--config", str(config),
                               "--wait-for-database", "60"], env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True)
    assert worker.stderr is not None
    worker.stderr.readline()  # its first complaint: it is waiting, before the host runs
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(30) == 0


@pytest.mark.parametrize(("argv", "service"), [
    (["worker"], True), (["--database-url", "u", "worker", "-c", "2"], True),
    (["sensor", "run"], True), (["sensor", "run", "--once"], False), (["verifier", "--once"], False),
    (["gc"], False), (["gc", "--every", "60"], True), (["trim", "--older-than", "7d"], False),
    (["list"], False), (["--data-dir", "worker", "list"], False),
])
def test_only_long_running_services_treat_an_early_sigterm_as_a_clean_stop(
        argv: list[str], service: bool) -> None:
    """A one-shot command interrupted by SIGTERM must not exit 0 as if it had
    finished; global options (and their values) come before the command. What
    decides is the command's own declaration (``ledger.runtime.commands``) and the
    parameters click parsed, not a second reading of argv."""
    import typer.main

    from ledger.cli import app
    from ledger.runtime.commands import is_service

    command: Any = typer.main.get_command(app)
    ctx = command.make_context("ledger", list(argv), resilient_parsing=True)
    while hasattr(command, "commands"):
        rest = [*(getattr(ctx, "protected_args", None) or getattr(ctx, "_protected_args", [])),
                *ctx.args]
        name, command, rest = command.resolve_command(ctx, rest)
        ctx = command.make_context(name, rest, parent=ctx, resilient_parsing=True)
    assert is_service(command.callback, ctx.params) is service


def test_a_one_shot_command_stopped_while_it_waits_is_not_a_clean_stop(tmp_path: Path) -> None:
    """The other side of the declaration, in real processes: ``dispatcher`` is
    a service, ``dispatcher --once`` is not; both wait for an unreachable
    server at start-up, and SIGTERM then stops the first cleanly (exit 0) and
    the second by the signal (-15), not as if it had finished."""
    env = {**os.environ, "LEDGER_DATABASE_URL": "postgresql://postgres@127.0.0.1:1/x?connect_timeout=1",
           "LEDGER_DATA_DIR": str(tmp_path / "data")}
    codes = {}
    for argv in (["dispatcher"], ["dispatcher", "--once"]):
        proc = subprocess.Popen([sys.executable, "-m", "ledger", *argv, "--wait-for-database", "60"],
                                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        assert proc.stderr is not None
        try:
            # started, and still before the host: it says it waits
            assert any("waiting for the database" in line for line in proc.stderr)
            proc.send_signal(signal.SIGTERM)
            codes[" ".join(argv)] = proc.wait(30)
        finally:
            proc.kill()
            proc.wait()
    assert codes == {"dispatcher": 0, "dispatcher --once": -signal.SIGTERM}


# --- one exit code per cause, a hint that names it --------------------------------------


def ledger(args: list[str], env: dict[str, str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ledger", *args], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "NO_COLOR": "1", **env}, **kwargs)


def one_line(proc: subprocess.CompletedProcess[str], code: int, *fragments: str) -> str:
    lines = [line for line in proc.stderr.strip().splitlines() if not line.startswith("{")]
    assert proc.returncode == code, (proc.returncode, proc.stderr[-2000:])
    assert len(lines) == 1 and lines[0].startswith("ledger: "), proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert all(f in lines[0] for f in fragments), lines[0]
    return lines[0]


def test_serve_on_a_busy_port_is_not_a_stale_lease(db_url: str, tmp_path: Path) -> None:
    """uvicorn exits 3 when it cannot bind, which is "stale lease" in the table."""
    from ledger.errors import CannotListen, StaleLease

    env = {"LEDGER_DATABASE_URL": db_url, "LEDGER_ROLE_PREFIX": TEST_PREFIX}
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = ledger(["serve", "--port", str(port)], env)
    assert CannotListen.exit_code != StaleLease.exit_code
    one_line(proc, CannotListen.exit_code, f"port {port} on 127.0.0.1 is already in use",
             "choose another --port")


def test_every_command_with_a_login_the_server_refuses(pg_admin_url: str, tmp_path: Path,
                                                       config: Path) -> None:
    """The server answered: the hint is about the login, not "is PostgreSQL running"."""
    from ledger.errors import LoginRefused

    user = f"{TEST_PREFIX}nobody_{uuid.uuid4().hex[:6]}"
    results = run_all(make_conninfo(pg_admin_url, user=user), tmp_path, config,
                      skip=frozenset({("demo",)}))
    assert_one_line(results, LoginRefused.exit_code, f'refused the login of user "{user}"',
                    "hint: check the user and password")
    assert not any("is PostgreSQL running" in p.stderr for p in results.values())


def test_a_wrong_password_is_a_refused_login_and_the_password_is_not_shown(tmp_path: Path) -> None:
    """A server that asks for a password (a throwaway embedded one, with a
    scram-sha-256 rule for one user) and is given the wrong one."""
    from ledger.db.embedded import discard, pg_ctl, server_of, server_url
    from ledger.errors import LoginRefused

    data = tmp_path / "pw"
    admin = server_url(data, cleanup="delete")
    try:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute("SET password_encryption = 'scram-sha-256'")
            conn.execute("CREATE ROLE pwuser LOGIN PASSWORD 'the-right-one'")
        hba = data / "pgdata" / "pg_hba.conf"
        hba.write_text("local all pwuser scram-sha-256\n" + hba.read_text())
        server = server_of(data)
        assert server is not None
        pg_ctl(server, "reload")
        wrong = make_conninfo(admin, user="pwuser", password="not-it-7f3a")

        def refused() -> bool:
            try:
                psycopg.connect(wrong).close()
            except psycopg.OperationalError:
                return True
            return False
        deadline = time.monotonic() + 30
        while not refused():  # the reload takes effect a moment later
            assert time.monotonic() < deadline, "the scram rule never took effect"
            time.sleep(0.05)  # polling interval of the condition above
        proc = ledger(["list"], {"LEDGER_DATABASE_URL": wrong, "LEDGER_ROLE_PREFIX": TEST_PREFIX})
        line = one_line(proc, LoginRefused.exit_code, 'refused the login of user "pwuser"',
                        "hint: check the user and password")
        assert "not-it-7f3a" not in proc.stderr and "is PostgreSQL running" not in line
    finally:
        discard(data)


@pytest.mark.parametrize(("url", "says"), [
    ("postgresql+psycopg://postgres@127.0.0.1/x", "drop the +psycopg"),
    ("mysql://root:hunter2@127.0.0.1/x", "it starts mysql://"),
    ("not a url", "neither a postgresql:// URL nor a key=value conninfo string"),
    ("postgresql://postgres@127.0.0.1:99999/x", "port '99999' is not a number from 1 to 65535"),
], ids=["sqlalchemy", "mysql", "words", "port"])
def test_a_malformed_database_url_is_one_line_and_a_config_error(url: str, says: str) -> None:
    from ledger.errors import ConfigError

    proc = ledger(["list"], {"LEDGER_DATABASE_URL": url})
    one_line(proc, ConfigError.exit_code, "LEDGER_DATABASE_URL / --database-url: ", says)
    assert "hunter2" not in proc.stderr and 'missing "="' not in proc.stderr


def test_an_invalid_setting_is_one_line_naming_the_variable() -> None:
    from ledger.errors import ConfigError

    proc = ledger(["list"], {"LEDGER_ROLE_PREFIX": "Not-A-Prefix"})
    one_line(proc, ConfigError.exit_code, "LEDGER_ROLE_PREFIX / --role-prefix: ")


@pytest.fixture
def registered(db_url: str, config: Path) -> dict[str, str]:
    env = {"LEDGER_DATABASE_URL": db_url, "LEDGER_ROLE_PREFIX": TEST_PREFIX,
           "LEDGER_CONFIG": str(config)}
    synced = ledger(["classes", "sync"], env)
    assert synced.returncode == 0, synced.stderr
    return env


@pytest.mark.parametrize(("args", "says"), [
    (["demo-class", "", "target"], "objective key must be 1 to 500 characters long, not 0"),
    (["demo-class", "x" * 501, "target"], "objective key must be 1 to 500 characters long, not 501"),
    (["demo-class", "objective", ""], "target must be 1 to 2000 characters long, not 0"),
    (["demo-class", "objective", "t", "--priority", "99999999999"],
     "--priority / LEDGER_OPEN_PRIORITY: must be ≥ -1000000 and ≤ 1000000, not 99999999999"),
    (["demo-class", "objective", "t", "--priority", "-1000001"],
     "--priority / LEDGER_OPEN_PRIORITY: must be ≥ -1000000 and ≤ 1000000, not -1000001"),
], ids=["empty-objective", "long-objective", "empty-target", "huge-priority", "low-priority"])
def test_open_refuses_bad_input_in_words(registered: dict[str, str], args: list[str],
                                         says: str) -> None:
    proc = ledger(["open", *args], registered)
    line = one_line(proc, InvalidInput.exit_code, says)
    assert "check constraint" not in line and "type integer" not in line


@pytest.mark.parametrize(("args", "code", "says"), [
    (["--state", "bogus"], 2, "--state: unknown state bogus (one of ready, leased"),
    (["--state", "ready", "--class", "nope"], 6, "--class: no campaign class nope is registered "
                                                 "(registered: demo-class)"),
    (["--search", "x" * 201], 2, "--search: at most 200 characters"),
], ids=["state", "class", "search"])
def test_list_refuses_the_filters_the_api_refuses(registered: dict[str, str], args: list[str],
                                                  code: int, says: str) -> None:
    proc = ledger(["list", *args], registered)
    one_line(proc, code, says)
    assert proc.stdout == ""  # not an empty table


def test_list_with_good_filters_still_lists(registered: dict[str, str]) -> None:
    opened = ledger(["open", "demo-class", "objective", "target"], registered)
    assert opened.returncode == 0, opened.stderr
    listed = ledger(["list", "--state", "ready", "--class", "demo-class", "--json"], registered)
    assert listed.returncode == 0, listed.stderr
    assert [c["objective_key"] for c in json.loads(listed.stdout)] == ["objective"]
