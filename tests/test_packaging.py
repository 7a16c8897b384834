"""What the build installs: one top-level name, ``ledger``.

The repository's top-level folders ``verifiers/`` and ``drills/`` install as
``ledger.verifiers`` and ``ledger.drills`` (pyproject.toml maps them), so a
user's own ``verifiers`` module never collides with Ledger's.
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
import zipfile
from importlib.metadata import entry_points
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CONFIG = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def test_the_build_lists_every_package_under_the_one_name() -> None:
    """Every folder with an ``__init__.py`` under a mapped folder is a listed
    package (a new subpackage left out of the list would be missing from the
    wheel), and every listed package is under ``ledger``."""
    mapped = CONFIG["package-dir"]
    assert all(name == "ledger" or name.startswith("ledger.") for name in CONFIG["packages"])
    assert mapped["ledger.verifiers"] == "verifiers" and mapped["ledger.drills"] == "drills"
    found = {".".join((name, *init.parent.relative_to(ROOT / folder).parts))
             for name, folder in mapped.items() for init in (ROOT / folder).rglob("__init__.py")}
    assert found <= set(CONFIG["packages"]), sorted(found - set(CONFIG["packages"]))


def test_the_folders_import_inside_the_package_and_not_beside_it(tmp_path: Path) -> None:
    run = subprocess.run(
        [sys.executable, "-c",
         "import ledger.verifiers, ledger.drills, ledger.verifiers.judge\n"
         "print(ledger.verifiers.__file__); print(ledger.drills.__file__)\n"
         "for name in ('verifiers', 'drills'):\n"
         "    try:\n"
         "        __import__(name)\n"
         "    except ImportError:\n"
         "        print('absent', name)\n"],
        cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines[0] == str(ROOT / "verifiers" / "__init__.py")
    assert lines[1] == str(ROOT / "drills" / "__init__.py")
    assert lines[2:] == ["absent verifiers", "absent drills"]


def test_the_entry_points_name_modules_inside_the_package() -> None:
    values = [p.value for group in ("ledger.verifiers", "ledger.drills")
              for p in entry_points(group=group)]
    assert values and all(v.startswith("ledger.") for v in values), values
    assert "ledger.drills:ALL" in values
    assert "ledger.verifiers.pytest_report:PytestVerifier" in values


def test_the_wheel_has_one_top_level_name(tmp_path: Path) -> None:
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--disable-pip-version-check",
         "-w", str(tmp_path), str(ROOT)], capture_output=True, text=True, timeout=240)
    assert built.returncode == 0, built.stderr[-3000:]
    (wheel,) = tmp_path.glob("ledger-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"ledger"}, tops
    for expected in ("ledger/verifiers/judge.py", "ledger/verifiers/inside/ledger_judge.py",
                     "ledger/drills/__init__.py", "ledger/_migrations/released.txt",
                     "ledger/_migrations/versions/0001_baseline.py",
                     "ledger/_migrations/sql/0001_baseline/down.sql",
                     "ledger/_examples/demo_attempt.py", "ledger/db/sql/grants.sql",
                     "ledger/api/templates/base.html", "ledger/py.typed"):
        assert expected in names, expected
    reads = {n for n in names if n.startswith("ledger/db/sql/reads/")}
    assert reads == {f"ledger/db/sql/reads/{p.name}"
                     for p in (ROOT / "src/ledger/db/sql/reads").iterdir() if p.suffix == ".sql"}


def test_the_tree_is_lint_clean() -> None:
    """The lint gate (`make lint`, in .ci/run): ruff as pyproject.toml
    configures it, zero findings over the whole tree."""
    pytest.importorskip("ruff", reason="ruff is not installed (the test extra has it)")
    ran = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", str(ROOT)],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stdout[-3000:]
    assert "make lint" in (ROOT / ".ci" / "run").read_text()
