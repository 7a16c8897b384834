"""The README's two commands, as make would run them on a fresh clone (a dry
run: ``make -n`` prints the commands without running them)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


def dry_run(target: str, venv: Path) -> list[str]:
    # Run by `make test`, make's own variables would make this one print directories.
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}
    proc = subprocess.run(["make", "--no-print-directory", "-n", target, f"VENV={venv}"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=60, check=True)
    return proc.stdout.splitlines()


def installs(lines: list[str]) -> list[str]:
    return [m.group(1) for line in lines
            if (m := re.search(r"pip install .*?-e (\S+)\s*$", line))]


def test_make_demo_installs_ledger_without_the_test_extras(tmp_path: Path) -> None:
    """A user who only wants the demo does not get selenium, schemathesis, mypy
    and hypothesis: `make demo` installs Ledger alone."""
    lines = dry_run("demo", tmp_path / "venv")
    assert installs(lines) == ["."], lines
    assert lines[-1].endswith("/bin/ledger demo")


def test_make_test_installs_the_test_extras(tmp_path: Path) -> None:
    lines = dry_run("test", tmp_path / "venv")
    assert installs(lines) == ["'.[test]'"], lines
    assert "-m pytest" in lines[-1]
