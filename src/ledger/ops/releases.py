"""Earlier releases of Ledger, installed to run beside this one (the upgrade
drill, tests/test_upgrade.py): each in a virtual environment of its own
under ``.venv-releases/`` of the clone (kept between runs;
``LEDGER_RELEASES_DIR`` elsewhere), built from the release's commit in the
clone's history.

The release's own code is installed there (``pip install --no-deps -e`` of
``git archive <commit>``, as the quickstart installs a clone); its third-party dependencies are this test run's
(a ``.pth`` line naming this interpreter's site-packages, which adds the
folder without running the editable install's hooks in it), so that building
one costs seconds rather than a minute of downloads. Its ``ledger`` command is
``<venv>/bin/ledger``, its interpreter ``<venv>/bin/python``.
"""

from __future__ import annotations

import fcntl
import io
import subprocess
import sys
import sysconfig
import tarfile
import venv
from pathlib import Path

from ledger.release import RELEASES, Release
from ledger.settings import get_settings

#: The clone this code runs from (None: an installed copy, without history).
ROOT: Path | None = next((p for p in Path(__file__).resolve().parents if (p / ".git").exists()), None)


def cache_dir() -> Path:
    """Where release venvs are kept."""
    configured = get_settings().releases_dir
    if configured:
        return configured
    if ROOT is None:
        raise RuntimeError("earlier releases are built from a clone's history; this is an installed copy")
    return ROOT / ".venv-releases"


def release(version: str) -> Release:
    """The release named ``version``."""
    return next(r for r in RELEASES if r.version == version)


def have_history(r: Release) -> bool:
    """Whether this clone holds the release's commit (a shallow clone may not)."""
    if ROOT is None:
        return False
    return subprocess.run(["git", "-C", str(ROOT), "cat-file", "-e", f"{r.commit}^{{commit}}"],
                          capture_output=True).returncode == 0


def installed(version: str) -> Path:
    """The venv of release ``version``, built on first use (under a lock: two
    test processes may ask at once)."""
    r = release(version)
    cache = cache_dir()
    home = cache / f"{r.version}-{r.commit[:12]}"
    done = home / ".installed"
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if done.exists():
            return home
        if not have_history(r):
            raise RuntimeError(f"release {r.version} ({r.commit[:12]}) is not in this clone's history: "
                               "fetch it (git fetch --unshallow, or the tags)")
        source = home / "source"
        source.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", r.commit],
                                 capture_output=True, check=True).stdout
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(source, filter="data")
        env_dir = home / "venv"
        venv.EnvBuilder(with_pip=True, clear=True).create(env_dir)
        site = Path(subprocess.run(
            [str(env_dir / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True, text=True, check=True).stdout.strip())
        (site / "ledger-release-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
        # editable, as the README's quickstart installs a clone (0.2.0's wheel could not
        # find its own migrations: ledger.db.migrations looked beside itself)
        subprocess.run([str(env_dir / "bin" / "python"), "-m", "pip", "install", "--quiet",
                        "--disable-pip-version-check", "--no-deps", "-e", str(source)],
                       check=True, capture_output=True)
        done.write_text(f"{r.version} {r.commit}\n")
        return home


def python(version: str) -> str:
    """The interpreter of release ``version``."""
    return str(installed(version) / "venv" / "bin" / "python")


def ledger_command(version: str) -> list[str]:
    """The ``ledger`` command of release ``version``."""
    return [str(installed(version) / "venv" / "bin" / "ledger")]


def current_ledger() -> list[str]:
    """This code's ``ledger`` command (the running interpreter)."""
    return [sys.executable, "-m", "ledger"]
