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

import tempfile
from pathlib import Path

from .repository import LEDGER, GitError, git


def rebase(repository: Path, base: str, onto: str, candidate: str, branch: str) -> str | None:
    """Replay ``base..candidate`` onto ``onto``; the new candidate's commit id,
    also at ``refs/heads/<branch>`` of ``repository``. ``None`` when a commit
    does not apply cleanly onto what moved the target (nothing is written)."""
    with tempfile.TemporaryDirectory(prefix="ledger-rebase-") as scratch:
        work = Path(scratch) / "work"
        git(scratch, "clone", "--quiet", "--shared", "--no-checkout", str(repository), str(work))
        git(work, "checkout", "--quiet", "--detach", onto)
        try:
            # each commit keeps its author; Ledger commits the replay
            git(work, "cherry-pick", "--allow-empty", "--keep-redundant-commits",
                f"{base}..{candidate}", env=LEDGER.env("COMMITTER"))
        except GitError:
            return None  # a conflict: not ours to resolve
        rebased = git(work, "rev-parse", "HEAD")
        # the new objects live in the scratch clone: bring them home, under a branch
        git(repository, "fetch", "--quiet", "--no-tags", str(work), f"+HEAD:refs/heads/{branch}")
        return rebased
