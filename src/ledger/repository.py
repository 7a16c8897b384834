"""Git steps of attempts, verifications, promotions and retention.

Every step is a ``git`` subprocess run through one helper (``git``): Ledger
uses git only as a command -- worktrees, compare-and-swap ref updates, an
``update-ref --stdin`` transaction held open while a checked-out branch's work
tree is moved, ``commit-tree`` -- so a library wrapping it (GitPython, which
this module used before) added a layer, and a resource leak in long-running
processes, without doing anything for us. Every call is blocking (run it in a
thread from async code). A repository given as a URL is cloned once into
``<data_dir>/repos`` and fetched before use.

Git runs hardened (``ledger.hardened_git``): no system or user configuration,
and no program that any configuration names -- hooks, fsmonitor, filters,
drivers, helpers -- ever runs; it gets what it needs to reach remotes (ssh
agent, askpass, proxies), never Ledger's own settings, and no variable that
would redirect it to another repository (``GIT_DIR`` ...).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import shutil
import subprocess
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from . import hardened_git
from .errors import LedgerError

ZERO_SHA = "0" * 40
#: Where Ledger's attempt branches live: ``ledger/<campaign>/<attempt>``.
BRANCH_PREFIX = "refs/heads/ledger/"
_ATTEMPT_BRANCH = re.compile(r"^refs/heads/ledger/(\d+)/(\d+)$")
_TRAILER_KEYS = ("Ledger-Campaign", "Ledger-Attempt", "Ledger-Verdict")
_OUR_TRAILER = re.compile(r"^(?:" + "|".join(_TRAILER_KEYS) + r")\s*:.*$\n?", re.I | re.M)


#: Git's own program on the other side of a fetch, whatever any configuration says.
UPLOAD_PACK = ("--upload-pack=git-upload-pack",)
RECEIVE_PACK = ("--receive-pack=git-receive-pack",)


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


class WorktreeDirty(GitError):
    """The ref to move is checked out in a work tree with changes of its own:
    moving the ref would leave its index and files behind (git's
    ``receive.denyCurrentBranch=updateInstead`` refuses the same)."""

    slug = "worktree-dirty"
    http_status = 409


@dataclass(frozen=True)
class Identity:
    """A commit author or committer."""

    name: str = "Ledger"
    email: str = "ledger@localhost"

    @classmethod
    def parse(cls, text: str) -> Identity:
        """``"Name <email>"``; ``ValueError`` otherwise."""
        match = re.fullmatch(r"\s*([^<>\n]+?)\s*<([^<>\s]+)>\s*", text)
        if not match:
            raise ValueError(f"{text!r} is not 'Name <email>'")
        return cls(match.group(1), match.group(2))

    def __str__(self) -> str:
        return f"{self.name} <{self.email}>"

    def env(self, role: str, date: str | None = None) -> dict[str, str]:
        """``GIT_AUTHOR_*`` (role ``AUTHOR``) or ``GIT_COMMITTER_*`` variables."""
        env = {f"GIT_{role}_NAME": self.name, f"GIT_{role}_EMAIL": self.email}
        if date is not None:
            env[f"GIT_{role}_DATE"] = date
        return env


LEDGER = Identity()


def git_environment(repo: str | Path | None = None, extra: Mapping[str, str] | None = None
                    ) -> dict[str, str]:
    """The environment git runs with in ``repo``: hardened (see
    ``ledger.hardened_git``), plus ``extra``; never a prompt for credentials."""
    return hardened_git.environment(repo, extra)


def git(cwd: str | Path, *args: str, env: Mapping[str, str] | None = None,
        input: bytes | None = None, ok: Sequence[int] = (0,)) -> str:
    """Run ``git ARGS`` in ``cwd``; its stdout without the final newline.
    ``GitError`` (naming the step and git's last line of complaint) unless the
    exit code is in ``ok``."""
    return _run(cwd, args, env, input, ok).stdout.decode("utf-8", errors="replace").rstrip("\n")


def git_bytes(cwd: str | Path, *args: str) -> bytes:
    """Run ``git ARGS`` in ``cwd``; its stdout as bytes, untouched."""
    return _run(cwd, args, None, None, (0,)).stdout


def _run(cwd: str | Path, args: Sequence[str], env: Mapping[str, str] | None,
         input: bytes | None, ok: Sequence[int]) -> subprocess.CompletedProcess[bytes]:
    try:
        done = hardened_git.run(cwd, args, env=env, input=input)
    except OSError as exc:
        raise GitError(f"cannot run git in {cwd}: {exc.strerror or exc}") from exc
    if done.returncode not in ok:
        complaint = done.stderr.decode("utf-8", errors="replace").strip().splitlines()
        raise GitError(f"git {args[0]} failed: "
                       + (complaint[-1] if complaint else f"exit code {done.returncode}"))
    return done


class Repository:
    """One repository Ledger works on (a local path, or a URL cached locally)."""

    def __init__(self, location: str, cache_dir: Path | None = None):
        self.location = location
        self._cache_dir = cache_dir

    @property
    def is_remote(self) -> bool:
        """Whether the location is a URL (worked on through a local cache)."""
        return "://" in self.location or self.location.startswith("git@")

    @property
    def path(self) -> Path:
        """The local repository (cloning a URL into the cache on first use)."""
        if not self.is_remote:
            return Path(self.location)
        if self._cache_dir is None:
            raise GitError(f"{self.location} is a URL; a cache directory is needed to clone it")
        local = self._cache_dir / hashlib.sha256(self.location.encode()).hexdigest()[:16]
        if not local.exists():
            local.parent.mkdir(parents=True, exist_ok=True)
            git(local.parent, "clone", "--quiet", "--bare", "--template=", *UPLOAD_PACK, "--",
                self.location, str(local))
        else:
            # By URL, never by remote name: a remote's configured programs
            # (remote.<name>.uploadpack: git takes the first one given, so no
            # override can replace it) never apply. No --prune: the cache
            # also holds the workers' ledger/* branches.
            git(local, "fetch", "--quiet", *UPLOAD_PACK, "--", self.location,
                "+refs/heads/*:refs/heads/*")
        return local

    @contextlib.contextmanager
    def _worktree_lock(self) -> Iterator[None]:
        """Serialise adding and removing worktrees across processes. git's
        ``worktree add`` reads every other worktree's admin files while a
        concurrent add is still writing its own ("failed to read
        .git/worktrees/<name>/commondir"), so two attempts starting together
        on one repository could fail each other."""
        common = Path(self._git("rev-parse", "--git-common-dir"))
        if not common.is_absolute():
            common = self.path / common
        with open(common / "ledger-worktrees.lock", "a+b") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def _git(self, *args: str, **kwargs: object) -> str:
        path = self.path
        if not path.is_dir():
            raise GitError(f"{path} is not a git repository")
        return git(path, *args, **kwargs)  # type: ignore[arg-type]

    def rev_parse(self, ref: str) -> str | None:
        """The commit a ref points at, or ``None`` if it does not exist."""
        try:
            found = self._git("rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}", ok=(0, 1))
        except GitError:
            return None
        return found or None

    # --- promotion ---------------------------------------------------------------

    def update_ref(self, ref: str, new: str, expected_old: str | None) -> None:
        """Compare-and-swap: move ``ref`` to ``new`` only if it is at ``expected_old``
        (``None``: only if it does not exist). ``RefMoved`` if it is elsewhere;
        a plain ``GitError`` if the update failed with the ref still in place
        (another writer holding its lock: worth retrying).

        When ``ref`` is checked out in a work tree (a non-bare repository), the
        work tree and its index move with it, as with git's
        ``receive.denyCurrentBranch=updateInstead``: only if they are clean
        (``WorktreeDirty`` otherwise, and the ref stays where it is). The ref is
        locked and verified first, the files moved, and only then the ref
        committed, so nobody commits in between and no index is left stale
        behind a moved ref."""
        checked_out = self.worktrees_on(ref)
        if not checked_out:
            try:
                self._git("update-ref", "-m", "ledger promotion", ref, new, expected_old or ZERO_SHA)
            except GitError:
                actual = self.rev_parse(ref)
                if actual != expected_old:
                    raise RefMoved(ref, expected_old, actual) from None
                raise
            return
        with _RefTransaction(self.path, ref, new, expected_old, self.rev_parse) as transaction:
            old_tree = expected_old or self._git("hash-object", "-t", "tree", "-w", "--stdin", input=b"")
            for worktree in checked_out:
                _require_clean(worktree, ref, old_tree)
            moved: list[Path] = []
            try:
                for worktree in checked_out:
                    _move_worktree(worktree, ref, old_tree, new)
                    moved.append(worktree)
                transaction.commit()
            except GitError:
                for worktree in moved:  # put the files back where the ref still is
                    try:
                        git(worktree, "read-tree", "--reset", "-u", old_tree)
                    except GitError:
                        pass
                raise

    def worktrees_on(self, ref: str) -> list[Path]:
        """The work trees (of this repository) that have ``ref`` checked out."""
        listing = self._git("worktree", "list", "--porcelain", "-z")
        found, current = [], None
        for field in listing.split("\0"):
            if field.startswith("worktree "):
                current = Path(field[len("worktree "):])
            elif field == f"branch {ref}" and current is not None and current.is_dir():
                found.append(current)
        return found

    def land(self, candidate: str, parent: str | None, *, trailers: Sequence[tuple[str, str]],
             committer: Identity, committed_at: int) -> str:
        """The commit that lands for ``candidate``: its tree (byte for byte),
        author and message, on ``parent`` (``None``: the candidate's own
        parents), with Ledger's trailers and ``committer`` at ``committed_at``
        (epoch seconds). Deterministic: the same arguments give the same commit
        id, so a dispatcher that died after landing it finds it again."""
        fields = self._git("show", "-s", "--format=%T%x00%P%x00%an%x00%ae%x00%ad", "--date=raw",
                           candidate).split("\0")
        tree, parents, author_name, author_email, author_date = fields
        message = self._git("show", "-s", "--format=%B", candidate)
        message = with_trailers(self.path, message, trailers)
        parent_args = [a for p in ([parent] if parent else parents.split()) for a in ("-p", p)]
        env = {**Identity(author_name, author_email).env("AUTHOR", author_date),
               **committer.env("COMMITTER", f"{committed_at} +0000")}
        return self._git("commit-tree", "--no-gpg-sign", tree, *parent_args, "-F", "-",
                         env=env, input=(message + "\n").encode())

    # --- attempts and verifications ------------------------------------------------

    def add_worktree(self, directory: Path, base_ref: str, branch: str) -> str:
        """A fresh worktree at ``base_ref`` on a new ``branch``; returns the base SHA."""
        base = self._git("rev-parse", "--verify", f"{base_ref}^{{commit}}")
        with self._worktree_lock():
            self._git("worktree", "add", "--quiet", "-B", branch, str(directory), base)
        return base

    def remove_worktree(self, directory: Path) -> None:
        """Remove a worktree and its administrative files, whatever state it is in."""
        try:
            with self._worktree_lock():
                try:
                    self._git("worktree", "remove", "--force", "--force", str(directory))
                except GitError:
                    pass
                shutil.rmtree(directory, ignore_errors=True)
                self._git("worktree", "prune")
        except (GitError, OSError):
            shutil.rmtree(directory, ignore_errors=True)

    def clean_checkout(self, sha: str, directory: Path) -> None:
        """A clone of the repository at ``sha`` in ``directory``: its own index and
        work tree, sharing objects read-only; never someone else's worktree."""
        git(directory.parent, "clone", "--quiet", "--shared", "--no-checkout", "--",
            str(self.path), str(directory))
        git(directory, "checkout", "--quiet", "--detach", sha)

    # --- retention ----------------------------------------------------------------

    def attempt_branches(self) -> list[tuple[str, str, int, int]]:
        """Ledger's attempt branches: ``(ref, sha, campaign, attempt)``."""
        listing = self._git("for-each-ref", "--format=%(refname)%00%(objectname)", BRANCH_PREFIX)
        branches = []
        for line in listing.splitlines():
            ref, _, sha = line.partition("\0")
            match = _ATTEMPT_BRANCH.match(ref)
            if match:
                branches.append((ref, sha, int(match.group(1)), int(match.group(2))))
        return branches

    def delete_ref(self, ref: str, expected: str) -> bool:
        """Delete ``ref`` if it is still at ``expected``; ``False`` if it moved
        or is checked out somewhere (then it is left alone)."""
        if self.worktrees_on(ref):
            return False
        try:
            self._git("update-ref", "-d", ref, expected)
        except GitError:
            return False
        return True

    def prune_worktrees(self) -> int:
        """Forget the administrative files of worktrees whose directory is gone;
        returns how many there were."""
        listing = self._git("worktree", "list", "--porcelain", "-z")
        stale = sum(1 for field in listing.split("\0") if field.startswith("prunable"))
        if stale:
            self._git("worktree", "prune")
        return stale


class _RefTransaction:
    """``git update-ref --stdin``: the ref locked and verified (prepared) on
    entry, committed by ``commit()``, aborted on any exit before that."""

    def __init__(self, repo: Path, ref: str, new: str, old: str | None, rev_parse: object):
        self.repo, self.ref, self.new, self.old = repo, ref, new, old
        self._rev_parse = rev_parse
        self._proc: subprocess.Popen[bytes] | None = None
        self._done = False

    def _say(self, command: str) -> None:
        proc = self._proc
        assert proc is not None and proc.stdin is not None and proc.stdout is not None
        try:
            proc.stdin.write(command.encode() + b"\n")
            proc.stdin.flush()
            answer = proc.stdout.readline().decode().strip()
        except OSError:
            answer = ""
        if answer == f"{command}: ok":
            return
        # git refused (it exits by itself) or went quiet: end it without SIGKILL,
        # which would leave its lock file behind for every later writer.
        self._done = True
        complaint = self._finish().decode("utf-8", errors="replace").strip().splitlines()
        actual = self._rev_parse(self.ref)  # type: ignore[operator]
        if actual != self.old:
            raise RefMoved(self.ref, self.old, actual)
        raise GitError(f"git update-ref {command} failed: "
                       + (complaint[-1] if complaint else "no answer"))

    def _finish(self) -> bytes:
        """Close git's input and wait for it to exit (SIGTERM, which git turns
        into removing its locks, if it does not); returns its stderr."""
        proc = self._proc
        assert proc is not None
        try:
            _, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.terminate()
            _, err = proc.communicate()
        return err or b""

    def __enter__(self) -> _RefTransaction:
        self._proc = subprocess.Popen(
            ["git", "update-ref", "--stdin", "-m", "ledger promotion"], cwd=self.repo,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env=git_environment(self.repo))
        self._say("start")
        self._proc.stdin.write(f"update {self.ref} {self.new} {self.old or ZERO_SHA}\n".encode())  # type: ignore[union-attr]
        self._say("prepare")
        return self

    def commit(self) -> None:
        """Make the prepared update."""
        self._say("commit")
        self._done = True

    def __exit__(self, *exc_info: object) -> None:
        if not self._done:
            try:
                self._say("abort")
            except GitError:
                pass
        if self._proc is not None and self._proc.returncode is None:
            self._finish()


def _require_clean(worktree: Path, ref: str, head: str) -> None:
    """``WorktreeDirty`` unless the work tree and index of ``worktree`` match
    ``head`` (git's push-to-checkout test; untracked files are allowed unless
    the move would overwrite them)."""
    git(worktree, "update-index", "-q", "--ignore-submodules", "--refresh", ok=(0, 1))
    unstaged = git(worktree, "diff-files", "--name-only", "--ignore-submodules", "--").split()
    staged = git(worktree, "diff-index", "--cached", "--name-only", "--ignore-submodules",
                 head, "--").split()
    if unstaged or staged:
        raise WorktreeDirty(
            f"{ref} is checked out in {worktree} with uncommitted changes "
            f"({_some('staged', staged)}{'; ' if staged and unstaged else ''}"
            f"{_some('unstaged', unstaged)}); the ref was not moved")


def _move_worktree(worktree: Path, ref: str, old_tree: str, new: str) -> None:
    # A two-tree merge is what `git checkout` does: index and files move from
    # old to new, refusing to overwrite an untracked file in the way.
    try:
        git(worktree, "read-tree", "-u", "-m", old_tree, new)
    except GitError as exc:
        raise WorktreeDirty(f"{ref} is checked out in {worktree} and its files could not be moved "
                            f"({exc.message}); the ref was not moved") from None


def _some(kind: str, paths: list[str], limit: int = 5) -> str:
    if not paths:
        return ""
    shown = ", ".join(paths[:limit]) + (f" and {len(paths) - limit} more" if len(paths) > limit else "")
    return f"{kind}: {shown}"


# --- worktree steps ------------------------------------------------------------------


def head(worktree: Path) -> str:
    """The commit a worktree is at."""
    return git(worktree, "rev-parse", "HEAD")


def with_trailers(cwd: Path, message: str, trailers: Iterable[tuple[str, str]]) -> str:
    """``message`` with Ledger's trailers set to ``trailers`` (any the message
    already carried -- an agent's included -- are replaced, never trusted)."""
    body = _OUR_TRAILER.sub("", message.replace("\0", "")).rstrip() or "ledger: candidate"
    args = [a for key, value in trailers for a in ("--trailer", f"{key}: {_one_line(value)}")]
    return git(cwd, "interpret-trailers", "--where", "end", "--if-exists", "add", *args,
               input=(body + "\n").encode())


def _one_line(value: str) -> str:
    return " ".join(str(value).split())[:500]


def commit_all(worktree: Path, message: str, *, author: Identity = LEDGER,
               committer: Identity = LEDGER) -> bool:
    """Commit every change in ``worktree`` (new files included); ``False`` if clean."""
    git(worktree, "add", "--all")
    if not git(worktree, "status", "--porcelain"):
        return False
    git(worktree, "commit", "--quiet", "--no-verify", "--no-gpg-sign", "-F", "-",
        env={**author.env("AUTHOR"), **committer.env("COMMITTER")}, input=message.encode())
    return True


def diff(worktree: Path, base: str, candidate: str) -> bytes:
    """The change from ``base`` to ``candidate``, byte-stable for fingerprinting."""
    return git_bytes(worktree, "diff", "--binary", "--no-color", "--no-ext-diff", "--no-textconv",
                     "--no-renames", "--full-index", base, candidate)


def changed_paths(repo: Path, base: str, candidate: str) -> list[str]:
    """Every path whose entry differs between the two commits (added, removed,
    modified, mode or type changed)."""
    listing = git_bytes(repo, "diff", "--name-only", "-z", "--no-renames", "--no-ext-diff", "--no-textconv",
                        base, candidate)
    return [p.decode("utf-8", errors="surrogateescape") for p in listing.split(b"\0") if p]


def file_at(repo: Path, sha: str, path: str) -> bytes | None:
    """The content of ``path`` at commit ``sha``; ``None`` if it has none there."""
    try:
        return _run(repo, ["cat-file", "blob", f"{sha}:{path}"], None, None, (0,)).stdout
    except GitError:
        return None


def restore(checkout: Path, base: str, paths: Sequence[str]) -> None:
    """Put ``paths`` back as they are at ``base`` in ``checkout`` (index and
    files): restored when ``base`` has them, removed when it does not."""
    present = [p for p in paths if file_at(checkout, base, p) is not None]
    absent = [p for p in paths if p not in present]
    literal = {"GIT_LITERAL_PATHSPECS": "1"}  # a path is a path, never a glob
    for chunk in _chunks(present):
        git(checkout, "checkout", "--quiet", base, "--", *chunk, env=literal)
    for chunk in _chunks(absent):
        git(checkout, "rm", "--quiet", "-r", "--force", "--ignore-unmatch", "--", *chunk, env=literal)


def _chunks(items: Sequence[str], size: int = 200) -> Iterable[Sequence[str]]:
    for i in range(0, len(items), size):
        yield items[i:i + size]
