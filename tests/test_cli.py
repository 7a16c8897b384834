"""The command line, run as a user runs it: a subprocess, real exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import TEST_PREFIX

pytestmark = pytest.mark.anyio


def ledger(db_url: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "LEDGER_DATABASE_URL": db_url, "LEDGER_ROLE_PREFIX": TEST_PREFIX,
           "NO_COLOR": "1", "COLUMNS": "200"}
    proc = subprocess.run([sys.executable, "-m", "ledger", *args], env=env, capture_output=True,
                          text=True, timeout=60)
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


async def test_open_show_list_abandon(db_url: str, test_class: str) -> None:
    opened = json.loads(ledger(db_url, "open", test_class, "obj-1", "repo-1", "--json").stdout)
    assert opened["created"] is True
    again = json.loads(ledger(db_url, "open", test_class, "obj-1", "repo-1", "--json").stdout)
    assert again == {**opened, "created": False}
    cid = str(opened["campaign_id"])

    shown = json.loads(ledger(db_url, "show", cid, "--json").stdout)
    assert shown["campaign"]["state"] == "ready" and shown["attempts"] == []
    listed = json.loads(ledger(db_url, "list", "--state", "ready", "--json").stdout)
    assert [c["id"] for c in listed] == [opened["campaign_id"]]

    done = ledger(db_url, "abandon", cid, "--reason", "testing")
    assert "abandoned" in done.stderr and done.stdout == ""
    assert json.loads(ledger(db_url, "show", cid, "--json").stdout)["campaign"]["state"] == "abandoned"
    status = json.loads(ledger(db_url, "status", "--json").stdout)
    assert status["states"]["abandoned"] == 1 and status["states"]["ready"] == 0


async def test_errors_are_one_line_and_a_nonzero_exit(db_url: str, test_class: str) -> None:
    missing = ledger(db_url, "show", "424242", check=False)
    assert missing.returncode == 6
    assert missing.stderr.strip() == "ledger: campaign 424242 does not exist"
    cid = json.loads(ledger(db_url, "open", test_class, "o", "t", "--json").stdout)["campaign_id"]
    ledger(db_url, "abandon", str(cid))
    twice = ledger(db_url, "abandon", str(cid), check=False)
    assert twice.returncode == 4 and len(twice.stderr.strip().splitlines()) == 1
    assert "terminal" in twice.stderr
    bad = ledger(db_url, "reopen", "not-a-number", check=False)
    assert bad.returncode == 2
    unknown = ledger(db_url, "open", "no-such-class", "o2", "t", check=False)
    assert unknown.returncode == 6 and "not registered" in unknown.stderr


def test_unreachable_database_fails_fast() -> None:
    proc = ledger("host=127.0.0.1 port=1 user=nobody dbname=none connect_timeout=2", "list",
                  check=False)
    assert proc.returncode == 69
    assert proc.stderr.startswith("ledger: cannot connect to the database")
    assert len(proc.stderr.strip().splitlines()) == 1


def test_migrate_is_idempotent_and_graph_draws(db_url: str, tmp_path: Path) -> None:
    assert "already at" in ledger(db_url, "migrate").stderr
    out = tmp_path / "states.svg"
    ledger(db_url, "graph", "-o", str(out))
    assert out.read_text().startswith("<svg") and ">abandoned</text>" in out.read_text()
    mermaid = ledger(db_url, "graph", "--format", "mermaid", "-o", "-").stdout
    assert "ready --> leased: claim" in mermaid


async def test_list_pages_like_the_api_and_pipes_whole_rows(db_url: str, test_class: str) -> None:
    long_key = "k-" + "x" * 300  # far wider than any terminal
    ids = [json.loads(ledger(db_url, "open", test_class, key, "repo", "--json").stdout)["campaign_id"]
           for key in ("alpha-1", "alpha-2", long_key)]
    # Piped (not a terminal): TSV, a header then whole rows, nothing cut at 80 columns.
    env_free = ledger(db_url, "list")
    lines = env_free.stdout.splitlines()
    assert lines[0].split("\t") == ["id", "state", "class", "objective", "target", "attempts",
                                    "updated"]
    assert {line.split("\t")[3] for line in lines[1:]} == {"alpha-1", "alpha-2", long_key}
    # Pages: the first, then the rest from the cursor printed on stderr.
    first = ledger(db_url, "list", "--limit", "2", "--json")
    page = json.loads(first.stdout)
    assert len(page) == 2 and first.stderr.startswith("more: --cursor ")
    cursor = first.stderr.split("--cursor ", 1)[1].strip()
    rest = ledger(db_url, "list", "--limit", "2", "--cursor", cursor, "--json")
    assert rest.stderr == ""
    assert sorted(c["id"] for c in page + json.loads(rest.stdout)) == sorted(ids)
    every = json.loads(ledger(db_url, "list", "--limit", "1", "--all", "--json").stdout)
    assert sorted(c["id"] for c in every) == sorted(ids)
    found = json.loads(ledger(db_url, "list", "--search", "alpha", "--json").stdout)
    assert sorted(c["objective_key"] for c in found) == ["alpha-1", "alpha-2"]
    # Timestamps as the API writes them: ISO 8601, UTC, with Z.
    assert all(c["updated_at"].endswith("Z") and c["created_at"].endswith("Z") for c in every)
    status = json.loads(ledger(db_url, "status", "--json").stdout)
    assert status["oldest_ready"].endswith("Z")
    forged = ledger(db_url, "list", "--cursor", "not-a-cursor", check=False)
    assert forged.returncode == 2 and forged.stderr.startswith("ledger: the cursor is not")


def test_version() -> None:
    proc = subprocess.run([sys.executable, "-m", "ledger", "--version"], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.startswith("ledger 0.")


def test_messages_are_not_wrapped_when_piped() -> None:
    script = ("from ledger.cli.context import console, console_err\n"
              "console.print('data ' * 60)\nconsole_err.print('narration ' * 60)")
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                          timeout=60, check=True)
    assert proc.stdout.strip() == ("data " * 60).strip()
    assert proc.stderr.strip() == ("narration " * 60).strip()


def test_drill_list_as_json_and_tsv() -> None:
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    listed = subprocess.run([sys.executable, "-m", "ledger", "drill", "list", "--json"], env=env,
                            capture_output=True, text=True, timeout=60, check=True)
    drills = json.loads(listed.stdout)
    assert drills[0]["drill"] == "intake" and all(d["summary"] for d in drills)
    tsv = subprocess.run([sys.executable, "-m", "ledger", "drill", "list"], env=env,
                         capture_output=True, text=True, timeout=60, check=True).stdout
    rows = [line.split("\t") for line in tsv.splitlines()]
    assert rows[0] == ["drill", "setup -> fault -> what must hold"]
    assert [r[1] for r in rows[1:]] == [d["summary"] for d in drills]  # whole, never cut
