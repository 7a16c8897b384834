"""Rebasing a verified candidate onto a promotion target that moved.

A candidate was verified against base ``B``; when the dispatcher comes to
promote it, the target is at ``T`` instead. Rather than throw an accepted fix
away (and spend an attempt), the dispatcher replays the candidate's commits
``B..candidate`` onto ``T`` and sends the result back for verification. The
replay happens in a throwaway clone that shares the repository's objects (so
nobody's checkout is touched and bare repositories work alike); the result
is fetched back as a branch of its own, ``ledger/<campaign>/<attempt>``, like
every candidate. A change that does not apply cleanly is not rebased.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

from .repository import GitError

#: Who commits a rebased candidate (each commit keeps its author).
COMMITTER = {"GIT_COMMITTER_NAME": "Ledger", "GIT_COMMITTER_EMAIL": "ledger@localhost"}


def _git(directory: Path, *args: str, ok: tuple[int, ...] = (0,)) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(["git", "-C", str(directory), *args], capture_output=True, text=True,
                            env={**os.environ, **COMMITTER}, timeout=300)
    if result.returncode not in ok:
        detail = (result.stderr or result.stdout).strip().splitlines()
        raise GitError(f"git {args[0]} failed: {detail[-1] if detail else result.returncode}")
    return result


def rebase(repository: Path, base: str, onto: str, candidate: str, branch: str) -> str | None:
    """Replay ``base..candidate`` onto ``onto``; the new candidate's commit id,
    also at ``refs/heads/<branch>`` of ``repository``. ``None`` when a commit
    does not apply cleanly onto what moved the target (nothing is written)."""
    with tempfile.TemporaryDirectory(prefix="ledger-rebase-") as scratch:
        work = Path(scratch) / "work"
        _git(Path(scratch), "clone", "--quiet", "--shared", "--no-checkout", str(repository), str(work))
        _git(work, "checkout", "--quiet", "--detach", onto)
        picked = _git(work, "cherry-pick", "--allow-empty", "--keep-redundant-commits",
                      f"{base}..{candidate}", ok=(0, 1))
        if picked.returncode != 0:
            return None
        rebased = _git(work, "rev-parse", "HEAD").stdout.strip()
        # the new objects live in the scratch clone: bring them home, under a branch
        _git(repository, "fetch", "--quiet", "--no-tags", str(work), f"+HEAD:refs/heads/{branch}")
        return rebased
