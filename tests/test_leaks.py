"""The autouse leak check (tests/conftest.py ``no_leaks``): a test that leaves
a child process, a database session or an embedded server behind fails,
saying which; a test that cleans up passes. Run as a pytest session of its
own with this suite's conftest."""

from __future__ import annotations

from pathlib import Path

import pytest

CONFTEST = Path(__file__).with_name("conftest.py")

LEAKY = '''
import atexit
import shutil
import subprocess
import tempfile
from pathlib import Path

import psycopg

from ledger.db.embedded import server_url

kept = []


def test_clean(db_url):
    with psycopg.connect(db_url):
        pass
    subprocess.run(["true"], check=True)


def test_leaves_a_child():
    kept.append(subprocess.Popen(["sleep", "61"]))


def test_leaves_a_session(db_url):
    kept.append(psycopg.connect(db_url, application_name="the-leaky-test"))


@pytest.mark.rollback
def test_leaves_a_session_beside_the_rolled_back_tier(admin, shared_db_url):
    kept.append(psycopg.connect(shared_db_url, application_name="the-leaky-rollback-test"))


def test_leaves_an_embedded_server():
    root = Path(tempfile.mkdtemp(prefix="ledger-test-leaky-"))
    atexit.register(shutil.rmtree, root, True)  # after the library stops and deletes it
    server_url(root, cleanup="delete")
'''


def test_a_leaking_test_fails_naming_what_it_left(pytester: pytest.Pytester,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LEDGER_TEST_LEAK_GRACE_S", "0.5")  # each leak waits this long
    pytester.makeconftest(CONFTEST.read_text())
    pytester.makepyfile(test_leaky="import pytest\n" + LEAKY)
    # (the inner session inherits LEDGER_TEST_DATABASE_URL: the same server)
    result = pytester.runpytest_subprocess("-p", "no:randomly", "-p", "no:cacheprovider",
                                           timeout=240)
    result.assert_outcomes(passed=5, errors=4)
    out = result.stdout.str()
    assert "child process" in out and "sleep 61" in out
    assert "the-leaky-test" in out and "the-leaky-rollback-test" in out
    assert "embedded server" in out and "held by this process" in out
    assert "test_clean" not in "\n".join(
        line for line in result.stdout.lines if line.startswith("ERROR"))
