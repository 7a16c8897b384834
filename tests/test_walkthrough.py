"""docs/walkthrough.md, run as written: the page a newcomer follows from a
fresh clone to their own repository's regression closed.

The page marks the blocks this test uses with an HTML comment just before
each (invisible on the site): ``<!-- walkthrough: run -->`` is a shell block
run in order (exports and the working directory carry over to the next, as
in one terminal), ``<!-- walkthrough: file NAME -->`` a file written where the
shell stands, and ``<!-- walkthrough: background -->`` one ``ledger`` command
started as a process of its own (a terminal of its own), stopped with SIGTERM
at the end. Only three things are substituted: the page's directory, its
database URL (a fresh database on the test server) and the clone's
``.venv/bin`` (the interpreter running this test). Unmarked blocks are prose.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO
from urllib.parse import quote, urlencode

import pytest
from psycopg.conninfo import conninfo_to_dict

from conftest import RUN_TAG, TEST_PREFIX, stop_process
from drive import load_factor
from ledger.db.embedded import drop_database
from ledger.sandbox import cell as cells

ROOT = Path(__file__).parents[1]
PAGE = ROOT / "docs" / "walkthrough.md"
#: What the page says, and what this test puts in its place.
PAGE_DIR = "/tmp/ledger-walkthrough"
PAGE_URL = "postgresql://postgres@127.0.0.1:5432/walkthrough"
PAGE_BIN = "$PWD/.venv/bin"

BLOCK = re.compile(r"<!-- walkthrough: (?P<mark>run|background|file (?P<name>[\w./-]+)) -->\n"
                   r"```\w*\n(?P<body>.*?)\n```\n", re.S)

pytestmark = pytest.mark.skipif(cells.bubblewrap() is None,
                                reason="bubblewrap is not installed (apt-get install bubblewrap)")


def blocks() -> list[tuple[str, str | None, str]]:
    """The marked blocks of the page, in order: (mark, file name, text)."""
    text = PAGE.read_text()
    found = [(m["mark"].split()[0], m["name"], m["body"]) for m in BLOCK.finditer(text)]
    # A marker that does not sit right before a block would be silently skipped.
    assert len(found) == text.count("<!-- walkthrough:"), "a walkthrough marker without its block"
    return found



def database_url(admin_url: str, name: str) -> str:
    """A URL (what the page's ``export`` takes) for database ``name`` on the test server."""
    params = {k: v for k, v in conninfo_to_dict(admin_url).items() if v and k != "dbname"}
    return f"postgresql:///{quote(name)}?{urlencode(params)}"


def tail(path: Path, lines: int = 15) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""


@pytest.fixture
def walk_db(pg_admin_url: str) -> Iterator[str]:
    """The name of a database the page creates (`ledger migrate --create-database`); dropped after."""
    name = f"ledgertest_{RUN_TAG}_walkthrough"
    yield name
    drop_database(pg_admin_url, name)


def test_the_walkthrough_closes_a_regression_as_written(tmp_path: Path, pg_admin_url: str,
                                                        walk_db: str) -> None:
    walk = tmp_path / "walk"
    substitutions = {PAGE_DIR: str(walk), PAGE_URL: database_url(pg_admin_url, walk_db),
                     PAGE_BIN: str(Path(sys.executable).parent)}

    def substituted(text: str) -> str:
        for said, meant in substitutions.items():
            text = text.replace(said, meant)
        return text

    page = blocks()
    assert PAGE_DIR in PAGE.read_text() and PAGE_URL in PAGE.read_text()
    started = [shlex.split(body, comments=True) for mark, _, body in page if mark == "background"]
    # Four roles, each a `ledger` process of its own, as on separate machines.
    assert sorted(" ".join(argv[:2]) for argv in started) == [
        "ledger dispatcher", "ledger sensor", "ledger verifier", "ledger worker"], started
    assert {name for mark, name, _ in page if mark == "file"} >= {"ledger.toml"}

    # The shell's state between blocks: what it exported and where it stands.
    state = tmp_path / "state.sh"
    state.write_text(f"cd {shlex.quote(str(ROOT))}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("LEDGER_")}
    env["LEDGER_ROLE_PREFIX"] = TEST_PREFIX  # roles are cluster-wide: the tests' own
    save = f'{{ export -p; printf "cd %q\\n" "$PWD"; }} > {shlex.quote(str(state))}'
    factor = load_factor()
    processes: list[tuple[subprocess.Popen[bytes], Path, IO[bytes]]] = []

    def shell(body: str, timeout_s: float) -> subprocess.CompletedProcess[str]:
        script = f"source {shlex.quote(str(state))}\n{body}\n{save}\n"
        return subprocess.run(["bash", "-e", "-o", "pipefail", "-c", script], env=env,
                              capture_output=True, text=True, timeout=timeout_s)

    def logs() -> str:
        return "\n".join(f"--- {log.name}\n{tail(log)}" for _, log, _ in processes)

    began = time.monotonic()
    try:
        for mark, name, body in page:
            body = substituted(body)
            if mark == "file":
                assert name is not None
                where = Path(shell("pwd", 30).stdout.strip())
                (where / name).write_text(body + "\n")
            elif mark == "background":
                argv = shlex.split(body, comments=True)
                log = tmp_path / f"{argv[1]}.log"
                out = log.open("wb")
                script = f"source {shlex.quote(str(state))}\nexec {shlex.join(argv)}\n"
                processes.append((subprocess.Popen(["bash", "-c", script], env=env, stdout=out,
                                                   stderr=subprocess.STDOUT), log, out))
            else:
                try:
                    done = shell(body, 90 * factor)  # `ledger tail` follows until the campaign closes
                except subprocess.TimeoutExpired:
                    pytest.fail(f"this block did not finish:\n{body}\n{logs()}")
                assert done.returncode == 0, f"{body}\n{done.stdout}\n{done.stderr}\n{logs()}"
        assert all(p.poll() is None for p, _, _ in processes), logs()
        closed_after = time.monotonic() - began

        final = shell("ledger show 1 --json", 30)
        assert final.returncode == 0, final.stderr
        campaign = json.loads(final.stdout)["campaign"]
        assert campaign["state"] == "confirmed", (campaign, logs())
        repository = walk / "app"
        git = ["git", "-C", str(repository)]
        history = subprocess.run([*git, "log", "--format=%H %s", "main"], capture_output=True,
                                 text=True, check=True).stdout.splitlines()
        assert len(history) == 2 and history[0].split()[0] == campaign["promoted_sha"], history
        landed = subprocess.run([*git, "show", "-s", "--format=%B", "main"], capture_output=True,
                                text=True, check=True).stdout
        assert landed.startswith("calc: add adds") and "Ledger-Campaign: 1" in landed, landed
        # A checked-out main moves with its files (and the test now passes there).
        assert "return a + b" in (repository / "calc.py").read_text()
        assert closed_after < 60 * factor, f"the walkthrough took {closed_after:.1f} s"
    finally:
        for proc, _, output in processes:
            stop_process(proc)
            output.close()
    # Each role stopped cleanly on SIGTERM, as Ctrl-C in its terminal would.
    assert [p.returncode for p, _, _ in processes] == [0] * len(processes), logs()
