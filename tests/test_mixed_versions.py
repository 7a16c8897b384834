"""Code and schema of different releases: a command whose code needs a newer
schema than the database has, or is older than the database still serves,
is refused -- one line naming both versions, exit 14 -- and writes nothing;
one command per family of the command line. The refusal is the database's
(``ledger_api.hello``, the greeting every session or transaction starts
with): it holds for any client that greets, whatever it checks itself.
(docs/upgrading.md says what may run together.)"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from conftest import TEST_PREFIX
from drive import scaled
from ledger.db import migrations
from ledger.db.embedded import create_database, drop_database
from ledger.release import RELEASE, RELEASES, SCHEMA

PREVIOUS = RELEASES[-1]

#: One command per family (the CLI's modules), each one that would write or
#: read through a runtime role; ``{config}`` is a valid ledger.toml.
ONE_SHOT = {
    "campaigns (open)": ["open", "some-class", "objective-1", "target-1"],
    "campaigns (list)": ["list"],
    "campaigns (abandon)": ["abandon", "1", "--reason", "mixed versions"],
    "campaigns (report)": ["report", "--json"],
    "classes (sync)": ["classes", "sync", "--config", "{config}"],
    "classes (pause)": ["classes", "pause", "some-class"],
    "journal (tail)": ["tail", "1"],
    "journal (trim)": ["trim", "--older-than", "1d"],
    "gc": ["gc", "--config", "{config}"],
    "logins": ["logins", "create"],
    "graph": ["graph", "-o", "-", "--format", "mermaid"],
}
#: Long-running services, asked to start.
SERVICES = {
    "worker": ["worker", "--config", "{config}"],
    "verifier": ["verifier"],
    "dispatcher": ["dispatcher"],
    "sensor": ["sensor", "run", "--config", "{config}"],
    "run": ["run", "--config", "{config}"],
    "serve": ["serve", "--port", "0"],
    "mcp": ["mcp", "--transport", "http", "--port", "0"],
}

CONFIG = """
[classes.some-class]
repository = "{repo}"
attempt_command = ["true"]
"""


@pytest.fixture
def mixed(pg_admin_url: str, tmp_path: Path) -> Iterator[tuple[str, dict[str, str]]]:
    name = f"ledgertest_mixed_{os.getpid()}_{os.urandom(3).hex()}"
    url = create_database(pg_admin_url, name)
    repo = tmp_path / "repo"
    subprocess.run(["git", "init", "-q", "-b", "main", str(repo)], check=True)
    subprocess.run(["git", "-C", str(repo), "-c", "user.name=T", "-c", "user.email=t@e.org", "commit",
                    "-q", "--allow-empty", "-m", "empty"], check=True)
    (tmp_path / "ledger.toml").write_text(CONFIG.format(repo=repo))
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("LEDGER_")},
           "LEDGER_DATABASE_URL": url, "LEDGER_ROLE_PREFIX": TEST_PREFIX, "NO_COLOR": "1",
           "COLUMNS": "200", "LEDGER_DATA_DIR": str(tmp_path / "data"),
           "LEDGER_CONFIG": str(tmp_path / "ledger.toml")}
    yield url, env
    drop_database(pg_admin_url, name)


def written(url: str) -> tuple[int, ...]:
    """Everything a command could have written."""
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT (SELECT count(*) FROM ledger.campaign), (SELECT count(*) FROM ledger.campaign_event),"
            " (SELECT count(*) FROM ledger.observation), (SELECT count(*) FROM ledger.campaign_class),"
            " (SELECT count(*) FROM ledger.process), (SELECT count(*) FROM ledger.class_event),"
            " (SELECT count(*) FROM pg_roles WHERE rolname LIKE %s)", (f"{TEST_PREFIX}%login",)).fetchone()
        assert row is not None
        return tuple(row)


def ledger(args: list[str], env: dict[str, str], config: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    args = [a.replace("{config}", config) for a in args]
    return subprocess.run([sys.executable, "-m", "ledger", *args], env=env, capture_output=True,
                          text=True, timeout=scaled(timeout))


def refused_in_one_line(proc: subprocess.CompletedProcess[str], *names: str) -> None:
    # (a service's structured log records, one JSON object a line, are not messages to the user)
    lines = [line for line in proc.stderr.splitlines() if line.strip() and not line.startswith("{")]
    assert proc.returncode == 14, (proc.returncode, proc.stderr)
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    for name in names:
        assert name in lines[0], (name, lines[0])


def an_older_schema(url: str) -> None:
    """The previous release's schema, migrated by this code's history."""
    migrations.upgrade(url, TEST_PREFIX, PREVIOUS.schema)


def a_newer_schema(url: str) -> None:
    """A schema of a later release that no longer serves this code: at head,
    then marked as a future revision whose oldest client is newer than us."""
    migrations.upgrade(url, TEST_PREFIX)
    with psycopg.connect(url) as conn:
        conn.execute("UPDATE alembic_version SET version_num = '9001_future'")
        conn.execute("SET ledger.migrating = on")
        conn.execute("UPDATE ledger.meta SET value = '9000_contracted' WHERE key = 'oldest_client'")


@pytest.mark.parametrize("family", sorted(ONE_SHOT))
def test_code_newer_than_the_schema_is_refused_and_writes_nothing(family: str, mixed, tmp_path: Path) -> None:
    url, env = mixed
    an_older_schema(url)
    before = written(url)
    proc = ledger(ONE_SHOT[family], env, env["LEDGER_CONFIG"])
    refused_in_one_line(proc, RELEASE, SCHEMA, PREVIOUS.schema, "ledger migrate")
    assert written(url) == before


@pytest.mark.parametrize("family", sorted(ONE_SHOT))
def test_code_older_than_the_schema_serves_is_refused_and_writes_nothing(family: str, mixed) -> None:
    url, env = mixed
    a_newer_schema(url)
    before = written(url)
    proc = ledger(ONE_SHOT[family], env, env["LEDGER_CONFIG"])
    refused_in_one_line(proc, RELEASE, SCHEMA, "9001_future", "9000_contracted", "upgrade Ledger")
    assert written(url) == before


@pytest.mark.parametrize("service", sorted(SERVICES))
def test_a_service_older_than_the_schema_serves_exits_at_once_and_writes_nothing(service: str, mixed) -> None:
    """Waiting cannot mend it (a schema never goes back): the service stops
    with the one line, exit 14, before it registers or claims anything."""
    url, env = mixed
    a_newer_schema(url)
    before = written(url)
    proc = ledger(SERVICES[service], env, env["LEDGER_CONFIG"])
    refused_in_one_line(proc, RELEASE, SCHEMA, "9001_future", "upgrade Ledger")
    assert written(url) == before


def test_migrate_refuses_a_schema_it_does_not_know(mixed) -> None:
    url, env = mixed
    a_newer_schema(url)
    proc = ledger(["migrate"], env, env["LEDGER_CONFIG"])
    refused_in_one_line(proc, "9001_future", RELEASE, SCHEMA)
    assert migrations.current(url) == "9001_future"


def test_any_client_that_greets_is_refused_by_the_database_itself(mixed) -> None:
    """The greeting, as a client of another release would send it, straight to
    the database: the refusal does not depend on this code's own checks."""
    url, _ = mixed
    migrations.upgrade(url, TEST_PREFIX)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"SET ROLE {TEST_PREFIX}worker")
        conn.execute("SELECT ledger_api.hello(%s, %s)", (RELEASE, SCHEMA))  # this code: served
        conn.execute("SELECT ledger_api.hello('0.2.9', '0003_trace_context')")  # the release before: served
        for release, schema, code, says in (
                ("0.9.0", "0099_far_future", "LG012", "needs schema revision 0099_far_future"),
                ("0.0.1", "0002_merge_queue", "LG013", "older than this database serves"),
                ("0.3.0", f"{SCHEMA[:4]}_another_branch", "LG012", "needs schema revision")):
            with pytest.raises(psycopg.Error) as refused:
                conn.execute("SELECT ledger_api.hello(%s, %s)", (release, schema))
            assert refused.value.sqlstate == code and says in str(refused.value), (schema, refused.value)
        with pytest.raises(psycopg.Error) as bad:
            conn.execute("SELECT ledger_api.hello('0.3.0', 'not a revision')")
        assert bad.value.sqlstate == "LG007"
