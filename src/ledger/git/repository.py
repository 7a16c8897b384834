"""Git steps of attempts, verifications, promotions and retention.

Every step is a ``git`` subprocess run through one helper (``git``): Ledger
uses git only as a command -- worktrees, compare-and-swap ref updates, an
``update-ref --stdin`` transaction held open while a checked-out branch's work
tree is moved, ``commit-tree`` -- so a library wrapping it (GitPython, which
this module used before) added a layer, and a resource leak in long-running
processes, without doing anything for us. Every call is blocking (run it in a
thread from async code). A repository given as a URL is cloned once into
``<data_dir>/repos`` and fetched before use.

Git runs hardened (``ledger.git.hardened_git``): no system or user configuration,
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
import shlex
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ledger.errors import LedgerError
from ledger.git import hardened_git

ZERO_SHA = "0" * 40
#: The longest a transfer with a remote may take (fetch, ls-remote, push): a
#: remote that accepts and then goes silent is a fault to wait out, not a
#: step that never ends.
REMOTE_TIMEOUT_S = 300.0
#: Where Ledger's attempt branches live: ``ledger/<campaign>/<attempt>``.
BRANCH_PREFIX = "refs/heads/ledger/"
_ATTEMPT_BRANCH = re.compile(r"^refs/heads/ledger/(\d+)/(\d+)$")
_TRAILER_KEYS = ("Ledger-Campaign", "Ledger-Attempt", "Ledger-Verdict")
_OUR_TRAILER = re.compile(r"^(?:" + "|".join(_TRAILER_KEYS) + r")\s*:.*$\n?", re.I | re.M)


# Git's own program on the other side of a transfer, whatever any configuration
# says. Over a local transport (``file://`` or a path) it runs here, as Ledger,
# in the other repository -- and git hands it none of this side's overrides
# (it clears them for the other side) -- so its command line carries the
# overrides of that repository itself: no hooks, no fsmonitor, none of its
# program-valued keys. Over a network transport the other side is a server:
# its hooks are its owner's policy, and run there.


def _other_side(location: str, program: str) -> str:
    if not _is_local(location):
        return f"git-{program}"
    path = location[len("file://"):] if location.startswith("file://") else location
    options = [f"-c {shlex.quote(f'{k}={v}')}" for k, v in hardened_git.overrides(path or None)]
    return " ".join(["git", *options, program])


def _upload_pack(location: str) -> tuple[str, ...]:
    return (f"--upload-pack={_other_side(location, 'upload-pack')}",)


def _receive_pack(location: str) -> tuple[str, ...]:
    return (f"--receive-pack={_other_side(location, 'receive-pack')}",)


def _is_local(location: str) -> bool:
    return location.startswith("file://") or ("://" not in location and not location.startswith("git@"))


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
    ``ledger.git.hardened_git``), plus ``extra``; never a prompt for credentials."""
    return hardened_git.environment(repo, extra)


def git(cwd: str | Path, *args: str, env: Mapping[str, str] | None = None,
        input: bytes | None = None, ok: Sequence[int] = (0,), timeout: float | None = None) -> str:
    """Run ``git ARGS`` in ``cwd``; its stdout without the final newline.
    ``GitError`` (naming the step and git's last line of complaint) unless the
    exit code is in ``ok``, or if it runs longer than ``timeout`` seconds."""
    return _run(cwd, args, env, input, ok, timeout).stdout.decode("utf-8", errors="replace").rstrip("\n")


def git_bytes(cwd: str | Path, *args: str) -> bytes:
    """Run ``git ARGS`` in ``cwd``; its stdout as bytes, untouched."""
    return _run(cwd, args, None, None, (0,)).stdout


def _run(cwd: str | Path, args: Sequence[str], env: Mapping[str, str] | None,
         input: bytes | None, ok: Sequence[int], timeout: float | None = None
         ) -> subprocess.CompletedProcess[bytes]:
    try:
        done = hardened_git.run(cwd, args, env=env, input=input, timeout=timeout)
    except OSError as exc:
        raise GitError(f"cannot run git in {cwd}: {exc.strerror or exc}") from exc
    except subprocess.TimeoutExpired:
        raise GitError(f"git {args[0]} did not finish within {timeout:g}s (the remote went "
                       "silent)") from None
    if done.returncode not in ok:
        complaint = done.stderr.decode("utf-8", errors="replace").strip().splitlines()
        raise GitError(f"git {args[0]} failed: "
                       + (complaint[-1] if complaint else f"exit code {done.returncode}"))
    return done


class SystemFault(GitError):
    """A git step failed for a reason that is not the attempt's own: a remote
    that cannot be reached or refuses Ledger's credentials, a ref or object
    that should be there and is not. Never a verdict: the work waits and is
    retried (see ``ledger.ops.faults``)."""

    slug = "system-fault"
    http_status = 503


def _transport_fault(exc: GitError, what: str) -> SystemFault:
    return SystemFault(f"{what}: {exc.message}")


class Repository:
    """One repository Ledger works on: a local path, worked on in place, or a
    URL, worked on through a bare cache under ``cache_dir`` (one per role's
    data dir: roles share the remote, never a disk) and published to with
    compare-and-swap pushes."""

    def __init__(self, location: str, cache_dir: Path | None = None):
        self.location = location
        self._cache_dir = cache_dir

    @property
    def is_remote(self) -> bool:
        """Whether the location is a URL (worked on through a local cache)."""
        return "://" in self.location or self.location.startswith("git@")

    @property
    def path(self) -> Path:
        """The local repository: the path itself, or the URL's cache (cloned,
        empty of refs, on first use; ``fetch`` brings what a step needs)."""
        if not self.is_remote:
            return Path(self.location)
        if self._cache_dir is None:
            raise GitError(f"{self.location} is a URL; a cache directory is needed to work on it")
        local = self._cache_dir / hashlib.sha256(self.location.encode()).hexdigest()[:16]
        if not (local / "objects").is_dir():
            local.parent.mkdir(parents=True, exist_ok=True)
            with _locked(local.parent / (local.name + ".lock")):
                if not (local / "objects").is_dir():
                    scratch = local.with_name(local.name + ".new")
                    shutil.rmtree(scratch, ignore_errors=True)
                    git(local.parent, "init", "--quiet", "--bare", "--template=", str(scratch))
                    scratch.rename(local)
        return local

    @contextlib.contextmanager
    def _cache_lock(self) -> Iterator[None]:
        """One git transfer at a time on a cache (a worker with several
        attempts fetches into one cache; git's ref locks would fail the
        second instead of waiting)."""
        if not self.is_remote:
            yield
            return
        with _locked(self.path.with_name(self.path.name + ".lock")):
            yield

    def _git(self, *args: str, **kwargs: object) -> str:
        path = self.path
        if not path.is_dir():
            raise GitError(f"{path} is not a git repository")
        return git(path, *args, **kwargs)  # type: ignore[arg-type]

    def rev_parse(self, ref: str) -> str | None:
        """The commit a ref (or SHA) names here, or ``None`` if none."""
        try:
            found = self._git("rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}", ok=(0, 1))
        except GitError:
            return None
        return found or None

    def has_commit(self, sha: str) -> bool:
        """Whether commit ``sha`` is in this (local) repository."""
        return self.rev_parse(sha) == sha

    # --- the remote -----------------------------------------------------------

    def fetch(self, *refs: str) -> None:
        """Bring ``refs`` (full names) from the remote into the cache, each to
        the same name (forced: the remote is the truth). By URL, never by
        remote name, so no configured ``remote.*`` program applies. A local
        repository has them already. ``SystemFault`` if the remote cannot
        be reached or lacks one of them."""
        if not self.is_remote or not refs:
            return
        with self._cache_lock():
            try:
                self._git("fetch", "--quiet", "--no-tags", "--no-write-fetch-head", *_upload_pack(self.location),
                          "--", self.location, *(f"+{r}:{r}" for r in refs), timeout=REMOTE_TIMEOUT_S)
            except GitError as exc:
                raise _transport_fault(exc, f"cannot fetch {', '.join(refs)} from {self.location}") from exc

    def remote_refs(self, pattern: str) -> dict[str, str]:
        """The remote's refs matching ``pattern`` (``ls-remote``; a local
        repository's own refs): name -> SHA."""
        if not self.is_remote:
            listing = self._git("for-each-ref", "--format=%(refname) %(objectname)", pattern.rstrip("*"))
            pairs = (line.rsplit(" ", 1) for line in listing.splitlines() if line)
            return {name: sha for name, sha in pairs}
        try:
            listing = git(self.path, "ls-remote", *_upload_pack(self.location), "--", self.location, pattern,
                          timeout=REMOTE_TIMEOUT_S)
        except GitError as exc:
            raise _transport_fault(exc, f"cannot list {pattern} on {self.location}") from exc
        refs = {}
        for line in listing.splitlines():
            sha, _, name = line.partition("\t")
            if name:
                refs[name] = sha
        return refs

    def remote_ref(self, ref: str) -> str | None:
        """Where ``ref`` is on the remote (a local repository: here), or
        ``None`` if it does not exist. The read-back of every publication."""
        if not self.is_remote:
            return self.rev_parse(ref)
        return self.remote_refs(ref).get(ref)

    def resolve(self, ref: str) -> str:
        """The commit ``ref`` names (a branch name, a full ref or a SHA),
        fetched first from a remote. ``SystemFault`` if it is nowhere."""
        full = ref if ref.startswith("refs/") or _is_sha(ref) else f"refs/heads/{ref}"
        if self.is_remote and not _is_sha(ref):
            self.fetch(full)
        sha = self.rev_parse(full)
        if sha is None:
            raise SystemFault(f"{ref} is not in {self.location}")
        return sha

    def publish(self, ref: str, sha: str) -> None:
        """Create ``ref`` at ``sha`` where every role can see it (the remote,
        or the local repository): a compare-and-swap from nothing, so an
        existing ref elsewhere is never moved; the same ref already at
        ``sha`` (a retry) is fine. Read back before it counts.
        ``SystemFault`` if the remote cannot be reached or does not show it."""
        if not self.is_remote:
            current = self.rev_parse(ref)
            if current == sha:
                return
            if current is not None:
                raise RefMoved(ref, None, current)
            self._git("update-ref", "-m", "ledger candidate", ref, sha, ZERO_SHA)
            return
        with self._cache_lock():
            self._git("update-ref", ref, sha)  # the cache's copy: what gc lists
            try:
                git(self.path, "push", "--quiet", "--porcelain", *_receive_pack(self.location),
                    f"--force-with-lease={ref}:", "--", self.location, f"{sha}:{ref}", timeout=REMOTE_TIMEOUT_S)
            except GitError as exc:
                current = self.remote_ref(ref)
                if current is not None and current != sha:
                    raise RefMoved(ref, None, current) from exc  # as for a local repository
                if current != sha:
                    raise _transport_fault(exc, f"cannot publish {ref} to {self.location}") from exc
        if self.remote_ref(ref) != sha:
            raise SystemFault(f"{self.location} does not show {ref} at {sha} after the push")

    # --- promotion ---------------------------------------------------------------

    def update_ref(self, ref: str, new: str, expected_old: str | None) -> None:
        """Compare-and-swap: move ``ref`` to ``new`` only if it is at ``expected_old``
        (``None``: only if it does not exist). ``RefMoved`` if it is elsewhere;
        a plain ``GitError`` if the update failed with the ref still in place
        (another writer holding its lock: worth retrying).

        On a remote this is ``git push --atomic --force-with-lease=ref:old``
        (the remote refuses unless the ref is where we expect), then a
        read-back with ``ls-remote``. ``SystemFault`` when the remote cannot
        be reached.

        When ``ref`` is checked out in a work tree of a local repository (a
        non-bare one), the work tree and its index move with it, as with git's
        ``receive.denyCurrentBranch=updateInstead``: only if they are clean
        (``WorktreeDirty`` otherwise, and the ref stays where it is). The ref is
        locked and verified first, the files moved, and only then the ref
        committed, so nobody commits in between and no index is left stale
        behind a moved ref."""
        if self.is_remote:
            self._push_cas(ref, new, expected_old)
            return
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

    def _push_cas(self, ref: str, new: str, expected_old: str | None) -> None:
        lease = f"--force-with-lease={ref}:{expected_old or ''}"
        with self._cache_lock():
            try:
                git(self.path, "push", "--quiet", "--atomic", "--porcelain", *_receive_pack(self.location), lease,
                    "--", self.location, f"{new}:{ref}", timeout=REMOTE_TIMEOUT_S)
            except GitError as exc:
                try:
                    actual = self.remote_ref(ref)
                except SystemFault:
                    raise _transport_fault(exc, f"cannot push {ref} to {self.location}") from exc
                if actual == new:
                    return  # in, whatever the reply said
                if actual != expected_old:
                    raise RefMoved(ref, expected_old, actual) from None
                raise _transport_fault(exc, f"cannot push {ref} to {self.location}") from exc

    def worktrees_on(self, ref: str) -> list[Path]:
        """The work trees (of this repository) that have ``ref`` checked out."""
        if self.is_remote:
            return []
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

    def replay(self, base: str, onto: str, candidate: str) -> str | None:
        """``candidate``'s change (from ``base``) applied onto ``onto``, as one
        commit with the candidate's author and message, computed in the object
        database alone (``merge-tree --write-tree``: no clone, no work tree,
        nothing fetched back, so no object can go missing); ``None`` when it
        does not apply cleanly or ``onto`` does not descend from ``base``."""
        for what, sha in (("target", onto), ("candidate", candidate)):
            if not self.has_commit(sha):
                # never a verdict: what should be here is not (a fetch that
                # brought less than it said); the promotion waits and retries
                raise SystemFault(f"the {what} {sha} is not in {self.path}")
        if not self.has_commit(base) or not self.is_ancestor(base, onto):
            return None  # the target was rewritten under the candidate: a new attempt
        done = _run(self.path, ["merge-tree", "--write-tree", "--no-messages", onto, candidate],
                    None, None, (0, 1))
        if done.returncode != 0:
            return None
        tree = done.stdout.decode().split()[0]
        fields = self._git("show", "-s", "--format=%an%x00%ae%x00%ad", "--date=raw", candidate).split("\0")
        message = self._git("show", "-s", "--format=%B", candidate)
        env = {**Identity(fields[0], fields[1]).env("AUTHOR", fields[2]), **LEDGER.env("COMMITTER")}
        return self._git("commit-tree", "--no-gpg-sign", tree, "-p", onto, "-F", "-", env=env,
                         input=(message.rstrip("\n") + "\n").encode())

    def is_ancestor(self, ancestor: str, descendant: str) -> bool:
        """Whether ``ancestor`` is ``descendant`` or one of its ancestors."""
        done = _run(self.path, ["merge-base", "--is-ancestor", ancestor, descendant], None, None, (0, 1))
        return done.returncode == 0

    # --- attempts ---------------------------------------------------------------

    def seed_workspace(self, directory: Path, base: str, branch: str, author: Identity) -> None:
        """A clone of this repository at ``base`` in ``directory`` for an
        attempt: a repository of its own (its own ``.git``, configuration,
        hooks and refs -- never a worktree of the user's), holding only the
        history of ``base`` (no other attempt's candidates), checked out on
        ``branch``, with no remote (nothing to push to)."""
        directory.mkdir(parents=True)
        git(directory, "init", "--quiet", "--template=", str(directory))
        source = f"file://{self.path}"
        git(directory, "fetch", "--quiet", "--no-tags", *_upload_pack(source), "--", source, base)
        git(directory, "checkout", "--quiet", "-B", branch, base)
        git(directory, "config", "user.name", author.name)
        git(directory, "config", "user.email", author.email)

    def import_bundle(self, bundle: Path, limit_bytes: int) -> str:
        """The commits of a bundle an attempt's cell wrote (``<base>..HEAD``),
        added to this repository's objects (``git bundle unbundle``: every
        object checked by ``index-pack``; no ref is created); returns its
        HEAD. ``ValueError`` for a bundle that is not a regular file, is too
        large, or does not unbundle: the attempt's own doing."""
        try:
            info = os.lstat(bundle)
        except FileNotFoundError:
            raise ValueError("the attempt left no candidate bundle") from None
        if not stat.S_ISREG(info.st_mode):
            raise ValueError("the candidate bundle is not a regular file")
        if info.st_size > limit_bytes:
            raise ValueError(f"the candidate is {info.st_size} bytes, over the class's limit of "
                             f"{limit_bytes}")
        try:
            listing = self._git("bundle", "unbundle", str(bundle))
        except GitError as exc:
            raise ValueError(f"the candidate bundle does not unbundle: {exc.message}") from None
        heads = [line.split()[0] for line in listing.splitlines() if line.split()[1:] == ["HEAD"]]
        if len(heads) != 1 or not _is_sha(heads[0]):
            raise ValueError("the candidate bundle has no single HEAD")
        return heads[0]

    def make_candidate(self, head: str, base: str, message: str, author: Identity,
                       committer: Identity) -> str:
        """The candidate Ledger records for an attempt that ended at ``head``:
        one commit of ``head``'s tree on ``base``, with ``message``."""
        tree = self._git("rev-parse", "--verify", f"{head}^{{tree}}")
        env = {**author.env("AUTHOR"), **committer.env("COMMITTER")}
        return self._git("commit-tree", "--no-gpg-sign", tree, "-p", base, "-F", "-", env=env,
                         input=(message.rstrip("\n") + "\n").encode())

    # --- verifications and sensors ------------------------------------------------

    def export_tree(self, sha: str, directory: Path, *, replace_from: str | None = None,
                    paths: Sequence[str] = ()) -> None:
        """The tree of commit ``sha`` written to ``directory`` (created; no
        ``.git``: nothing there for a command to run or rewrite), with
        ``paths`` taken from commit ``replace_from`` instead (removed when it
        lacks them). Built in a private index, by git's plumbing."""
        directory.mkdir(parents=True, exist_ok=False)
        with tempfile.TemporaryDirectory(prefix="ledger-index-") as scratch:
            index = {"GIT_INDEX_FILE": str(Path(scratch) / "index")}
            self._git("read-tree", sha, env=index)
            if paths and replace_from:
                lines = []
                for path in paths:
                    entry = self._git("ls-tree", "-z", "--full-tree", replace_from, "--", path)
                    entry = entry.rstrip("\0")
                    if entry:
                        meta, _, name = entry.partition("\t")
                        mode, _kind, blob = meta.split()
                        lines.append(f"{mode} {blob}\t{name}")
                    else:
                        lines.append(f"0 {ZERO_SHA}\t{path}")
                self._git("update-index", "-z", "--index-info", env=index,
                          input="".join(line + "\0" for line in lines).encode())
            # The export's own work tree (a bare repository has none).
            self._git("--work-tree", str(directory), "checkout-index", "--all", "--force", env=index)

    # --- retention ----------------------------------------------------------------

    def attempt_branches(self) -> list[tuple[str, str, int, int]]:
        """Ledger's attempt branches (on the remote, for a URL): ``(ref, sha,
        campaign, attempt)``."""
        branches = []
        for ref, sha in sorted(self.remote_refs(BRANCH_PREFIX + "*").items()):
            match = _ATTEMPT_BRANCH.match(ref)
            if match:
                branches.append((ref, sha, int(match.group(1)), int(match.group(2))))
        return branches

    def delete_ref(self, ref: str, expected: str) -> bool:
        """Delete ``ref`` if it is still at ``expected`` (compare-and-swap, on
        the remote for a URL); ``False`` if it moved or is checked out
        somewhere (then it is left alone)."""
        if self.is_remote:
            try:
                with self._cache_lock():
                    git(self.path, "push", "--quiet", "--porcelain", *_receive_pack(self.location),
                        f"--force-with-lease={ref}:{expected}", "--", self.location, f":{ref}",
                        timeout=REMOTE_TIMEOUT_S)
                    self._git("update-ref", "-d", ref, ok=(0, 1))
            except GitError:
                return False
            return True
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
        if self.is_remote:
            return 0
        listing = self._git("worktree", "list", "--porcelain", "-z")
        stale = sum(1 for field in listing.split("\0") if field.startswith("prunable"))
        if stale:
            self._git("worktree", "prune")
        return stale


def _is_sha(text: str) -> bool:
    return re.fullmatch(r"[0-9a-f]{40}|[0-9a-f]{64}", text) is not None


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path, "a+b") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


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


def diff(worktree: Path, base: str, candidate: str) -> bytes:
    """The change from ``base`` to ``candidate``, byte-stable for fingerprinting."""
    return git_bytes(worktree, "diff", "--binary", "--no-color", "--no-ext-diff", "--no-textconv",
                     "--no-renames", "--full-index", base, candidate)


def diff_lines(diff: bytes) -> tuple[int, int]:
    """The lines a unified diff (``diff``'s) adds and removes: its hunks'
    ``+`` and ``-`` lines, not the file headers' ``---``/``+++`` (a binary
    file's patch has no hunk, and adds and removes no line)."""
    added = removed = 0
    in_hunk = False
    for line in diff.split(b"\n"):
        if line.startswith(b"diff --git "):
            in_hunk = False
        elif line.startswith(b"@@"):
            in_hunk = True
        elif in_hunk and line.startswith(b"+"):
            added += 1
        elif in_hunk and line.startswith(b"-"):
            removed += 1
    return added, removed


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
