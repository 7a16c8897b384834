"""A sensor check: run a repository's tests at a ref (exit 0: green; 1: tests
failed, red; anything else -- the ref cannot be read, the runner's own exit
codes -- is the check's own failure, which a sensor records as an error).

usage: run_tests_at.py REPOSITORY REF [--pytest]
The tree at REF is exported to a temporary directory (the repository itself is
never touched) and ``python -m unittest`` runs there -- or, with ``--pytest``,
``python -m pytest``, writing its JUnit report where the sensor asks
(``$LEDGER_JUNIT_XML``): the observation then names the tests that failed, and
a campaign it opens holds its candidates to them. Such a report is the tests'
own to write, so it can open a campaign but never confirm one: a sensor whose
command is pytest itself (run by Ledger's judge in an export of its target's
ref) can.
"""

import io
import os
import subprocess
import sys
import tarfile
import tempfile

repository, ref = sys.argv[1], sys.argv[2]
use_pytest = "--pytest" in sys.argv[3:]
read = subprocess.run(["git", "-C", repository, "archive", "--format=tar", ref], capture_output=True)
if read.returncode != 0:
    # the tree could not be read (the repository or its ref is out of
    # reach): not a verdict on the tests, so not exit 1
    sys.stderr.write(read.stderr.decode("utf-8", "replace"))
    sys.stderr.write(f"run_tests_at: cannot read {ref} of {repository}\n")
    sys.exit(2)
archive = read.stdout
with tempfile.TemporaryDirectory(prefix="ledger-sensor-") as tree:
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(tree, filter="data")
    command = [sys.executable, "-m", "unittest", "-q"]
    if use_pytest:
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
        if os.environ.get("LEDGER_JUNIT_XML"):
            command += [f"--junitxml={os.environ['LEDGER_JUNIT_XML']}", "-o", "junit_family=xunit1"]
    result = subprocess.run(command, cwd=tree)
sys.exit(result.returncode)
