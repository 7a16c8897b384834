"""Git steps of attempts, verifications and promotions.

GitPython's own README warns that it leaks resources in long-running processes,
so a ``Repo`` is opened per operation and closed right after; every call here is
blocking (run it in a thread from async code). A repository given as a URL is
cloned once into ``<data_dir>/repos`` and fetched before use.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import git

from .errors import LedgerError


class GitError(LedgerError):
    """A git step failed."""

    slug = "git-error"
    http_status = 502
    exit_code = 12


class RefMoved(GitError):
    """A compare-and-swap ref update found the ref somewhere else."""

    slug = "ref-moved"

    def __init__(self, ref: str, expected: str | None, actual: str | None):
        super().__init__(f"{ref} is at {actual or 'nothing'}, not the expected {expected or 'nothing'}")
        self.ref, self.expected, self.actual = ref, expected, actual


# Ledger always names the repository it works on. Variables that redirect git
# to another repository, index or work tree (set by a calling git hook, or a
# shell mid-commit) would silently send its steps elsewhere: drop them once.
for _var in ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_OBJECT_DIRECTORY",
             "GIT_ALTERNATE_OBJECT_DIRECTORIES", "GIT_COMMON_DIR", "GIT_NAMESPACE"):
    os.environ.pop(_var, None)

ZERO_SHA = "0" * 40
IDENTITY = {"GIT_AUTHOR_NAME": "Ledger", "GIT_AUTHOR_EMAIL": "ledger@localhost",
            "GIT_COMMITTER_NAME": "Ledger", "GIT_COMMITTER_EMAIL": "ledger@localhost"}


@contextmanager
def _open(path: str | Path) -> Iterator[git.Repo]:
    try:
        repo = git.Repo(path)
    except (git.NoSuchPathError, git.InvalidGitRepositoryError) as exc:
        raise GitError(f"{path} is not a git repository") from exc
    try:
        yield repo
    finally:
        repo.close()


def _git(repo: git.Repo, *args: str, env: dict[str, str] | None = None) -> str:
    try:
        return repo.git.execute(["git", *args], env=env)  # type: ignore[call-overload, no-any-return]
    except git.GitCommandError as exc:
        detail = (exc.stderr or exc.stdout or "").strip().splitlines()
        raise GitError(f"git {args[0]} failed: {detail[-1] if detail else exc}") from exc


def _git_bytes(repo: git.Repo, *args: str) -> bytes:
    try:
        return repo.git.execute(["git", *args], stdout_as_string=False)  # type: ignore[call-overload, no-any-return]
    except git.GitCommandError as exc:
        raise GitError(f"git {args[0]} failed: {exc}") from exc


class Repository:
    """One repository Ledger works on (a local path, or a URL cached locally)."""

    def __init__(self, location: str, cache_dir: Path | None = None):
        self.location = location
        self._cache_dir = cache_dir

    @property
    def path(self) -> Path:
        """The local repository (cloning a URL into the cache on first use)."""
        if "://" not in self.location and not self.location.startswith("git@"):
            return Path(self.location)
        if self._cache_dir is None:
            raise GitError(f"{self.location} is a URL; a cache directory is needed to clone it")
        local = self._cache_dir / hashlib.sha256(self.location.encode()).hexdigest()[:16]
        if not local.exists():
            local.parent.mkdir(parents=True, exist_ok=True)
            try:
                git.Repo.clone_from(self.location, local, bare=True).close()
            except git.GitCommandError as exc:
                raise GitError(f"cannot clone {self.location}: {exc}") from exc
        else:
            with _open(local) as repo:
                # No --prune: the cache also holds the workers' ledger/* branches.
                _git(repo, "fetch", "origin", "+refs/heads/*:refs/heads/*")
        return local

    def rev_parse(self, ref: str) -> str | None:
        """The commit a ref points at, or ``None`` if it does not exist."""
        with _open(self.path) as repo:
            try:
                return _git(repo, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}")
            except GitError:
                return None

    def update_ref(self, ref: str, new: str, expected_old: str | None) -> None:
        """Compare-and-swap: move ``ref`` to ``new`` only if it is at ``expected_old``
        (``None``: only if it does not exist). ``RefMoved`` if it is elsewhere;
        a plain ``GitError`` if the update failed with the ref still in place
        (another writer holding its lock: worth retrying)."""
        with _open(self.path) as repo:
            try:
                _git(repo, "update-ref", "-m", "ledger promotion", ref, new, expected_old or ZERO_SHA)
            except GitError:
                actual = self.rev_parse(ref)
                if actual != expected_old:
                    raise RefMoved(ref, expected_old, actual) from None
                raise

    def add_worktree(self, directory: Path, base_ref: str, branch: str) -> str:
        """A fresh worktree at ``base_ref`` on a new ``branch``; returns the base SHA."""
        with _open(self.path) as repo:
            base = _git(repo, "rev-parse", "--verify", f"{base_ref}^{{commit}}")
            _git(repo, "worktree", "add", "-B", branch, str(directory), base)
            return base

    def remove_worktree(self, directory: Path) -> None:
        """Remove a worktree and its administrative files, whatever state it is in."""
        try:
            with _open(self.path) as repo:
                try:
                    _git(repo, "worktree", "remove", "--force", "--force", str(directory))
                except GitError:
                    pass
                shutil.rmtree(directory, ignore_errors=True)
                _git(repo, "worktree", "prune")
        except GitError:
            shutil.rmtree(directory, ignore_errors=True)

    def clean_checkout(self, sha: str, directory: Path) -> None:
        """A clone of the repository at ``sha`` in ``directory``: its own index and
        work tree, sharing objects read-only; never someone else's worktree."""
        try:
            git.Repo.clone_from(str(self.path), directory, shared=True, no_checkout=True).close()
        except git.GitCommandError as exc:
            raise GitError(f"cannot clone {self.path}: {exc}") from exc
        with _open(directory) as repo:
            _git(repo, "checkout", "--quiet", "--detach", sha)


def head(worktree: Path) -> str:
    """The commit a worktree is at."""
    with _open(worktree) as repo:
        return _git(repo, "rev-parse", "HEAD")


def commit_all(worktree: Path, message: str) -> bool:
    """Commit every change in ``worktree`` (new files included); ``False`` if clean."""
    with _open(worktree) as repo:
        _git(repo, "add", "--all")
        if not _git(repo, "status", "--porcelain"):
            return False
        _git(repo, "commit", "--quiet", "--no-verify", "-m", message, env=IDENTITY)
        return True


def diff(worktree: Path, base: str, candidate: str) -> bytes:
    """The change from ``base`` to ``candidate``, byte-stable for fingerprinting."""
    with _open(worktree) as repo:
        return _git_bytes(repo, "diff", "--binary", "--no-color", "--no-ext-diff",
                          "--no-renames", "--full-index", base, candidate)
