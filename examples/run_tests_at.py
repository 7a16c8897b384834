"""A sensor check: run a repository's unit tests at a ref (exit 0: green).

usage: run_tests_at.py REPOSITORY REF
The tree at REF is exported to a temporary directory (the repository itself is
never touched) and ``python -m unittest`` runs there.
"""

import io
import subprocess
import sys
import tarfile
import tempfile

repository, ref = sys.argv[1], sys.argv[2]
archive = subprocess.run(["git", "-C", repository, "archive", "--format=tar", ref],
                         check=True, capture_output=True).stdout
with tempfile.TemporaryDirectory(prefix="ledger-sensor-") as tree:
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(tree, filter="data")
    result = subprocess.run([sys.executable, "-m", "unittest", "-q"], cwd=tree)
sys.exit(result.returncode)
