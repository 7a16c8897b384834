"""Attempts adding worktrees to one repository at once do not collide: git
names a worktree's admin directory after the last component of its path, and
with every attempt's worktree called ``worktree`` concurrent adds raced for
``.git/worktrees/worktree*`` ("failed to read .../commondir"), failing an
attempt of a worker running with ``--concurrency`` above one."""

from __future__ import annotations

import subprocess
import tempfile
import threading
from pathlib import Path

from ledger.attempt import worktree_path
from ledger.repository import Repository


def test_concurrent_attempts_add_their_worktrees_without_racing(tmp_path: Path) -> None:
    origin = tmp_path / "repo"
    subprocess.run(["git", "init", "-q", str(origin)], check=True)
    subprocess.run(["git", "-C", str(origin), "-c", "user.name=t", "-c", "user.email=t@t",
                    "commit", "-q", "--allow-empty", "-m", "init"], check=True)
    repo = Repository(str(origin), cache_dir=tmp_path / "cache")
    errors: list[str] = []
    added: list[Path] = []

    def attempt(n: int) -> None:
        workdir = Path(tempfile.mkdtemp(prefix=f"{n}-", dir=tmp_path))
        try:
            repo.add_worktree(worktree_path(workdir), "HEAD", f"ledger/{n}")
            added.append(worktree_path(workdir))
        except Exception as exc:  # noqa: BLE001 -- every failure is the finding
            errors.append(repr(exc))

    for round_ in range(5):  # without the lock, most runs of five rounds fail
        threads = [threading.Thread(target=attempt, args=(round_ * 100 + n,)) for n in range(12)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert errors == []
    assert len(added) == 60 and all((path / ".git").exists() for path in added)
